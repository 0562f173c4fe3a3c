package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestHeldMemoSeesEveryChange: a caller's memo of a cached lock check
// (HeldTokenMemo) answers as the cache itself would, and never says
// "held" once the lock was released, force-released or taken over,
// through this store or another: every change the store makes moves its
// generation past the memo's, and a change through another store is seen
// as the cache sees it.
func TestHeldMemoSeesEveryChange(t *testing.T) {
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.CacheTrust = 2 * time.Second // a release through the other store waits this long (quiesce)
	s1 := openStore(t, cfg)
	s2 := openStore(t, cfg)
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	var memos HeldMemos
	// memoHeld asks through the memo and checks the answer against the
	// cache's own (heldCached).
	memoHeld := func(o Owner, id string) (int64, bool) {
		t.Helper()
		idv := rv(t, id)
		left, tok, ok := s1.HeldTokenMemo(&memos, &o, namespace.Of(ns), &idv, time.Second, time.Now())
		var ctok int64
		_, cached := s1.heldCached(o, namespace.Of(ns), rv(t, id), time.Second, &ctok)
		if ok != cached || (ok && tok != ctok) {
			t.Fatalf("the memo answers held %v (token %d), the cache %v (token %d)", ok, tok, cached, ctok)
		}
		if ok && left <= time.Second {
			t.Fatalf("held with %s left", left)
		}
		return tok, ok
	}
	for _, c := range holdEnders(s1, s2, a, ns) {
		t.Run(c.name, func(t *testing.T) {
			id := c.name
			mustAcquire(t, s1, a, ns, ids(t, id), time.Minute, 0)
			tok, ok := memoHeld(a, id)
			if !ok {
				t.Fatal("a lock just taken through this store is not answered held")
			}
			if again, ok := memoHeld(a, id); !ok || again != tok {
				t.Fatalf("from the memo: held %v, token %d, want %d", ok, again, tok)
			}
			if _, ok := memoHeld(b, id); ok {
				t.Fatal("another session is answered as the holder")
			}
			mustAcquire(t, s1, a, ns, ids(t, id), time.Minute, 0) // the memo is a's again
			c.change(t, id)
			if _, ok := memoHeld(a, id); ok {
				t.Fatal("the next check still answers held after the change")
			}
			mustAcquire(t, s2, b, ns, ids(t, id), time.Minute, 0)
			if _, ok := memoHeld(a, id); ok {
				t.Fatal("the old holder is answered after another session took the lock")
			}
		})
	}
}
