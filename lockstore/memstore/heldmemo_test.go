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
	var m lockstore.HeldMemos
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
		left, _, memoHeld := s.HeldTokenMemo(&m, &a, ns, &id, margin, time.Now())
		if memoHeld && !storeHeld {
			t.Fatalf("the memo answers held (%s left) after the store answered not", left)
		}
		// The memo first, then the store: the store, asked later, never
		// has more lease left than the memo said.
		left, _, memoHeld = s.HeldTokenMemo(&m, &a, ns, &id, margin, time.Now())
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

// TestHeldMemoIsTheLocksOwn: a memo answers "held" only for the lock
// check it recorded. Session a holds 7 in db.c (bound to a transaction),
// session b holds 8 in db.c and 7 in db.d; after a's own check of its
// lock fills a memo, every check that differs in one thing (the _id, the
// namespace, the session, the binding) is answered by the store: not
// held by the asker. A lookup that compares one field less answers such a
// check from a's memo: held.
func TestHeldMemoIsTheLocksOwn(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	id := func(v any) *docid.ID {
		d, err := docid.Of(v)
		if err != nil {
			t.Fatal(err)
		}
		return &d
	}
	c, d := namespace.Of("db.c"), namespace.Of("db.d")
	a := lockstore.Owner{Session: []byte("session a"), Bind: "txn 1"}
	b := lockstore.Owner{Session: []byte("session b"), Bind: "txn 1"}
	for _, l := range []struct {
		o  lockstore.Owner
		ns namespace.Namespace
		id *docid.ID
	}{{a, c, id(int32(7))}, {b, c, id(int32(8))}, {b, d, id(int32(7))}} {
		if _, err := s.Acquire(ctx, l.o, l.ns, []docid.ID{*l.id}, time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	unbound := lockstore.Owner{Session: a.Session}
	otherTxn := lockstore.Owner{Session: a.Session, Bind: "txn 2"}
	for _, c := range []struct {
		name string
		o    *lockstore.Owner
		ns   namespace.Namespace
		id   *docid.ID
	}{
		{"another _id", &a, c, id(int32(8))},
		{"another namespace", &a, d, id(int32(7))},
		{"another session", &b, c, id(int32(7))},
		{"no binding", &unbound, c, id(int32(7))},
		{"another binding", &otherTxn, c, id(int32(7))},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ms lockstore.HeldMemos
			for range 2 { // the store fills the memo, then the memo answers
				if _, _, ok := s.HeldTokenMemo(&ms, &a, namespace.Of("db.c"), id(int32(7)), time.Second, time.Now()); !ok {
					t.Fatal("the holder's own check is not held")
				}
			}
			if _, _, ok := s.HeldTokenMemo(&ms, c.o, c.ns, c.id, time.Second, time.Now()); ok {
				t.Fatal("answered held from the holder's memo")
			}
			// And the holder's memo still answers after the other check.
			if _, _, ok := s.HeldTokenMemo(&ms, &a, namespace.Of("db.c"), id(int32(7)), time.Second, time.Now()); !ok {
				t.Fatal("the holder's check after the other is not held")
			}
		})
	}
}

// TestHeldMemoIsForTheCallersReading: on the local clock a memo's answer
// is for the caller's reading, the lease left measured from it (what the
// guard's flight adds it to), not from a clock read of its own; the zero
// Time has it read the clock. A check that ignored the reading would
// answer held for a reading past the lease less the margin.
func TestHeldMemoIsForTheCallersReading(t *testing.T) {
	s := memstore.New(memstore.Config{})
	id, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace.Of("db.c")
	a := lockstore.Owner{Session: []byte("a")}
	if _, err := s.Acquire(context.Background(), a, ns, []docid.ID{id}, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	var ms lockstore.HeldMemos
	if _, _, ok := s.HeldTokenMemo(&ms, &a, ns, &id, time.Second, time.Time{}); !ok { // fills the memo
		t.Fatal("the holder's check is not held")
	}
	now := time.Now()
	if left, _, ok := s.HeldTokenMemo(&ms, &a, ns, &id, time.Second, now); !ok || left > time.Minute || left < 50*time.Second {
		t.Fatalf("at the caller's reading: held %v, %s left", ok, left)
	}
	// The lease was taken before now: at now + 30 s it has at most 30 s
	// left.
	left, _, ok := s.HeldTokenMemo(&ms, &a, ns, &id, time.Second, now.Add(30*time.Second))
	if !ok || left > 30*time.Second || left < 20*time.Second {
		t.Fatalf("30 s on: held %v, %s left", ok, left)
	}
	if _, _, ok := s.HeldTokenMemo(&ms, &a, ns, &id, time.Second, now.Add(time.Minute-time.Second)); ok {
		t.Fatal("held for a reading within the margin of the lease's end")
	}
}
