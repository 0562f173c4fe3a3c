package guard

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/reqplan"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// enforcementStage decides every request the stages before it passed,
// by the policy's rule for each namespace it writes; it settles them all.
type enforcementStage struct{ g *Guard }

func (s enforcementStage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	pol := s.g.policy.Load()
	if pol == nil || pol.AllOff() {
		return proxy.Decision{Action: proxy.Forward}, true
	}
	return s.g.enforce(ctx, req, pol), true
}

// enforce decides a message that may write under pol.
func (g *Guard) enforce(ctx context.Context, req *proxy.Request, pol *policy.Policy) proxy.Decision {
	start := time.Now()
	writes, err := reqplan.Of(req).Writes()
	if err != nil {
		return g.unclassifiable(req, pol, err, start)
	}
	if len(writes) == 0 {
		return proxy.Decision{Action: proxy.Forward}
	}
	// A verdict holds the connection's state until the decision is made
	// (newVerdict).
	defer releaseConn(req)
	return g.walk.Run(ctx, req, pol, writes, start)
}

// newWalk builds enforcement's walk over a request's writes from the
// guard's parts.
func (g *Guard) newWalk() *enforce.Walk[*verdict] {
	return &enforce.Walk[*verdict]{Targets: g.targeting, Checker: g.checker, Decider: g.decider,
		AuthRequired: g.authority.Required, Rules: ruleRef,
		New: func(req *proxy.Request, start time.Time) (*verdict, *enforce.Verdict) {
			v := newVerdict(&g.verdicts, req, start)
			return v, &v.Verdict
		},
		Schemes: g.schemes.Enforce, Owner: g.writeOwner, Fence: (*verdict).fenceWrite,
		ImplicitInsert: func(v *verdict, ns namespace.Namespace, r *policy.Rule, id docid.ID) {
			v.implicitPlan().inserts.Add(ns, r, id)
		},
		// The usual write has no implicit locks, no fence and no
		// resolution: each func below tells so by a field before it calls
		// what would find the same (takeImplicit, fenceInserts,
		// settleResolutions return at once then).
		Implicit: func(ctx context.Context, v *verdict, o *lockstore.Owner, inserts enforce.Needs) enforce.Needs {
			if v.implicit == nil {
				return inserts
			}
			// Taking implicit locks can wait for them: their lease left
			// is counted from after the wait (flightLocks reads the
			// clock).
			v.Now = time.Time{}
			return g.takeImplicit(ctx, v, o, inserts)
		},
		Checked: func(ctx context.Context, v *verdict, o *lockstore.Owner, hasSession bool) {
			if v.fence != nil && !v.EnforcedViolation() && (v.implicit == nil || v.implicit.taken == nil) {
				g.fenceInserts(ctx, v, o, hasSession)
			}
		},
		Txn: g.recordTxn,
		Settle: func(v *verdict) bool {
			if v.ResolveSpent > 0 {
				g.settleResolutions(v)
			}
			return v.implicit != nil
		},
		Decided: g.settleImplicit}
}

// decide is enforce.Decider.Decide for the guard's verdict.
func (g *Guard) decide(req *proxy.Request, pol *policy.Policy, v *verdict, start time.Time) proxy.Decision {
	return g.decider.Decide(req, pol, v, &v.Verdict, start)
}

// exactStrings is enforce.Targets.ExactStrings, for the units given it.
func (g *Guard) exactStrings(ctx context.Context, w policy.Write) bool {
	return g.targeting.ExactStrings(ctx, w)
}

// confirmedStatus is enforce.Locks.ConfirmedStatus, for the units given it.
func (g *Guard) confirmedStatus(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	return g.locks.ConfirmedStatus(ctx, o, ns, ids)
}

// unclassifiable decides a message that may write but cannot be read
// with certainty (enforce.Walk.Unclassifiable).
func (g *Guard) unclassifiable(req *proxy.Request, pol *policy.Policy, err error, start time.Time) proxy.Decision {
	v := &verdict{}
	return g.walk.Unclassifiable(req, pol, v, &v.Verdict, err, start)
}

// allowed is enforce.Decider.Launch: it makes d, a forward, an allowed
// write's decision: its pins and fences, and its flight. A closure over
// g, not the method value of a method: the method value's wrapper moved
// every argument one register along to put g first, on every write.
func (g *Guard) allowed() func(req *proxy.Request, pol *policy.Policy, v *verdict, now time.Time, d *proxy.Decision) {
	return func(req *proxy.Request, pol *policy.Policy, v *verdict, now time.Time, d *proxy.Decision) {
		ed := policy.Edit{Pins: v.Pins}
		if v.fence != nil {
			*d, ed.Fences = g.fenceDecision(req, v)
		}
		g.launchDecision(req, pol, v, d, &ed, now)
	}
}

// shownTo is x as req's caller may see it: a violation that names another
// holder (a lock held by another session, a locked insert, a scheme lock
// taken by someone else) loses the holder, in the detail document and in
// the message, unless the caller may read the namespace (authority.MayDisclose).
// enforce.Checker already leaves the holder out where it must; this is the one
// gate every refusal passes, whichever check made it. The decision has no
// context of its own (the locking schemes decide too), so the question,
// when the connection's verdict is not yet known, is bounded by
// OrderTimeout; the connection's end cancels it as well (Request.Ask).
func (g *Guard) shownTo(req *proxy.Request, x enforce.Violation) enforce.Violation {
	if x.Holder == nil || !g.authority.Required() {
		return x
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.OrderTimeout)
	defer cancel()
	if g.authority.MayDisclose(ctx, req, x.Write.NS) {
		return x
	}
	return enforce.Undisclosed(x)
}

// refusal renders an enforced violation as the command's error
// (enforce.Refusal).
func refusal(req *proxy.Request, x enforce.Violation) *refuse.Error { return enforce.Refusal(req, x) }

// mayRead is enforce.Targets.MayRead, for the units given it.
func (g *Guard) mayRead(ctx context.Context, req *proxy.Request, ns namespace.Namespace) string {
	return g.targeting.MayRead(ctx, req, ns)
}

// resolve is enforce.Targets.Resolve, for the units given it.
func (g *Guard) resolve(ctx context.Context, slots chan struct{}, r policy.Rule, w policy.Write, limit int) ([]docid.ID, time.Duration, error) {
	return g.targeting.Resolve(ctx, slots, r, w, limit)
}
