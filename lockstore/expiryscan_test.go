package lockstore

import (
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// A lease that runs out with nobody taking the lock over is reported by
// the scan (the audit trail's expire record), once: not for a released
// or renewed lock, and not again when the lock is later taken over.
func TestExpiryScanReportsLeasesNobodyTookOver(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var mu sync.Mutex
	var got []Expiry
	cfg := testConfig(t)
	s := openStore(t, cfg, WithClock(clk), WithExpiryHook(func(e Expiry) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}))
	reports := func() []Expiry {
		mu.Lock()
		defer mu.Unlock()
		return append([]Expiry(nil), got...)
	}
	a, b, c, d := newOwner("a"), newOwner("b"), newOwner("c"), newOwner("d")
	expiring, released, renewed := ids(t, int32(1)), ids(t, int32(2)), ids(t, int32(3))
	la := mustAcquire(t, s, a, "db.c", expiring, 10*time.Second, 0)
	mustAcquire(t, s, c, "db.c", released, 10*time.Second, 0)
	if n, err := s.Release(bg, c, namespace.Of("db.c"), released, "done"); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	mustAcquire(t, s, d, "db.c", renewed, 10*time.Second, 0)
	if _, err := s.Renew(bg, d, namespace.Of("db.c"), renewed, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10*time.Second + s.cfg.OpTimeout + time.Second)
	testkit.Eventually(t, 30*time.Second, "the expiry scan to report the lease that ran out", func() bool {
		return len(reports()) > 0
	})
	// Two more whole passes: anything else due was looked at by then.
	after := s.expScan.passes.Load()
	testkit.Eventually(t, 30*time.Second, "two more expiry scans", func() bool {
		return s.expScan.passes.Load() >= after+2
	})
	r := reports()
	if len(r) != 1 {
		t.Fatalf("expiries reported: %+v, want the one of id 1", r)
	}
	e := r[0]
	if !e.Scanned || e.NS.String() != "db.c" || !e.ID.Equal(expiring[0]) || e.Former.App != "a" || e.Former.Token != la[0].Token ||
		e.Former.SessionPrefix != SessionPrefix(a.Session) || !e.At.Equal(la[0].ExpiresAt) || e.Token != 0 {
		t.Fatalf("expiry %+v; want the scanned end of %+v", e, la[0])
	}
	lb := mustAcquire(t, s, b, "db.c", expiring, 10*time.Second, 0)
	if lb[0].Token <= la[0].Token {
		t.Fatal("the takeover must raise the token")
	}
	if r := reports(); len(r) != 1 {
		t.Fatalf("the takeover of a lease the scan reported was reported again: %+v", r[1:])
	}
}
