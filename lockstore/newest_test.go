package lockstore

import (
	"testing"
	"time"
)

// movedBackKey sets up a key whose head document was moved back to a's
// first hold (generation 1) while the claims went on: a released, b
// acquired and renewed it renewals times. It returns the key's record id
// and the store the changes went through.
func movedBackKey(t *testing.T, cfg Config, a, b Owner, ns string, renewals int) (string, *Store) {
	t.Helper()
	s := openStore(t, cfg)
	key := ids(t, "k")
	mustAcquire(t, s, a, ns, key, time.Minute, 0)
	rid := ks(t, ns, key)
	first, err := s.claim(bg, rid, 1)
	if err != nil || first == nil {
		t.Fatalf("a's claim: %+v %v", first, err)
	}
	if n, err := s.Release(bg, a, ns, key, ""); n != 1 || err != nil {
		t.Fatalf("a's release: %d %v", n, err)
	}
	mustAcquire(t, s, b, ns, key, time.Minute, 0)
	for range renewals {
		if _, err := s.Renew(bg, b, ns, key, time.Minute); err != nil {
			t.Fatalf("b's renewal: %v", err)
		}
	}
	// a's first hold lands last, as a late head write would.
	if err := s.writeHead(bg, opAcquire, first); err != nil {
		t.Fatal(err)
	}
	return rid, s
}

// wantHeldByB checks every head-reading answer of st about a key that b
// holds and a does not.
func wantHeldByB(t *testing.T, st *Store, a, b Owner, ns string) {
	t.Helper()
	if ok, _, err := st.Holds(bg, a, ns, ids(t, "k"), 0); ok || err != nil {
		t.Errorf("Holds(a) = %v, %v; a released", ok, err)
	}
	if ok, _, err := st.Holds(bg, b, ns, ids(t, "k"), 0); !ok || err != nil {
		t.Errorf("Holds(b) = %v, %v; b holds it", ok, err)
	}
	// One key, and two (the heads are read together: newestAll).
	for _, which := range [][]any{{"k"}, {"k", "other"}} {
		sts, err := st.Status(bg, b, ns, ids(t, which...))
		if err != nil || len(sts) != len(which) {
			t.Errorf("status of %v: %v %v", which, sts, err)
			continue
		}
		if !sts[0].Held || !sts[0].HeldByYou {
			t.Errorf("status of %v shows %+v, want held by b", which, sts[0].Holder)
		}
	}
}

// TestHeadFarBehindItsClaims: a head document moved back 40 generations
// behind its key's claims. Readers must still find the newest claim.
// Before the search (newest read the claims one at a time, giving up
// after 32) every answer failed closed with "a lock record's head is too
// far behind its claims": b was refused its own lock.
func TestHeadFarBehindItsClaims(t *testing.T) {
	cfg := testConfig(t)
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	_, s1 := movedBackKey(t, cfg, a, b, ns, 40)
	s2 := openStore(t, cfg) // nothing cached
	for i, st := range []*Store{s1, s2} {
		t.Logf("store %d", i+1)
		wantHeldByB(t, st, a, b, ns)
	}
}

// TestHeadBehindAKeyThatKeepsChanging: while a reader looks for the newest
// claim of a key whose head was moved back, the key gains a generation
// each time the reader reads one claim (a hook renews b's hold through
// another store), as a key that many connections take and release does.
// The reader must settle on a generation that was the newest at some
// moment. Before the search it chased them one at a time and gave up
// (what CI saw in guard TestImplicitLocksNoDeadlock: a legacy write
// refused under -race).
func TestHeadBehindAKeyThatKeepsChanging(t *testing.T) {
	cfg := testConfig(t)
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	rid, s1 := movedBackKey(t, cfg, a, b, ns, 0)
	s2 := openStore(t, cfg)
	reads := 0
	s2.testHookClaim = func(r string, _ int64) {
		if r != rid {
			return
		}
		reads++
		if _, err := s1.Renew(bg, b, ns, ids(t, "k"), time.Minute); err != nil {
			t.Errorf("b's renewal: %v", err)
		}
	}
	wantHeldByB(t, s2, a, b, ns)
	s2.testHookClaim = nil
	t.Logf("%d claim reads while the key gained as many generations", reads)
}

// TestTombstoneNearAMovedBackHead: the janitor's tombstone of a key's
// previous life (CollectHeads) sits at a generation the key's new life has
// not reached, apart from its run of claims (with a gap) or right after
// its newest claim. A reader of a moved-back head must find b's newest
// claim, not take the tombstone for the key's state ("not held"). The
// search jumps over generations, so it can read the tombstone first.
func TestTombstoneNearAMovedBackHead(t *testing.T) {
	for _, c := range []struct {
		name string
		at   int64 // the tombstone's generation; b's newest claim is 5
	}{{"apart from the claims", 8}, {"right after the newest claim", 6}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			a, b := newOwner("a"), newOwner("b")
			const ns = "db.c"
			rid, s1 := movedBackKey(t, cfg, a, b, ns, 2)
			now, _ := s1.clock.Now()
			relic := &gen{ID: genID(rid, c.at), Key: rid, Seq: c.at, NS: ns, Kind: kindGC, At: now.Add(-cfg.CleanupAfter)}
			if ok, err := s1.insert(bg, opCleanup, relic); !ok || err != nil {
				t.Fatalf("tombstone: %v %v", ok, err)
			}
			s1.cache.remove(rid)
			wantHeldByB(t, s1, a, b, ns)
			wantHeldByB(t, openStore(t, cfg), a, b, ns)
		})
	}
}
