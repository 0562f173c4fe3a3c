package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/reqplan"
	"github.com/lockgate/lockgate/guard/txn"
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
	return g.walk.Run(ctx, req, pol, writes, start)
}

// newWalk builds enforcement's walk over a request's writes from the
// guard's parts.
func (g *Guard) newWalk() *enforce.Walk[*verdict] {
	return &enforce.Walk[*verdict]{Targets: g.targeting, Checker: g.checker, AuthRequired: g.authority.Required,
		Rules: g.ruleRef,
		New: func(req *proxy.Request, start time.Time) (*verdict, *enforce.Verdict) {
			v := newVerdict(req, start)
			return v, &v.Verdict
		},
		Schemes: g.schemes.Enforce, Owner: g.writeOwner, Fence: (*verdict).fenceWrite,
		ImplicitInsert: func(v *verdict, ns string, r *policy.Rule, id docid.ID) { v.implicitPlan().inserts.Add(ns, r, id) },
		Finish:         g.finish, Decide: g.decide}
}

// finish decides a write whose locks enforcement checked
// (enforce.Walk.Finish): the implicit locks are taken, the inserts
// checked, the fence's inserts stamped and a transaction's statement
// recorded before the decision.
func (g *Guard) finish(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *verdict, o lockstore.Owner, hasSession bool, inserts enforce.Needs, start time.Time) proxy.Decision {
	if v.implicit != nil {
		// Taking implicit locks can wait for them: their lease left is
		// counted from after the wait (flightLocks reads the clock).
		v.Now = time.Time{}
	}
	inserts = g.takeImplicit(ctx, v, o, inserts)
	for _, n := range inserts {
		g.checkInsertable(ctx, v, *n.Rule, o, n.NS, n.IDs)
	}
	if !v.EnforcedViolation() && (v.implicit == nil || v.implicit.taken == nil) {
		g.fenceInserts(ctx, v, o, hasSession)
	}
	if hasSession {
		v.InTxn = txn.In(req.Command)
	}
	if v.InTxn && !v.EnforcedViolation() {
		g.recordTxn(ctx, req, v, o, inserts)
	}
	g.settleResolutions(v)
	if v.implicit != nil {
		return g.settleImplicit(v, g.decide(req, pol, v, start))
	}
	return g.decide(req, pol, v, start)
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
func (g *Guard) confirmedStatus(ctx context.Context, o lockstore.Owner, ns string, ids []docid.ID) ([]lockstore.Status, error) {
	return g.locks.ConfirmedStatus(ctx, o, ns, ids)
}

// checkInsertable refuses inserts of _ids another session has locked
// (enforce.Locks.Insertable).
func (g *Guard) checkInsertable(ctx context.Context, v *verdict, r policy.Rule, o lockstore.Owner, ns string, ids []docid.ID) {
	x, checked := g.locks.Insertable(ctx, o, &r, v.FirstWrite(ns), ids)
	if !checked {
		g.metrics.insertChecks.WithLabelValues("skipped").Inc()
		return
	}
	g.metrics.insertChecks.WithLabelValues("checked").Inc()
	if x != nil {
		v.Violations = append(v.Violations, *x)
	}
}

// unclassifiable handles a message that may write but cannot be read with
// certainty: refused where its namespace is enforced.
func (g *Guard) unclassifiable(req *proxy.Request, pol *policy.Policy, err error, start time.Time) proxy.Decision {
	ns := "*"
	var ce *policy.ClassifyError
	if errors.As(err, &ce) && !ce.NS.IsZero() {
		ns = ce.NS.String()
	} else if req.Command != nil {
		ns = req.Command.DB + ".*"
	}
	r := pol.Lookup(ns)
	if r.Mode == policy.Off {
		return proxy.Decision{Action: proxy.Forward}
	}
	v := &verdict{}
	w := policy.Write{NS: namespace.Of(ns)}
	v.Add(r, w, reasonUnclassifiable, nil, fmt.Sprintf("the proxy cannot tell with certainty what it writes (%v)", err))
	return g.decide(req, pol, v, start)
}

// allowed is an allowed write's decision (enforce.Decider.Launch): its
// pins and fences, and its flight.
func (g *Guard) allowed(req *proxy.Request, pol *policy.Policy, v *verdict, now time.Time) proxy.Decision {
	if v.fence != nil {
		d, fences := g.fenceDecision(req, v)
		return g.launchDecision(req, pol, v, d, policy.Edit{Pins: v.Pins, Fences: fences}, now)
	}
	return g.launchDecision(req, pol, v, proxy.Decision{Action: proxy.Forward}, policy.Edit{Pins: v.Pins}, now)
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
	if g.authority.MayDisclose(ctx, req, x.Write.NS.String()) {
		return x
	}
	return enforce.Undisclosed(x)
}

// refusal renders an enforced violation as the command's error
// (enforce.Refusal).
func refusal(req *proxy.Request, x enforce.Violation) *refuse.Error { return enforce.Refusal(req, x) }

// writeOwner is the lock owner a write acts as: its session, and the
// binding it names, if any, in its comment: "lockgate:<bind>" (a string,
// which every server accepts), or {lockgate: "<bind>"}.
func (g *Guard) writeOwner(req *proxy.Request, v *verdict) (lockstore.Owner, bool) {
	if req.Command == nil {
		return lockstore.Owner{}, false
	}
	session, ok := req.Command.SessionID()
	if !ok {
		return lockstore.Owner{}, false
	}
	v.LSID = session // for the audit line
	bind := enforce.Binding(req.Command)
	o, flights := g.ownerAndFlights(req, session, bind)
	v.Flights = flights
	return o, true
}

// mayRead is enforce.Targets.MayRead, for the units given it.
func (g *Guard) mayRead(ctx context.Context, req *proxy.Request, ns string) string {
	return g.targeting.MayRead(ctx, req, ns)
}

// errResolveSkipped: an audited write found no free resolver slot.
var errResolveSkipped = enforce.ErrResolveSkipped

// resolve is enforce.Targets.Resolve, for the units given it.
func (g *Guard) resolve(ctx context.Context, slots chan struct{}, r policy.Rule, w policy.Write, limit int) ([]docid.ID, time.Duration, error) {
	return g.targeting.Resolve(ctx, slots, r, w, limit)
}

// isMaxTimeExpired is enforce.IsMaxTimeExpired.
func isMaxTimeExpired(err error) bool { return enforce.IsMaxTimeExpired(err) }
