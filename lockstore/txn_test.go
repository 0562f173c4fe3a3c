package lockstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
)

// TestTxnRecordsAcrossInstances: two proxies' stores on one collection.
// Statements of one transaction recorded through either are all found
// through the other; after one ends it, a statement recorded again through
// the other (whose guess of the next slot is now stale) is found, not
// left past a hole.
func TestTxnRecordsAcrossInstances(t *testing.T) {
	coll := fmt.Sprintf("locks_txn_%d", contractSeq.Add(1))
	open := func() *lockstore.Store {
		s, err := lockstore.Open(context.Background(), lockstore.Config{
			URI: lockstore.EmbeddedURI(), Database: "lockgate_test", Collection: coll, OpTimeout: 20 * time.Second,
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
	rec := func(s *lockstore.Store, id int) {
		t.Helper()
		if err := s.RecordTxn(ctx, session, 5, []lockstore.TxnNeed{{NS: "shop.orders", Held: lockstoretest.IDs(id)}}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(s *lockstore.Store) []string {
		t.Helper()
		needs, err := s.TxnNeeds(ctx, session, 5)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range needs {
			for _, id := range n.Held {
				out = append(out, id.String())
			}
		}
		return out
	}
	rec(a, 1)
	rec(a, 2)
	rec(b, 3)
	rec(a, 4)
	if got := fmt.Sprint(ids(b)); got != "[1 2 3 4]" {
		t.Errorf("through b: %s, want [1 2 3 4]", got)
	}
	if err := b.EndTxn(ctx, session, 5); err != nil {
		t.Fatal(err)
	}
	rec(a, 6)
	if got := fmt.Sprint(ids(b)); got != "[6]" {
		t.Errorf("recorded again through a after b ended it: %s, want [6]", got)
	}
}
