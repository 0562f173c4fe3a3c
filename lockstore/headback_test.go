package lockstore

import (
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestHeadMovedBackHoldsNobody: a holder's renewal whose head write is
// overtaken by the holder's own release (through another lockgate, or
// through the same one from another connection) and by another owner's
// acquire lands last, so that the head document shows the renewed hold
// again. The claims say the key is b's: no store may answer that a holds
// it, nor show a as the holder. Before newest and putUnlessNewer every
// store answered Holds(a) true and showed a as the holder, for a's whole
// renewed lease (through the same store, from its cache too).
func TestHeadMovedBackHoldsNobody(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		release int // the store a releases through: 0 (s1, the renewing one) or 1 (s2)
	}{{"release through another store", 1}, {"release through the same store", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each case on a collection of its own
			cfg := testConfig(t)
			cfg.CacheTrust = time.Second // the code's own value: a's renewal is trusted for it
			s := []*Store{openStore(t, cfg), openStore(t, cfg), openStore(t, cfg)}
			a, b := newOwner("a"), newOwner("b")
			const ns = "db.c"
			key := ids(t, "k")
			mustAcquire(t, s[0], a, ns, key, holdLease, 0)

			landRenewal := holdHeadWrite(s[0], kindRenew, func() error {
				_, err := s[0].Renew(bg, a, namespace.Of(ns), key, holdLease)
				return err
			})
			if n, err := s[c.release].Release(bg, a, namespace.Of(ns), key, ""); n != 1 || err != nil {
				t.Fatalf("a's release: %d %v", n, err)
			}
			mustAcquire(t, s[1], b, ns, key, holdLease, 0)
			if err := landRenewal(); err != nil {
				t.Logf("the overtaken renewal: %v", err)
			}

			for i, st := range s {
				if ok, _, err := st.Holds(bg, a, namespace.Of(ns), key, 0); ok || err != nil {
					t.Errorf("s%d: Holds(a) = %v, %v after a released and b acquired", i+1, ok, err)
				}
				// One key, and two (the heads are read together).
				for _, which := range [][]any{{"k"}, {"k", "other"}} {
					sts, err := st.Status(bg, b, namespace.Of(ns), ids(t, which...))
					if err != nil || len(sts) != len(which) {
						t.Fatalf("s%d: status: %v %v", i+1, sts, err)
					}
					if !sts[0].Held || !sts[0].HeldByYou {
						t.Errorf("s%d: status of %v shows %+v, want held by b", i+1, which, sts[0].Holder)
					}
				}
			}
			if _, err := s[2].Acquire(bg, newOwner("c"), namespace.Of(ns), key, time.Minute, 0); err == nil {
				t.Error("c acquired the key b holds")
			}
		})
	}
}

// holdHeadWrite runs write, whose head write of the given kind through s
// is held until the returned land is called: land lets it go and returns
// write's error. The head write lands after whatever the test does
// meanwhile, as a late write would.
func holdHeadWrite(s *Store, kind string, write func() error) (land func() error) {
	paused, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.testHookHead = func(g *gen) {
		if g.Kind == kind && g.Via == s.via {
			once.Do(func() { close(paused) })
			<-gate
		}
	}
	done := make(chan error, 1)
	go func() { done <- write() }()
	<-paused
	s.testHookHead = nil
	return func() error {
		close(gate)
		return <-done
	}
}
