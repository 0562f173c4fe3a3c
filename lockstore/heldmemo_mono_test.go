package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestHeldMemoMonotonicCheck: a memo's check read on the monotonic clock
// alone (one time.Since of the clock sample's midpoint) answers what the
// check on a full time.Now answers: the lease left on the server's clock
// less the estimate's uncertainty, and the cache's trust measured from
// the confirmation. A confirmation without a monotonic reading takes the
// full reading.
func TestHeldMemoMonotonicCheck(t *testing.T) {
	t.Parallel()
	const trust = 10 * time.Second
	const margin = time.Second
	s := &Store{cfg: Config{CacheTrust: trust}, cache: newHoldCache(nil)}
	s.sclock = newServerClock(nil)
	s.clock = s.sclock
	// The server is 1h ahead; the round trip took 400 ms, so the estimate
	// is uncertain by 200 ms + 1 ms and more than the slack of the cases.
	sent := time.Now()
	s.sclock.add(clockSample{sent: sent, recv: sent.Add(400 * time.Millisecond), server: sent.Add(time.Hour + 200*time.Millisecond)})
	if s.monotonicEstimate() == nil {
		t.Fatal("the store's own clock is not read on the monotonic clock")
	}
	owner := newOwner("a")
	ns := namespace.Of("db.c")
	id := rv(t, "x")
	server := func() time.Time { n, _ := s.clock.Now(); return n }
	for _, c := range []struct {
		name      string
		expires   time.Duration // from the server's now
		confirmed time.Duration // before the local now
		held      bool
	}{
		{"held", time.Minute, trust / 2, true},
		{"confirmed too long ago", time.Minute, 2 * trust, false},
		// Within margin plus the uncertainty (201 ms) but not margin: a
		// check that forgets the uncertainty says held.
		{"lease within the uncertainty", margin + 100*time.Millisecond, trust / 2, false},
		{"lease within the margin", margin / 2, trust / 2, false},
		{"lease past the uncertainty", margin + 2*time.Second, trust / 2, true},
	} {
		for _, mono := range []bool{true, false} {
			confirmed := time.Now().Add(-c.confirmed)
			if !mono {
				confirmed = confirmed.Round(0)
			}
			expires := server().Add(c.expires).Round(0) // a server time: no monotonic reading
			var m HeldMemo
			m.Fill(s, s.cache.gen.Load(), &owner, ns, id.Key(), expires, 42, confirmed)
			left, tok, ok := s.HeldTokenMemo(&m, &owner, ns, id, margin)
			if ok != c.held {
				t.Fatalf("%s (monotonic %v): held %v, want %v", c.name, mono, ok, c.held)
			}
			if !ok {
				continue
			}
			// The lease left is the server's less the uncertainty.
			want := c.expires - 201*time.Millisecond
			if tok != 42 || left > want || left < want-time.Second {
				t.Fatalf("%s (monotonic %v): token %d, left %s, want 42 and about %s", c.name, mono, tok, left, want)
			}
		}
	}
}
