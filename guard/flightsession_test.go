package guard

import (
	"context"
	"testing"
)

// TestKeptFlightEntryStillWaitedFor: a connection's second write in its
// session is launched with the session's flight entry it kept from the
// first (keepFlights), without the tracker's map; a release of the
// session and a force-release of the lock still wait for it.
func TestKeptFlightEntryStillWaitedFor(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	c.decideWrite(a, 7).Reply(context.Background(), nil)
	m := c.sessionMemo(a)
	if m == nil || m.flights == nil {
		t.Fatal("the session's memo kept no flight entry after its first write")
	}
	kept := m.flights
	f := c.decideWrite(a, 7)
	if f.Session != kept {
		t.Fatal("the second write was not launched with the kept entry")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // asks, does not wait
	if err := c.g.flights.WaitSession(ctx, f.Owner.Session); err == nil {
		t.Fatal("a release of the session does not wait for its write in flight")
	}
	if !c.inFlight(7) {
		t.Fatal("a force-release does not wait for the write in flight")
	}
	f.Reply(context.Background(), nil)
	if c.inFlight(7) {
		t.Fatal("the write is still in flight after its reply")
	}
}
