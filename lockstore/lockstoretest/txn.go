package lockstoretest

import (
	"context"
	"testing"

	"github.com/lockgate/lockgate/lockstore"
)

// txnRecords: what a transaction's statements recorded is found whole by
// its session and txnNumber, whoever recorded it; nothing of another
// session's or another transaction's; and EndTxn forgets that
// transaction alone (an earlier one of the session may still commit on a
// sharded cluster).
func txnRecords(t *testing.T, s Store, _ *Clock) {
	ctx := context.Background()
	a, b := NewOwner("a").Session, NewOwner("b").Session
	record := func(session []byte, n int64, needs ...lockstore.TxnNeed) {
		t.Helper()
		if err := s.RecordTxn(ctx, session, n, needs); err != nil {
			t.Fatal(err)
		}
	}
	record(a, 1, lockstore.TxnNeed{NS: ns, Held: IDs(1, "x")})
	record(a, 1, lockstore.TxnNeed{NS: "shop.items", Bind: "k", Unlocked: IDs(int64(7))})
	record(a, 2, lockstore.TxnNeed{NS: ns, Held: IDs(2)})
	record(b, 1, lockstore.TxnNeed{NS: ns, Held: IDs(3)})

	got := func(session []byte, n int64) map[string]string {
		t.Helper()
		needs, err := s.TxnNeeds(ctx, session, n)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, x := range needs {
			k := x.NS + "/" + x.Bind
			for _, id := range x.Held {
				out[k] += "held " + id.Key() + ";"
			}
			for _, id := range x.Unlocked {
				out[k] += "unlocked " + id.Key() + ";"
			}
		}
		return out
	}
	want := map[string]string{
		ns + "/":       "held " + ID(1).Key() + ";held " + ID("x").Key() + ";",
		"shop.items/k": "unlocked " + ID(7).Key() + ";",
	}
	if g := got(a, 1); len(g) != len(want) || g[ns+"/"] != want[ns+"/"] || g["shop.items/k"] != want["shop.items/k"] {
		t.Errorf("transaction 1 of a: %v, want %v", g, want)
	}
	if g := got(b, 2); len(g) != 0 {
		t.Errorf("a transaction never recorded: %v, want nothing", g)
	}
	if err := s.EndTxn(ctx, a, 2); err != nil {
		t.Fatal(err)
	}
	if g := got(a, 2); len(g) != 0 {
		t.Errorf("an ended transaction: %v, want nothing", g)
	}
	if g := got(a, 1); len(g) != 2 {
		t.Errorf("ending transaction 2 forgot transaction 1: %v", g)
	}
	if g := got(b, 1); g[ns+"/"] != "held "+ID(3).Key()+";" {
		t.Errorf("another session's transaction: %v", g)
	}
	if err := s.EndTxn(ctx, a, 1); err != nil {
		t.Fatal(err)
	}
	if g := got(a, 1); len(g) != 0 {
		t.Errorf("transaction 1 after its end: %v, want nothing", g)
	}
	// Recorded again (its number used again, as another router may),
	// also after another instance ended it: found, from the first
	// statement on.
	record(a, 1, lockstore.TxnNeed{NS: ns, Held: IDs(8)})
	if err := s.EndTxn(ctx, a, 1); err != nil {
		t.Fatal(err)
	}
	record(a, 1, lockstore.TxnNeed{NS: ns, Held: IDs(9)})
	record(a, 1, lockstore.TxnNeed{NS: ns, Held: IDs(10)})
	if g := got(a, 1); g[ns+"/"] != "held "+ID(9).Key()+";held "+ID(10).Key()+";" {
		t.Errorf("transaction 1 recorded again: %v", g)
	}
}
