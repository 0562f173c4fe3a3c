package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Leases cover the writes in flight (docs/ENFORCEMENT.md, "Writes in
// flight"). An enforced write is forwarded only while its locks surely have
// more than the rule's margin of lease left, measured when the check
// answered and checked again by the proxy just before the bytes leave; it
// carries maxTimeMS no greater than that lease minus the margin, counted
// by the proxy from that same reading (launchDecision), so the database
// stops working on it before the lease could end; and until its
// reply arrives this proxy keeps its locks from lapsing (renewing them) and
// keeps releases of its session waiting.

// flightPlan is what an allowed enforced write holds, gathered by holds:
// its flight (inflight.Flight: the owner, the locks, the lease left at the
// check) and what its launch needs. Once launched it is the request's
// ReplyHook (its flight's) and LateReplier.
type flightPlan struct {
	inflight.Flight
	// The earliest lease surely ends endIn after at, in local monotonic
	// time: an offset, not the end itself, so that the usual write's
	// launch adds to a time once (its deadline), not twice (time.Time's
	// Add costs tens of instructions).
	at     time.Time
	endIn  time.Duration
	margin time.Duration // the largest margin of the rules involved
	// implicit, when set, are implicit locks the proxy took for this
	// write alone: released when it lands (implicit.go).
	implicit *implicitPlan
	// guarded: Locks are a holder's locks, checked after the tracker's
	// ForceSeq read forceSeq; the launch is refused if a force-release
	// of one of them was under way at any moment since.
	// Implicit locks are covered by Took instead.
	guarded  bool
	forceSeq uint64
	// lockBuf is Locks' room for the usual one namespace, so that the
	// plan is one allocation.
	lockBuf [1]inflight.NSIDs

	g *Guard
	// v and pol are the decision the plan was launched from
	// (launchDecision), for its late reply; v is nil otherwise.
	v   *verdict
	pol *policy.Policy
	// recycle: v goes back to the guard's spares once the flight lands,
	// for a next write: set only when nothing but the flight points into
	// v, and acted on only if the flight lands by its reply before any
	// renewal started (Landed).
	recycle bool
}

// flightLocks adds the locks of ns to the write's plan. The lease end is
// counted from v.now, read before the lock store measured left: earlier
// than the truth, so the deadline and maxTimeMS can only come out short
// (by the resolver's cached collation or capped checks at most; v.now is
// cleared after anything that can wait longer: a resolution, implicit
// locks).
// The flight keeps a copy of o, the caller's.
func (v *verdict) flightLocks(o lockstore.Owner, r *policy.Rule, ns namespace.Namespace, ids []docid.ID, left time.Duration) {
	if v.flight == nil {
		v.flightBuf.SetOwner(o)
		v.flightLocksSince(v.flightBuf.Owner, r, ns, ids, left, false, 0)
		return
	}
	v.flightLocksSince(v.flight.Owner, r, ns, ids, left, false, 0)
}

// flightLocksSince is flightLocks for a lock holder's locks when guarded,
// checked after the tracker's forceSeq read seq: the first check's seq is
// the earliest, and so covers those that follow. The flight shares o,
// the walk's owner, which no one writes to (Walk.Owner) and which the
// verdict, the flight's home, outlives.
func (v *verdict) flightLocksSince(o *lockstore.Owner, r *policy.Rule, ns namespace.Namespace, ids []docid.ID, left time.Duration, guarded bool, seq uint64) {
	if v.Now.IsZero() {
		v.Now = time.Now()
	}
	f := v.flight
	if f == nil {
		// The usual write's plan lives in its verdict (already one
		// allocation); the flight keeps the verdict until it lands.
		f = &v.flightBuf
		v.flight = f
		f.Owner, f.at, f.endIn, f.Left = o, v.Now, left, left
		f.Session = v.Flights // checked against o by the launch
		f.Locks = f.lockBuf[:0]
	} else if end := v.Now.Sub(f.at) + left; end < f.endIn {
		f.endIn = end
	}
	if guarded && !f.guarded {
		f.guarded, f.forceSeq = true, seq
	}
	f.Left = min(f.Left, left)
	f.margin = max(f.margin, r.LeaseMargin)
	f.Locks.Add(ns, ids)
}

// deadline is when the write's earliest lease, less the largest margin,
// surely ends.
func (p *flightPlan) deadline() time.Time { return p.at.Add(p.endIn - p.margin) }

// launch registers a write as in flight and returns it as the hook of the
// decision (chaining the hook already there).
func (g *Guard) launch(p *flightPlan, maxTime time.Duration, next proxy.ReplyHook) *flightPlan {
	return g.launchAt(p, time.Now(), maxTime, next)
}

// launchAt is launch with the time read by the caller: the flight starts
// at now, which must not be later than the write leaves; maxTime, if not
// 0, is how long from now the database may run it. It returns nil,
// launching nothing, for a guarded plan whose locks an operator's
// force-release may have freed since they were checked.
func (g *Guard) launchAt(p *flightPlan, now time.Time, maxTime time.Duration, next proxy.ReplyHook) *flightPlan {
	p.g = g
	if !g.flights.Launch(&p.Flight, p, p.guarded, p.forceSeq, now, maxTime, next) {
		return nil
	}
	return p
}

// LateReply implements proxy.LateReplier: the refusal of a write whose
// lease, less the margin, would end before its bytes could leave. It is
// built from the request, so the proxy calls it while the request is its
// own, before the flight lands.
func (f *flightPlan) LateReply() bsoncore.Document {
	w := f.v.Writes[0]
	x := enforce.Violation{Write: w, Rule: f.pol.Lookup(w.NS), Reason: enforce.ReasonNotLocked,
		Detail: fmt.Sprintf("this session's lock had less than the policy's margin of %s (policy.leaseMarginMS) of lease left when the write was about to leave for the database; renew it with renewLock", lockstore.FormatMS(f.margin))}
	if f.implicit != nil {
		// A writer that holds no lock has nothing to renew: its implicit
		// lock's lease ran out while lockgate waited (for the lock, the
		// lock store or the audit trail).
		x.Detail = fmt.Sprintf("this session holds no lock, and the implicit lock lockgate took for this write had less than the policy's margin of %s (policy.leaseMarginMS) of its lease left when the write was about to leave for the database", lockstore.FormatMS(f.margin))
		x.Advice = "nothing was written: retry"
	}
	f.g.trailRefusedAtLaunch(f.v.Req, f.pol, f.v, &x)
	return refusal(f.v.Req, x).Document()
}

// Landed implements inflight.Lander: the write's implicit locks are
// released, and an answered flight that nothing else can reach any more
// hands its verdict back to the guard's spares.
func (f *flightPlan) Landed(answered, reusable bool) {
	if f.implicit != nil {
		f.g.releaseImplicit(f.implicit)
	}
	if answered && reusable && f.recycle {
		f.g.putVerdict(f.v)
	}
}

// WaitWritesOn blocks, at most OrderTimeout, until no enforced write that
// this proxy forwarded under the lock on (ns, id) is still unanswered. An
// operator's force-release calls it first, so that it does not free a lock
// under a write that is still running.
func (g *Guard) WaitWritesOn(ctx context.Context, ns namespace.Namespace, id docid.ID) error {
	ctx, cancel := context.WithTimeout(ctx, g.opts.OrderTimeout)
	defer cancel()
	return g.flights.WaitKey(ctx, ns, id)
}

// BeginForceRelease is an operator's force-release of (ns, id) on this
// proxy: it marks it under way, so that a legacy write whose implicit lock
// on it is being taken meanwhile is refused rather than left to write
// under a lock the force-release frees, then waits as WaitWritesOn. done
// must be called once the lock store's force-release has returned (also
// after an error).
func (g *Guard) BeginForceRelease(ctx context.Context, ns namespace.Namespace, id docid.ID) (done func(), err error) {
	done = g.flights.Forcing(ns, id)
	return done, g.WaitWritesOn(ctx, ns, id)
}

// launchDecision turns d, an allowed enforced write's decision, into its
// flight, in place: it is forwarded only before its lease, less the
// margin, could end, it carries maxTimeMS capped at what is left of that
// when its bytes leave, and it is tracked until answered. The guard reads no clock for it: now is the
// decision's end (read before its audit record was made durable, which
// can block), an upper bound of the time left when the write leaves. The
// cap joins ed, the write's pins and fences, so that the message is
// edited and encoded once (guard/edit.go), with a value counted from now;
// the proxy lowers it in place by its own clock reading immediately
// before the bytes leave (proxy.Decision.Leave, at d.MaxTime), and
// refuses the write as late there if less than a millisecond is left.
func (g *Guard) launchDecision(req *proxy.Request, pol *policy.Policy, v *verdict, d *proxy.Decision, ed *policy.Edit, now time.Time) {
	if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
		return
	}
	p := v.flight
	if p == nil {
		g.edit(req, pol, v, d, ed, false)
		return
	}
	p.v, p.pol, p.g = v, pol, g // LateReply reads all three, also before launchAt
	deadline := p.deadline()
	budget := deadline.Sub(now)
	// Under a millisecond is late too: the least maxTimeMS a server takes
	// is 1, which would let the write run past the lease by the rest of
	// that millisecond (a margin of 0 is allowed). Late already at now,
	// it is late when it would leave.
	if budget < time.Millisecond {
		if d.OnReply != nil {
			d.OnReply.Abandon()
		}
		*d = proxy.Decision{Action: proxy.Reply, Reply: p.LateReply()}
		return
	}
	// What the database may still run it for, counted from now: until the
	// deadline, whatever maxTimeMS it leaves with (the proxy's is counted
	// from later, and a client's smaller one from its own sending). An
	// abandoned flight stays until then.
	var maxTime time.Duration
	if req.Command != nil && !v.InTxn {
		ed.MaxTimeMS = budget.Milliseconds()
		maxTime = budget
	}
	// Nothing but the flight will point into the verdict: it may go back
	// to the guard's spares when the flight lands, and its message
	// buffer with it.
	recycle := p == &v.flightBuf && d.OnReply == nil && v.implicit == nil && v.fence == nil && !v.InTxn
	if !g.edit(req, pol, v, d, ed, recycle) {
		return
	}
	if recycle {
		p.recycle = true
	}
	if g.launchAt(p, now, maxTime, d.OnReply) == nil {
		if d.OnReply != nil {
			d.OnReply.Abandon()
		}
		g.log.Info("refused a write whose lock an operator force-released after it was checked", zap.String("ns", v.Writes[0].NS.String()))
		*d = proxy.Decision{Action: proxy.Reply, Reply: g.forcedRefusal(req, pol, v)}
		return
	}
	if p.Session != v.Flights {
		keepFlights(req, p.Owner.Session, p.Session) // for the session's next write
	}
	d.Deadline = deadline
	d.LateReply, d.OnReply = p, p
	if p.implicit != nil {
		p.implicit.launched = true
		// The flight stands for the write now.
		g.flights.Unhold(&p.implicit.pending)
	}
}

// forcedRefusal is the refusal of a lock holder's write whose lock an
// operator force-released between its check and its launch.
func (g *Guard) forcedRefusal(req *proxy.Request, pol *policy.Policy, v *verdict) bsoncore.Document {
	w := v.Writes[0]
	x := enforce.Violation{Write: w, Rule: pol.Lookup(w.NS), Reason: enforce.ReasonNotLocked,
		Detail: "an operator force-released the lock on a document of this write while lockgate was checking it (after this session's lock was verified, before the write left for the database), so the write is refused",
		Advice: "nothing was written; the lock may be another session's by now: acquireLock it again before retrying"}
	g.trailRefusedAtLaunch(req, pol, v, &x)
	return refusal(req, x).Document()
}

// trailRefusedAtLaunch records in the audit trail the refusal of a write
// whose allow record was made already (its decision), but which was
// refused before it left for the database: its lease ran short, or an
// operator force-released its lock meanwhile. The trail then shows the
// allow record followed by this one, not an allowed write that never ran.
func (g *Guard) trailRefusedAtLaunch(req *proxy.Request, pol *policy.Policy, v *verdict, x *enforce.Violation) {
	if t := g.opts.Trail; t != nil {
		t.Append(g.trailEvent(req, pol, v, &x.Write, &x.Rule, x, enforce.DecisionReject, time.Time{}))
	}
}
