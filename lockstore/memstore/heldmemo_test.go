package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
)

// TestHeldMemoEndsWithTheLease: on the local clock a memo's check reads
// the monotonic clock alone, from the lease's end recorded as a
// monotonic reading; it still answers as the store does: never held once
// the store says the lease has no margin left, the same lease left while
// held.
func TestHeldMemoEndsWithTheLease(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	id, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace.Of("db.c")
	a := lockstore.Owner{Session: []byte("a"), App: "a"}
	const lease, margin = 300 * time.Millisecond, 100 * time.Millisecond
	if _, err := s.Acquire(ctx, a, ns, []docid.ID{id}, lease, 0); err != nil {
		t.Fatal(err)
	}
	var m lockstore.HeldMemo
	direct := func() (time.Duration, bool) {
		var tok [1]int64
		left, missing, err := s.HeldTokensInto(ctx, a, ns, []docid.ID{id}, margin, tok[:])
		return left, err == nil && len(missing) == 0
	}
	deadline := time.Now().Add(time.Minute)
	for {
		// The store first, then the memo: the memo, asked later, may
		// not say held when the store did not.
		_, storeHeld := direct()
		left, _, memoHeld := s.HeldTokenMemo(&m, &a, ns, id, margin)
		if memoHeld && !storeHeld {
			t.Fatalf("the memo answers held (%s left) after the store answered not", left)
		}
		// The memo first, then the store: the store, asked later, never
		// has more lease left than the memo said.
		left, _, memoHeld = s.HeldTokenMemo(&m, &a, ns, id, margin)
		if sleft, ok := direct(); ok && (!memoHeld || sleft > left) {
			t.Fatalf("the store answers %s left after the memo answered held %v, %s left", sleft, memoHeld, left)
		}
		if memoHeld && (left <= margin || left > lease) {
			t.Fatalf("held with %s left", left)
		}
		if !storeHeld && !memoHeld {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never ended")
		}
		time.Sleep(time.Millisecond) // pacing the polls only
	}
}
