package lockstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/namespace"
)

// TestTxnRecordsAcrossInstances: two proxies' stores on one collection.
// Statements of one transaction recorded through either are all found by
// a commit through the other; a statement recorded through one after a
// commit began through the other is refused; after one ends a
// transaction, a statement recorded again through the other (whose guess
// of the next slot is now stale) is found, not left past a hole.
func TestTxnRecordsAcrossInstances(t *testing.T) {
	t.Parallel()
	coll, db := fmt.Sprintf("locks_txn_%d", contractSeq.Add(1)), testDB()
	open := func() *lockstore.Store {
		s, err := lockstore.Open(context.Background(), lockstore.Config{
			URI: lockstore.EmbeddedURI(), Database: db, Collection: coll, OpTimeout: 20 * time.Second,
			// No implicit locks here: the second store waits CacheTrust
			// before its first grant, not the memory locks' horizon.
			NewcomerHorizon: -1,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	ctx := context.Background()
	a, b := open(), open()
	session := lockstoretest.NewOwner("x").Session
	rec := func(s *lockstore.Store, id int) error {
		return s.RecordTxn(ctx, session, 5, []lockstore.TxnNeed{{NS: namespace.Of("shop.orders"), Held: lockstoretest.IDs(id)}})
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	commit := func(s *lockstore.Store) string {
		t.Helper()
		needs, err := s.BeginCommit(ctx, session, 5)
		must(err)
		var out []string
		for _, n := range needs {
			for _, id := range n.Held {
				out = append(out, id.String())
			}
		}
		return fmt.Sprint(out)
	}
	must(rec(a, 1))
	must(rec(a, 2))
	must(rec(b, 3))
	must(rec(a, 4))
	if got := commit(b); got != "[1 2 3 4]" {
		t.Errorf("commit through b: %s, want [1 2 3 4]", got)
	}
	if err := rec(a, 5); !errors.Is(err, lockstore.ErrTxnCommitting) {
		t.Errorf("a statement through a after the commit began through b: %v, want ErrTxnCommitting", err)
	}
	must(b.EndTxn(ctx, session, 5))
	must(rec(a, 6))
	if got := commit(b); got != "[6]" {
		t.Errorf("recorded again through a after b ended it: %s, want [6]", got)
	}
}

// TestTxnRecordsExpire: a record whose end was never seen is deleted by
// the janitor once older than TxnRetention on the lock store's clock, and
// not before.
func TestTxnRecordsExpire(t *testing.T) {
	t.Parallel()
	clock := lockstoretest.NewClock()
	s, err := lockstore.Open(context.Background(), lockstore.Config{
		URI: lockstore.EmbeddedURI(), Database: testDB(), Collection: fmt.Sprintf("locks_txn_%d", contractSeq.Add(1)), OpTimeout: 20 * time.Second,
	}, lockstore.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	ctx := context.Background()
	session := lockstoretest.NewOwner("x").Session
	need := []lockstore.TxnNeed{{NS: namespace.Of("shop.orders"), Held: lockstoretest.IDs(1)}}
	for _, n := range []int64{1, 2} {
		if err := s.RecordTxn(ctx, session, n, need); err != nil {
			t.Fatal(err)
		}
		clock.Advance(lockstore.TxnRetention / 2)
	}
	clock.Advance(time.Minute) // transaction 1 is past the retention, 2 is not
	if n, err := s.CleanupTxns(ctx); err != nil || n != 1 {
		t.Fatalf("cleanup deleted %d (%v), want 1", n, err)
	}
	for n, want := range map[int64]int{1: 0, 2: 1} {
		needs, err := s.BeginCommit(ctx, session, n)
		if err != nil || len(needs) != want {
			t.Errorf("transaction %d after the cleanup: %v (%v), want %d needs", n, needs, err, want)
		}
	}
}
