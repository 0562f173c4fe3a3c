package guard

import (
	"context"
	"errors"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

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
	// throttledConns bounds the connections whose state is kept; the least
	// recently seen are forgotten first.
	throttledConns = 1 << 16
)

type throttle struct {
	conns *lru.Cache[uint64, *connThrottle]
	now   func() time.Time
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
	c, _ := lru.New[uint64, *connThrottle](throttledConns)
	return &throttle{conns: c, now: now}
}

func (t *throttle) of(conn uint64) *connThrottle {
	ct, ok := t.conns.Get(conn)
	if !ok {
		ct = &connThrottle{tokens: idsBurst, refilled: t.now()}
		t.conns.Add(conn, ct)
	}
	return ct
}

// beforeLockCommand waits until connection conn may run a lock command on
// ids ids: the ids must be in its bucket, and a connection with malformed
// commands behind it waits its strike delay. It returns false when ctx
// ends first.
func (t *throttle) beforeLockCommand(ctx context.Context, conn uint64, ids int) bool {
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
func (t *throttle) lockCommandDelay(conn uint64, ids int) time.Duration {
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
func (t *throttle) lockCommandDone(conn uint64, malformed bool) {
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
func (t *throttle) resolveCooling(conn uint64) time.Duration {
	ct, ok := t.conns.Get(conn)
	if !ok {
		return 0
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return max(ct.coolUntil.Sub(t.now()), 0)
}

// resolveDone records the outcome of a resolution of conn's write: one that
// ran out of time starts (or doubles) the cool-down; one that finished in
// time ends it.
func (t *throttle) resolveDone(conn uint64, timedOut bool, timeout time.Duration) {
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
	return g.throttle.resolveCooling(req.Client.ID)
}

// resolveOutcome feeds an enforced write's resolution to its connection's
// cool-down.
func (g *Guard) resolveOutcome(req *proxy.Request, r policy.Rule, err error) {
	if req == nil || req.Client == nil || r.Mode != policy.Enforce || errors.Is(err, enforce.ErrResolveSkipped) {
		return
	}
	timedOut := errors.Is(err, context.DeadlineExceeded) || enforce.IsMaxTimeExpired(err)
	g.throttle.resolveDone(req.Client.ID, timedOut, g.opts.ResolveTimeout)
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
	ct, ok := g.throttle.conns.Get(req.Client.ID)
	if !ok {
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
