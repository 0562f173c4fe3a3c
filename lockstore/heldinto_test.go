package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestHeldTokensIntoSeesEveryChange: the allocation-free cache answer for
// one id (HeldTokensInto) never says "held" once the lock was released,
// force-released or taken by another session, through this store or
// another; the very next check after the change sees it, and a lock held
// gets the same token as HeldTokens gives.
func TestHeldTokensIntoSeesEveryChange(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.CacheTrust = 2 * time.Second // a release through the other store waits this long (quiesce)
	s1 := openStore(t, cfg)
	s2 := openStore(t, cfg)
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	held := func(s *Store, o Owner, id string) (int64, bool) {
		t.Helper()
		var tok [1]int64
		cached, fast := s.heldCached(o, namespace.Of(ns), rv(t, id), time.Second, &tok[0])
		left, missing, err := s.HeldTokensInto(bg, o, namespace.Of(ns), ids(t, id), time.Second, tok[:])
		if err != nil {
			t.Fatal(err)
		}
		if len(missing) > 0 {
			if fast {
				t.Fatalf("the cache answers held (%s left), the store not", cached)
			}
			return 0, false
		}
		if left <= time.Second {
			t.Fatalf("held with %s left", left)
		}
		want, _, _, err := s.HeldTokens(bg, o, namespace.Of(ns), ids(t, id), time.Second)
		if err != nil || len(want) != 1 || want[0] != tok[0] {
			t.Fatalf("token %d, HeldTokens says %v (%v)", tok[0], want, err)
		}
		return tok[0], true
	}
	for _, c := range holdEnders(s1, s2, a, ns) {
		t.Run(c.name, func(t *testing.T) {
			id := c.name
			mustAcquire(t, s1, a, ns, ids(t, id), time.Minute, 0)
			var fresh int64
			if _, fast := s1.heldCached(a, namespace.Of(ns), rv(t, id), time.Second, &fresh); !fast {
				t.Fatal("a lock just taken through this store is not answered from its cache")
			}
			tok, ok := held(s1, a, id)
			if !ok || tok != fresh {
				t.Fatalf("the holder's lock: held %v, token %d, cached %d", ok, tok, fresh)
			}
			if _, ok := held(s1, b, id); ok {
				t.Fatal("another session is answered as the holder")
			}
			c.change(t, id)
			if _, ok := held(s1, a, id); ok {
				t.Fatal("the next check still answers held after the change")
			}
			// Taken over by another session: the old holder is not
			// answered, the new one is, with a newer token.
			mustAcquire(t, s2, b, ns, ids(t, id), time.Minute, 0)
			if _, ok := held(s1, a, id); ok {
				t.Fatal("the old holder is answered after another session took the lock")
			}
			if tok2, ok := held(s1, b, id); !ok || tok2 <= tok {
				t.Fatalf("new holder: held %v, token %d after %d", ok, tok2, tok)
			}
		})
	}
	// The lock's lease running short is seen too: a margin longer than
	// the lease left is "not held".
	mustAcquire(t, s1, a, ns, ids(t, "short"), 2*time.Second, 0)
	var tok [1]int64
	if _, missing, err := s1.HeldTokensInto(bg, a, namespace.Of(ns), ids(t, "short"), 5*time.Second, tok[:]); err != nil || len(missing) != 1 {
		t.Fatalf("a lease shorter than the margin was answered held: %v %v", missing, err)
	}
}

// holdEnder is one way a hold ends, run on the key whose id is given.
type holdEnder struct {
	name   string
	change func(t *testing.T, id string)
}

// holdEnders are the ways a's hold, taken through s1, ends: released or
// force-released through s1 or through s2, or its session ended. A
// cached answer must notice each.
func holdEnders(s1, s2 *Store, a Owner, ns string) []holdEnder {
	return []holdEnder{
		{"release through the same store", func(t *testing.T, id string) {
			if n, err := s1.Release(bg, a, namespace.Of(ns), ids(t, id), ""); n != 1 || err != nil {
				t.Fatalf("release: %d %v", n, err)
			}
		}},
		{"release through another store", func(t *testing.T, id string) {
			if n, err := s2.Release(bg, a, namespace.Of(ns), ids(t, id), ""); n != 1 || err != nil {
				t.Fatalf("release through s2: %d %v", n, err)
			}
		}},
		{"force release through the same store", func(t *testing.T, id string) {
			if _, err := s1.ForceRelease(bg, namespace.Of(ns), rv(t, id), "test"); err != nil {
				t.Fatal(err)
			}
		}},
		{"force release through another store", func(t *testing.T, id string) {
			if _, err := s2.ForceRelease(bg, namespace.Of(ns), rv(t, id), "test"); err != nil {
				t.Fatal(err)
			}
		}},
		{"session released", func(t *testing.T, id string) {
			if _, err := s1.ReleaseSession(bg, a.Session); err != nil {
				t.Fatal(err)
			}
		}},
	}
}
