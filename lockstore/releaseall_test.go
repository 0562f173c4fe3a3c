package lockstore

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestReleaseAllOverAMovedBackHead: a holder's renewal whose head write is
// overtaken by its own release and another owner's acquire lands last, so
// that the key's head document shows the renewed hold of a while the
// claims say the key is b's. b's release of all its locks in the
// namespace must free it, through any store: it found its keys from the
// head documents that name b alone, so it freed nothing and the key stayed
// b's until b's lease ended (here a minute; liveness, not safety).
func TestReleaseAllOverAMovedBackHead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		through int // the store b releases all through
	}{{"through the store b acquired through", 1}, {"through a store that never saw b", 2}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, b, other, key := movedBackHead(t)
			const ns = "db.c"

			n, err := s[c.through].ReleaseAll(bg, b, namespace.Of(ns), "")
			if err != nil || n != 2 {
				t.Errorf("b's release-all freed %d (%v), want 2: the key whose head shows a's renewal stayed b's", n, err)
			}
			if _, err := s[2].Acquire(bg, other, namespace.Of(ns), key, time.Minute, 0); err != nil {
				t.Errorf("after b's release-all the key is still held: %v", err)
			}
		})
	}
}

// TestReleaseAllScansAreBounded: a release-all finds its keys by scanning
// the heads and the claims (on FerretDB), and any client may ask for one;
// the guard throttles each connection, so many connections asking at
// once ran as many scans at once, taking the store client's pool from
// everyone's acquires and checks. At most releaseAllScans look for their
// keys at once; the others wait for a turn, and all finish.
func TestReleaseAllScansAreBounded(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	gate := make(chan struct{})
	var entered atomic.Int32
	s.scans.testHookHeld = func() { entered.Add(1); <-gate }
	const callers = releaseAllScans + 2
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := s.ReleaseAll(bg, newOwner("x"), namespace.Of("db.c"), "")
			errs <- err
		}()
	}
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d release-alls scanning and %d waiting for a turn", releaseAllScans, callers-releaseAllScans), func() bool {
		return entered.Load() == releaseAllScans && s.scans.waiting.Load() == callers-releaseAllScans
	})
	close(gate)
	for range callers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := entered.Load(); n != callers {
		t.Errorf("%d of %d release-alls had their turn", n, callers)
	}
}

// movedBackHead makes, on three stores of one lock store, a key "k" of
// db.c whose head document was moved back: a's renewal through s[0] is
// overtaken by a's release and b's acquire through s[1], then lands, so
// the head shows a's renewal while the claims say the key is b's. b also
// holds "also b's" through s[1]; other is a third owner.
func movedBackHead(t *testing.T) (s []*Store, b, other Owner, key []docid.ID) {
	t.Helper()
	cfg := testConfig(t)
	s = []*Store{openStore(t, cfg), openStore(t, cfg), openStore(t, cfg)}
	a := newOwner("a")
	b, other = newOwner("b"), newOwner("c")
	const ns = "db.c"
	key = ids(t, "k")
	mustAcquire(t, s[0], a, ns, key, holdLease, 0)
	mustAcquire(t, s[1], b, ns, ids(t, "also b's"), time.Minute, 0)
	landRenewal := holdHeadWrite(s[0], kindRenew, func() error {
		_, err := s[0].Renew(bg, a, namespace.Of(ns), key, holdLease)
		return err
	})
	if n, err := s[1].Release(bg, a, namespace.Of(ns), key, ""); n != 1 || err != nil {
		t.Fatalf("a's release: %d %v", n, err)
	}
	mustAcquire(t, s[1], b, ns, key, time.Minute, 0)
	if err := landRenewal(); err != nil {
		t.Logf("the overtaken renewal: %v", err)
	}
	h, err := s[0].head(bg, ks(t, ns, key))
	if err != nil || h == nil || h.Kind != kindRenew {
		t.Fatalf("the head is %+v (%v), want a's renewal moved back over b's acquire: the test no longer reaches the case", h, err)
	}
	return s, b, other, key
}
