package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestHoldsAnyHere: a session holds a lock here from its acquire through
// this Store until its release; a lock it took through another Store is
// not seen (the guard confirms that guess by the implicit acquire).
func TestHoldsAnyHere(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s1, s2 := openStore(t, cfg), openStore(t, cfg)
	a := newOwner("a")
	if s1.HoldsAnyHere(a.Session) {
		t.Fatal("a session that never locked holds a lock here")
	}
	mustAcquire(t, s1, a, "db.c", ids(t, 1), time.Minute, 0)
	if !s1.HoldsAnyHere(a.Session) {
		t.Fatal("a session holding a lock through this Store does not")
	}
	if s2.HoldsAnyHere(a.Session) {
		t.Fatal("the other Store knows of a lock it never saw taken")
	}
	if _, err := s1.Release(bg, a, namespace.Of("db.c"), ids(t, 1), ""); err != nil {
		t.Fatal(err)
	}
	if s1.HoldsAnyHere(a.Session) {
		t.Fatal("a released lock is still counted")
	}
}
