package guard

import (
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/lockgate/lockgate/proxy"
)

type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

// TestThrottleLockCommands: a connection's lock commands share idsPerSecond
// ids, with a burst of idsBurst; malformed ones make its next commands wait
// longer and longer, good ones bring the wait down (issue 12: clients
// pipelining junk lock commands slowed everyone's).
func TestThrottleLockCommands(t *testing.T) {
	c := &stepClock{t: time.Unix(1000, 0)}
	th := newThrottle(c.now)
	c1, c2 := &proxy.ClientInfo{ID: 1}, &proxy.ClientInfo{ID: 2}
	if d := th.lockCommandDelay(c1, idsBurst); d != 0 {
		t.Fatalf("the first burst waited %v", d)
	}
	if d := th.lockCommandDelay(c1, 1000); d != 500*time.Millisecond {
		t.Fatalf("1000 ids beyond the burst wait %v, want 500ms", d)
	}
	if d := th.lockCommandDelay(c2, 1); d != 0 {
		t.Fatalf("another connection waited %v", d)
	}
	c.t = c.t.Add(time.Minute)
	if d := th.lockCommandDelay(c1, 1); d != 0 {
		t.Fatalf("after a quiet minute: %v", d)
	}
	for range 4 {
		th.lockCommandDone(c1, true)
	}
	if d := th.lockCommandDelay(c1, 1); d != 8*time.Millisecond {
		t.Fatalf("after 4 malformed commands the next waits %v, want 8ms", d)
	}
	for range 30 {
		th.lockCommandDone(c1, true)
	}
	if d := th.lockCommandDelay(c1, 1); d != maxStrikeDelay {
		t.Fatalf("after many malformed commands: %v, want the cap %v", d, maxStrikeDelay)
	}
	for range 6 {
		th.lockCommandDone(c1, false)
	}
	if d := th.lockCommandDelay(c1, 1); d != 0 {
		t.Fatalf("after good commands the wait is still %v", d)
	}
}

// TestResolveCooldown: after a resolution of its write runs out of time, a
// connection's writes that need another one are refused at once for a
// cool-down that doubles while they keep running out, and ends with one
// that finishes in time.
func TestResolveCooldown(t *testing.T) {
	c := &stepClock{t: time.Unix(1000, 0)}
	th := newThrottle(c.now)
	c1, c2 := &proxy.ClientInfo{ID: 1}, &proxy.ClientInfo{ID: 2}
	if d := th.resolveCooling(c1); d != 0 {
		t.Fatalf("cooling %v before anything happened", d)
	}
	th.resolveDone(c1, true, 2*time.Second)
	if d := th.resolveCooling(c1); d != 2*time.Second {
		t.Fatalf("cooling %v after a timeout, want 2s", d)
	}
	if d := th.resolveCooling(c2); d != 0 {
		t.Fatalf("another connection cools %v", d)
	}
	c.t = c.t.Add(2 * time.Second)
	th.resolveDone(c1, true, 2*time.Second)
	if d := th.resolveCooling(c1); d != 4*time.Second {
		t.Fatalf("cooling %v after a second timeout, want 4s", d)
	}
	for range 10 {
		th.resolveDone(c1, true, 2*time.Second)
	}
	if d := th.resolveCooling(c1); d != resolveCooldownMax {
		t.Fatalf("cooling %v, want the cap %v", d, resolveCooldownMax)
	}
	th.resolveDone(c1, false, 2*time.Second)
	if d := th.resolveCooling(c1); d != 0 {
		t.Fatalf("cooling %v after a resolution in time", d)
	}
}

// TestThrottleStateEndsWithConnection: a connection's throttle state is
// let go with the connection. Kept in a table of its own keyed by
// connection id, it outlived the connection (up to 65,536 of them, about
// 11 MiB on a proxy serving short connections).
func TestThrottleStateEndsWithConnection(t *testing.T) {
	th := newThrottle(time.Now)
	var gone []weak.Pointer[connThrottle]
	for i := range 64 {
		c := &proxy.ClientInfo{ID: uint64(i + 1)}
		th.lockCommandDone(c, true)
		if th.lockCommandDelay(c, 1) == 0 {
			t.Fatal("a malformed lock command left no strike")
		}
		gone = append(gone, weak.Make(th.peek(c)))
	}
	// The connections are unreachable now; their states must be too.
	runtime.GC()
	runtime.GC()
	kept := 0
	for _, w := range gone {
		if w.Value() != nil {
			kept++
		}
	}
	// The throttle itself lives on, as in a running guard.
	runtime.KeepAlive(th)
	if kept > 0 {
		t.Fatalf("%d of %d closed connections' throttle states are still reachable", kept, len(gone))
	}
}
