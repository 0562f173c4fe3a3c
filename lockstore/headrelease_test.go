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
// answers b's writes from its cache only for the trust period after the
// acquire, and then from the head, which shows nobody. Before, every
// store that read the head answered "not held" to the holder (no error,
// so its write was refused as unlocked, not as failing closed) until b's
// next change of the key; the free head was never followed to the claims.
func TestHolderHeldOverAHeadMovedBackToARelease(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	// s[0] is A, whose cache shows its own release; s[1] is B; s[2] has
	// never seen the key: it is B once its trust in its cache has lapsed.
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
	if g, err := s[2].head(bg, ks(t, ns, key)); err != nil || g == nil || g.Owner != nil {
		t.Fatalf("set-up: the head document should show a's release, shows %+v (%v)", g, err)
	}

	for i, st := range s {
		if ok, missing, err := st.Holds(bg, b, namespace.Of(ns), key, 0); !ok || err != nil {
			t.Errorf("s%d: Holds(b) = %v (missing %v), %v: b holds the key by the claims", i+1, ok, missing, err)
		}
		if toks, _, missing, err := st.HeldTokens(bg, b, namespace.Of(ns), key, 0); len(toks) != 1 || err != nil {
			t.Errorf("s%d: HeldTokens(b) = %v (missing %v), %v", i+1, toks, missing, err)
		}
		if ok, _, err := st.Holds(bg, a, namespace.Of(ns), key, 0); ok || err != nil {
			t.Errorf("s%d: Holds(a) = %v, %v after a released and b took the key", i+1, ok, err)
		}
	}
	if _, err := s[2].Acquire(bg, newOwner("c"), namespace.Of(ns), key, holdLease, 0); err == nil {
		t.Error("c acquired the key b holds")
	}
}
