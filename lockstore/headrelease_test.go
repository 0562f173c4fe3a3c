package lockstore

import (
	"testing"

	"github.com/lockgate/lockgate/namespace"
)

// TestHolderHeldOverAHeadMovedBackToARelease: a releases the key through
// lockgate A and b, waiting through lockgate B, takes it at once; a's
// head write is the slower one and lands last, so the head document shows
// a's release (free) while the claims say b holds the key. That is how
// tests/reliability TestLostUpdates' locked leg was refused under load
// ("this session does not hold the lock" right after a 30 s acquire): B
// answers b's writes from its cache only while its confirmation keeps it
// trusted, and then from the head, which shows nobody. Before, B answered
// "not held" to the holder (no error, so its write was refused as
// unlocked, not as failing closed) until b's next change of the key: a
// free head was never followed to the claims.
//
// A store that did not grant b the key (A, or a third) still answers
// from the head: following every free head to the claims would cost each
// refused write a read, and b writes through the lockgate it locked
// through.
func TestHolderHeldOverAHeadMovedBackToARelease(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s := []*Store{openStore(t, cfg), openStore(t, cfg), openStore(t, cfg)}
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	key := ids(t, "k")
	mustAcquire(t, s[0], a, ns, key, holdLease, 0)
	land := holdHeadWrite(s[0], kindRelease, func() error {
		n, err := s[0].Release(bg, a, namespace.Of(ns), key, "")
		if err == nil && n != 1 {
			t.Errorf("a's release freed %d", n)
		}
		return err
	})
	mustAcquire(t, s[1], b, ns, key, holdLease, 0)
	if err := land(); err != nil {
		t.Fatalf("a's release: %v", err)
	}
	s[0].testHookHead = nil
	rid := ks(t, ns, key)
	if g, err := s[2].head(bg, rid); err != nil || g == nil || g.Owner != nil {
		t.Fatalf("set-up: the head document should show a's release, shows %+v (%v)", g, err)
	}
	// B's cache no longer vouches for b's hold (its trust ran out before
	// a confirmation came): the check reads the head.
	s[1].cache.remove(rid)

	if ok, missing, err := s[1].Holds(bg, b, namespace.Of(ns), key, 0); !ok || err != nil {
		t.Errorf("B: Holds(b) = %v (missing %v), %v: b holds the key by the claims, granted through B", ok, missing, err)
	}
	s[1].cache.remove(rid)
	if toks, _, missing, err := s[1].HeldTokens(bg, b, namespace.Of(ns), key, 0); len(toks) != 1 || err != nil {
		t.Errorf("B: HeldTokens(b) = %v (missing %v), %v", toks, missing, err)
	}
	for i, st := range s {
		if ok, _, err := st.Holds(bg, a, namespace.Of(ns), key, 0); ok || err != nil {
			t.Errorf("s%d: Holds(a) = %v, %v after a released and b took the key", i+1, ok, err)
		}
	}
	if _, err := s[2].Acquire(bg, newOwner("c"), namespace.Of(ns), key, holdLease, 0); err == nil {
		t.Error("c acquired the key b holds")
	}
}
