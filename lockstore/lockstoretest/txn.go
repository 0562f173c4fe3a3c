package lockstoretest

import (
	"context"
	"errors"
	"testing"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
)

// txnRecords: what a transaction's statements recorded is returned whole
// by BeginCommit, and nothing of another session's or another
// transaction's; once a commit has begun (even of a transaction that
// recorded nothing) no statement of it is recorded any more; EndTxn
// forgets that transaction alone, after which its number may be recorded
// again.
func txnRecords(t *testing.T, s Store, _ *Clock) {
	ctx := context.Background()
	a, b := NewOwner("a").Session, NewOwner("b").Session
	record := func(session []byte, n int64, needs ...lockstore.TxnNeed) error {
		t.Helper()
		return s.RecordTxn(ctx, session, n, needs)
	}
	mustRecord := func(session []byte, n int64, needs ...lockstore.TxnNeed) {
		t.Helper()
		if err := record(session, n, needs...); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(session []byte, n int64) map[string]string {
		t.Helper()
		needs, err := s.BeginCommit(ctx, session, n)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, x := range needs {
			k := x.NS.String() + "/" + x.Bind
			for _, id := range x.Held {
				out[k] += "held " + id.Key() + ";"
			}
			for _, id := range x.Unlocked {
				out[k] += "unlocked " + id.Key() + ";"
			}
		}
		return out
	}
	mustRecord(a, 1, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(1, "x")})
	mustRecord(a, 1, lockstore.TxnNeed{NS: namespace.Of("shop.items"), Bind: "k", Unlocked: IDs(int64(7))})
	mustRecord(a, 2, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(2)})
	mustRecord(b, 1, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(3)})

	want1 := map[string]string{
		ns + "/":       "held " + ID(1).Key() + ";held " + ID("x").Key() + ";",
		"shop.items/k": "unlocked " + ID(7).Key() + ";",
	}
	same := func(g, w map[string]string) bool {
		if len(g) != len(w) {
			return false
		}
		for k, v := range w {
			if g[k] != v {
				return false
			}
		}
		return true
	}
	if g := commit(a, 1); !same(g, want1) {
		t.Errorf("transaction 1 of a: %v, want %v", g, want1)
	}
	if err := record(a, 1, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(4)}); !errors.Is(err, lockstore.ErrTxnCommitting) {
		t.Errorf("a statement after the commit began: %v, want ErrTxnCommitting", err)
	}
	if g := commit(a, 1); !same(g, want1) {
		t.Errorf("transaction 1 of a, its commit retried: %v, want %v", g, want1)
	}
	if g := commit(b, 2); len(g) != 0 {
		t.Errorf("a transaction never recorded: %v, want nothing", g)
	}
	if err := record(b, 2, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(5)}); !errors.Is(err, lockstore.ErrTxnCommitting) {
		t.Errorf("a statement after the commit of a transaction that recorded nothing began: %v, want ErrTxnCommitting", err)
	}
	if err := s.EndTxn(ctx, a, 2); err != nil {
		t.Fatal(err)
	}
	if g := commit(a, 2); len(g) != 0 {
		t.Errorf("an ended transaction: %v, want nothing", g)
	}
	if g := commit(b, 1); g[ns+"/"] != "held "+ID(3).Key()+";" || len(g) != 1 {
		t.Errorf("another session's transaction: %v", g)
	}
	if err := s.EndTxn(ctx, a, 1); err != nil {
		t.Fatal(err)
	}
	// Recorded again (its number used again, as another router may):
	// found, from the first statement on.
	mustRecord(a, 1, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(9)})
	mustRecord(a, 1, lockstore.TxnNeed{NS: namespace.Of(ns), Held: IDs(10)})
	if g := commit(a, 1); g[ns+"/"] != "held "+ID(9).Key()+";held "+ID(10).Key()+";" {
		t.Errorf("transaction 1 recorded again: %v", g)
	}
}
