package lockstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the source of "now" for lease arithmetic. The default is an
// estimate of the lock store server's clock (see serverClock); tests inject
// a fake with WithClock, which then replaces the server-time estimate.
//
// Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time of the lock store server, and a bound on
	// how far that estimate may be from the server's real time.
	Now() (now time.Time, uncertainty time.Duration)
}

// Server time resolution (BSON dates are milliseconds) and the drift allowed
// between the local monotonic clock and the server clock between samples.
const (
	serverTimeResolution = time.Millisecond
	driftPPM             = 200
	maxSampleAge         = time.Minute
)

// clockSample is one measurement: the server's localTime read by a hello
// sent at local time sent and answered at local time recv.
type clockSample struct {
	sent, recv time.Time // local, with monotonic readings
	server     time.Time
}

// serverClock estimates the server's time from hello samples:
//
//	server(now) = sample.server + (now - midpoint(sample)),
//
// with uncertainty rtt/2 + 1 ms (the server reports milliseconds) plus
// driftPPM of the time since the sample. The sample with the smallest
// resulting uncertainty wins, so a slow round trip never worsens the
// estimate. Before the first sample, Now reports ok=false through estimate.
type serverClock struct {
	local func() time.Time
	// timeNow: local is time.Now (newServerClock's default), whose
	// readings carry the monotonic clock.
	timeNow bool

	mu sync.Mutex // serializes add
	// best is the sample the estimate is made from, nil before the
	// first: replaced whole by add, read without a lock, since every
	// lease check of every write reads the clock.
	best atomic.Pointer[clockEstimate]
}

// clockEstimate is one sample as the estimate uses it.
type clockEstimate struct {
	mid    time.Time // local midpoint of the best sample
	server time.Time // server time at that midpoint
	rtt    time.Duration
	// mono: mid carries a monotonic clock reading, so that the time
	// since it can be read on the monotonic clock alone (sinceMid).
	mono bool
}

func newServerClock(local func() time.Time) *serverClock {
	if local == nil {
		return &serverClock{local: time.Now, timeNow: true}
	}
	return &serverClock{local: local}
}

// add folds a sample into the estimate.
func (c *serverClock) add(s clockSample) {
	rtt := s.recv.Sub(s.sent)
	if rtt < 0 {
		rtt = 0
	}
	mid := s.sent.Add(rtt / 2)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.local()
	// Keep the old sample only while it is both better and recent: a server
	// clock step is picked up within maxSampleAge.
	if b := c.best.Load(); b != nil && now.Sub(b.mid) < maxSampleAge &&
		b.uncertainty(now) < rtt/2+serverTimeResolution+drift(now.Sub(mid)) {
		return
	}
	c.best.Store(&clockEstimate{mid: mid, server: s.server, rtt: rtt, mono: hasMonotonic(mid)})
}

// hasMonotonic reports whether t carries a monotonic clock reading
// (time.Now's do; Round(0), Truncate, UTC and a parsed time strip it).
func hasMonotonic(t time.Time) bool { return t != t.Round(0) }

func drift(d time.Duration) time.Duration {
	if d < 0 {
		d = -d
	}
	return d / 1e6 * driftPPM
}

func (b *clockEstimate) uncertainty(now time.Time) time.Duration {
	return b.uncertaintyAfter(now.Sub(b.mid))
}

// uncertaintyAfter is uncertainty at d after the sample's midpoint.
func (b *clockEstimate) uncertaintyAfter(d time.Duration) time.Duration {
	return b.rtt/2 + serverTimeResolution + drift(d)
}

// monotonicEstimate is the estimate when it can be read on the monotonic
// clock alone: the local clock is time.Now's and the sample's midpoint
// carries a monotonic reading; nil otherwise. Every use of the local
// reading in a cached lock check is a difference with another local
// reading (the midpoint, a confirmation), which Go takes on the monotonic
// clock: time.Since of such a time reads that clock alone, where
// time.Now reads the wall clock as well, the more costly half.
func (c *serverClock) monotonicEstimate() *clockEstimate {
	if !c.timeNow {
		return nil
	}
	if b := c.best.Load(); b != nil && b.mono {
		return b
	}
	return nil
}

// estimate returns the server time, its uncertainty, and false before the
// first sample.
func (c *serverClock) estimate() (time.Time, time.Duration, bool) {
	return c.estimateAt(c.local())
}

// estimateAt is estimate at local time now, a reading of c.local the
// caller made: one clock read serves the estimate and the caller's own
// local arithmetic.
func (c *serverClock) estimateAt(now time.Time) (time.Time, time.Duration, bool) {
	b := c.best.Load()
	if b == nil {
		return time.Time{}, 0, false
	}
	return b.server.Add(now.Sub(b.mid)), b.uncertainty(now), true
}

// Now implements Clock; before the first sample it falls back to the local
// clock with an unbounded (one hour) uncertainty, which makes every check
// conservative. Store operations refuse to run before the first sample.
func (c *serverClock) Now() (time.Time, time.Duration) {
	return c.nowAt(c.local())
}

// nowAt is Now at local time now, a reading of c.local.
func (c *serverClock) nowAt(now time.Time) (time.Time, time.Duration) {
	if t, u, ok := c.estimateAt(now); ok {
		return t, u
	}
	return now, time.Hour
}
