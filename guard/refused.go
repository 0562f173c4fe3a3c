package guard

import (
	"context"
	"net"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// The resolver's time spent on writes that were refused anyway is budgeted
// per caller. A resolution that ends in an allowed write bought that write
// and costs nothing here; one that ends in a refusal bought nothing, and a
// client that keeps sending such writes (a flooder, or a job retrying an
// unlocked updateMany in a loop) would otherwise keep a scan running on the
// database, and on the proxy's side of it, for as long as it sends. The
// cool-down of throttle.go only catches resolutions that run out of time;
// this catches the ones that finish in time and are refused.
//
// The budget is time, not a count, because what a resolution costs the
// database is the time its query runs: a refused write whose filter is
// answered from an index in a millisecond costs next to nothing, a
// collection scan of 200 ms costs 200 times more. The caller is the
// authenticated user, else the client's address (not the connection, which
// a flooder multiplies at will; and not the session, which it can make up).
const (
	// refusedBurst is the resolver time a caller may spend on refused
	// writes before it is throttled: a refuse-lock-retry cycle spends it
	// once per refusal (the retry, allowed, is free), so an application
	// needs 10 slow (200 ms) refusals back to back, or thousands of
	// indexed ones, to reach it.
	refusedBurst = 2 * time.Second
	// refusedRate is how fast the budget comes back: 100 ms of resolver
	// time per second, so that after its burst a caller can keep at most a
	// tenth of one resolution running on writes that are refused.
	refusedRate = 0.1
	// refusedDebt bounds how far in debt a caller can go: several of its
	// connections may start resolutions while it still has budget, and
	// the debt they leave is paid back before the next one, but never
	// takes longer than refusedDebt/refusedRate (20 s) to pay.
	refusedDebt = 2 * time.Second
	// refusedCallers bounds the callers whose budget is kept.
	refusedCallers = 1 << 14
)

// refusedBudget is the per-caller budget of resolver time spent on refused
// writes, a token bucket in nanoseconds of resolution.
type refusedBudget struct {
	callers *lru.Cache[string, *callerBudget]
	now     func() time.Time
	burst   time.Duration
	rate    float64 // seconds of budget per second
	debt    time.Duration
}

type callerBudget struct {
	mu       sync.Mutex
	left     time.Duration // may be negative: a debt
	refilled time.Time
}

func newRefusedBudget(now func() time.Time) *refusedBudget {
	c, _ := lru.New[string, *callerBudget](refusedCallers)
	return &refusedBudget{callers: c, now: now, burst: refusedBurst, rate: refusedRate, debt: refusedDebt}
}

// refill brings b up to date; b.mu is held.
func (r *refusedBudget) refill(b *callerBudget) {
	now := r.now()
	b.left = min(r.burst, b.left+time.Duration(float64(now.Sub(b.refilled))*r.rate))
	b.refilled = now
}

// wait reports how long caller must wait before its writes may be resolved
// again, or 0 while it has budget left.
func (r *refusedBudget) wait(caller string) time.Duration {
	b, ok := r.callers.Get(caller)
	if !ok {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r.refill(b)
	if b.left > 0 {
		return 0
	}
	return time.Duration(float64(-b.left)/r.rate) + time.Millisecond
}

// charge takes spent from caller's budget: resolver time that ended in a
// refusal.
func (r *refusedBudget) charge(caller string, spent time.Duration) {
	if spent <= 0 {
		return
	}
	b, ok := r.callers.Get(caller)
	if !ok {
		b = &callerBudget{left: r.burst, refilled: r.now()}
		if prev, found, _ := r.callers.PeekOrAdd(caller, b); found {
			b = prev // added by another connection of the caller meanwhile
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r.refill(b)
	b.left = max(b.left-spent, -r.debt)
}

// resolveCaller is whose budget req's resolutions are charged to: the
// authenticated user, else the client's host (without the port).
func resolveCaller(req *proxy.Request) string {
	if req == nil || req.Client == nil {
		return ""
	}
	if u := req.Client.User(); u != "" {
		return "user " + u
	}
	if a, ok := req.Client.RemoteAddr.(*net.TCPAddr); ok {
		return "address " + a.IP.String()
	}
	return "address " + req.Client.Addr
}

// refusedWait is how long req's caller is still out of budget.
func (g *Guard) refusedWait(req *proxy.Request) time.Duration {
	c := resolveCaller(req)
	if c == "" {
		return 0
	}
	return g.refused.wait(c)
}

// credit gives back to caller's budget resolver time that bought an
// allowed write, up to the burst: a refusal followed by the same write,
// allowed once its locks are taken, costs nothing in the end, however
// often an application goes round that cycle. A flooder can only buy
// refused resolution time with as much allowed resolution time, that is,
// with writes it holds the locks for.
func (r *refusedBudget) credit(caller string, spent time.Duration) {
	b, ok := r.callers.Get(caller)
	if !ok || spent <= 0 {
		return // a full budget, as far as anyone knows
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r.refill(b)
	b.left = min(r.burst, b.left+spent)
}

// settleResolutions charges the resolver time v spent to its caller when
// the command is refused, and credits it when it is allowed. A refusal
// because the lock store could not answer is the proxy's trouble, not the
// caller's, and is not charged.
func (g *Guard) settleResolutions(v *verdict) {
	if v.ResolveSpent <= 0 {
		return
	}
	c := resolveCaller(v.Req)
	if c == "" {
		return
	}
	for _, x := range v.Violations {
		if x.Rule.Mode == policy.Enforce {
			if x.Reason != refuse.ReasonUnavailable {
				g.refused.charge(c, v.ResolveSpent)
			}
			return
		}
	}
	g.refused.credit(c, v.ResolveSpent)
}

// holdRefusal holds back a refusal made without a resolution for up to
// tarpitDelay (or until budget is back): it costs nothing to make, so a
// client sending such writes back to back would otherwise take the
// proxy's CPU by volume. Only req's own connection waits.
func (g *Guard) holdRefusal(ctx context.Context, d time.Duration) {
	d = min(d, tarpitDelay)
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

// throttleHooks are the guard's throttle and refused-writes budget as
// enforcement's targets unit asks them (enforce.Throttle).
type throttleHooks struct{ g *Guard }

func (h throttleHooks) Cooling(req *proxy.Request) time.Duration       { return h.g.resolveCooling(req) }
func (h throttleHooks) Tarpit(ctx context.Context, req *proxy.Request) { h.g.tarpit(ctx, req) }
func (h throttleHooks) RefusedWait(req *proxy.Request) time.Duration   { return h.g.refusedWait(req) }
func (h throttleHooks) HoldRefusal(ctx context.Context, d time.Duration) {
	h.g.holdRefusal(ctx, d)
}
func (h throttleHooks) Slots(req *proxy.Request) chan struct{} { return h.g.resolveSlotsFor(req) }
func (h throttleHooks) Outcome(req *proxy.Request, r policy.Rule, err error) {
	h.g.resolveOutcome(req, r, err)
}
