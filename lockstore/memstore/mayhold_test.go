package memstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
)

// TestMayHoldLocks: the store says a namespace may hold a lock exactly
// while one is held there, and always while it is unavailable, as the
// guard's skip of an insert's per-_id check needs (it skips only on
// false).
func TestMayHoldLocks(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	orders, other := namespace.Of("shop.orders"), namespace.Of("shop.other")
	seven, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	o := lockstore.Owner{Session: []byte("a"), App: "a"}
	if s.MayHoldLocks(orders) {
		t.Fatal("an empty store may hold a lock in shop.orders")
	}
	if _, err := s.Acquire(ctx, o, orders, []docid.ID{seven}, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !s.MayHoldLocks(orders) {
		t.Error("shop.orders holds a lock, and the store says it may not")
	}
	if s.MayHoldLocks(other) {
		t.Error("shop.other holds no lock, and the store says it may")
	}
	s.SetUnavailable(errors.New("down"))
	if !s.MayHoldLocks(other) {
		t.Error("an unavailable store said shop.other holds no lock")
	}
	s.SetUnavailable(nil)
	if _, err := s.Release(ctx, o, orders, []docid.ID{seven}, ""); err != nil {
		t.Fatal(err)
	}
	if s.MayHoldLocks(orders) {
		t.Error("shop.orders may hold a lock after its only one was released")
	}
}
