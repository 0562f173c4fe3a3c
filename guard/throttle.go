package guard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Per-connection throttling of the work a client makes the proxy do on its
// behalf, so that a hostile or broken client cannot take the lock store or
// the resolver from everyone else. Each connection is served one request at
// a time, so a delay here holds back only that connection (its unread
// requests wait in its socket), never another one.
const (
	// idsPerSecond and idsBurst: the lock store work one connection's lock
	// commands may ask for, in ids (each id is a lock record to read or
	// change). Applications lock a handful of ids per command and never
	// notice; a client pipelining status checks of thousands of ids is
	// slowed to this pace.
	idsPerSecond = 2000
	idsBurst     = 2 * DefaultMaxLockIDs
	// maxStrikeDelay bounds the delay before the next lock command of a
	// connection whose lock commands keep being malformed; the delay
	// doubles with each malformed one from 1 ms and halves with each good one.
	maxStrikeDelay = time.Second
	// resolveCooldownMax bounds how long, after a resolution of one of its
	// writes ran out of time, a connection's writes that would need another
	// one are refused at once (the cool-down doubles from ResolveTimeout
	// while they keep running out).
	resolveCooldownMax = time.Minute
)

// throttle keeps each connection's state in the connection's own state
// (connState.throttle), not in a table of its own: it then ends with the
// connection. A table keyed by connection id, bounded by count, kept the
// state of up to 65,536 connections long closed (about 11 MiB on a proxy
// serving short connections), and forgot the least recently seen first,
// so that a client opening enough connections could push out the strikes
// of its own live one.
type throttle struct {
	now func() time.Time
}

type connThrottle struct {
	mu        sync.Mutex
	tokens    float64   // ids left in the bucket
	refilled  time.Time // last refill
	strikes   int       // malformed lock commands, net of good ones
	coolUntil time.Time // unpinned writes refused until then
	cooldown  time.Duration
	slow      bool // a resolution of its writes ran out of time once
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now}
}

// of returns c's throttle state, made on its first use.
func (t *throttle) of(c *proxy.ClientInfo) *connThrottle {
	st := localState(c)
	if ct := st.throttle.Load(); ct != nil {
		return ct
	}
	ct := &connThrottle{tokens: idsBurst, refilled: t.now()}
	if !st.throttle.CompareAndSwap(nil, ct) {
		return st.throttle.Load()
	}
	return ct
}

// peek returns c's throttle state, nil if it never needed one.
func (t *throttle) peek(c *proxy.ClientInfo) *connThrottle {
	if st, _ := c.Local().(*connState); st != nil {
		return st.throttle.Load()
	}
	return nil
}

// beforeLockCommand waits until connection conn may run a lock command on
// ids ids: the ids must be in its bucket, and a connection with malformed
// commands behind it waits its strike delay. It returns false when ctx
// ends first.
func (t *throttle) beforeLockCommand(ctx context.Context, conn *proxy.ClientInfo, ids int) bool {
	wait := t.lockCommandDelay(conn, ids)
	if wait <= 0 {
		return true
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// lockCommandDelay takes ids from conn's bucket and returns how long its
// lock command must wait first.
func (t *throttle) lockCommandDelay(conn *proxy.ClientInfo, ids int) time.Duration {
	ct := t.of(conn)
	ct.mu.Lock()
	defer ct.mu.Unlock()
	now := t.now()
	ct.tokens = min(idsBurst, ct.tokens+now.Sub(ct.refilled).Seconds()*idsPerSecond)
	ct.refilled = now
	need := float64(max(ids, 1))
	var wait time.Duration
	if ct.tokens < need {
		wait = time.Duration((need - ct.tokens) / idsPerSecond * float64(time.Second))
	}
	ct.tokens -= need // may go negative: the wait pays it back
	if ct.strikes > 0 {
		wait = max(wait, min(maxStrikeDelay, time.Millisecond<<min(ct.strikes-1, 20)))
	}
	return wait
}

// lockCommandDone records whether a lock command was well formed.
func (t *throttle) lockCommandDone(conn *proxy.ClientInfo, malformed bool) {
	ct := t.of(conn)
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if malformed {
		ct.strikes = min(ct.strikes+1, 30)
	} else {
		ct.strikes /= 2
	}
}

// resolveCooling reports how long connection conn's unpinned writes are
// still refused without a resolution, or 0.
func (t *throttle) resolveCooling(conn *proxy.ClientInfo) time.Duration {
	ct := t.peek(conn)
	if ct == nil {
		return 0
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return max(ct.coolUntil.Sub(t.now()), 0)
}

// resolveDone records the outcome of a resolution of conn's write: one that
// ran out of time starts (or doubles) the cool-down; one that finished in
// time ends it.
func (t *throttle) resolveDone(conn *proxy.ClientInfo, timedOut bool, timeout time.Duration) {
	ct := t.of(conn)
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if !timedOut {
		ct.cooldown, ct.coolUntil = 0, time.Time{}
		return
	}
	ct.slow = true
	ct.cooldown = min(max(2*ct.cooldown, timeout), resolveCooldownMax)
	ct.coolUntil = t.now().Add(ct.cooldown)
}

// resolveCooling is how long req's connection is still in its cool-down.
func (g *Guard) resolveCooling(req *proxy.Request) time.Duration {
	if req == nil || req.Client == nil {
		return 0
	}
	return g.throttle.resolveCooling(req.Client)
}

// resolveOutcome feeds an enforced write's resolution to its connection's
// cool-down.
func (g *Guard) resolveOutcome(req *proxy.Request, r policy.Rule, err error) {
	if req == nil || req.Client == nil || r.Mode != policy.Enforce || errors.Is(err, enforce.ErrResolveSkipped) {
		return
	}
	timedOut := errors.Is(err, context.DeadlineExceeded) || enforce.IsMaxTimeExpired(err)
	g.throttle.resolveDone(req.Client, timedOut, g.opts.ResolveTimeout)
}

// tarpitDelay is how long a refusal during a cool-down is held back: the
// refusal costs nothing to make, so without it a client that keeps sending
// such writes would take the proxy's CPU by sheer volume.
const tarpitDelay = 500 * time.Millisecond

// tarpit holds back req's refusal during its connection's cool-down.
func (g *Guard) tarpit(ctx context.Context, req *proxy.Request) {
	d := min(g.resolveCooling(req), tarpitDelay)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// resolveSlotsFor is the semaphore req's resolution waits on: connections
// whose filters have run out of time before share one slot, so that
// however many of them there are, they keep at most one resolution
// running and leave the others' slots (and the database) to everyone else.
func (g *Guard) resolveSlotsFor(req *proxy.Request) chan struct{} {
	if req == nil || req.Client == nil {
		return g.resolveSlots
	}
	ct := g.throttle.peek(req.Client)
	if ct == nil {
		return g.resolveSlots
	}
	ct.mu.Lock()
	slow := ct.slow
	ct.mu.Unlock()
	if slow {
		return g.slowResolveSlot
	}
	return g.resolveSlots
}
