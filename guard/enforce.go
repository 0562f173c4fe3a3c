package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
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
	// The rule of each write, looked up once for the decision and the
	// audit line; nothing is allocated for a command that writes only
	// where nothing is protected.
	var rules []policy.Rule
	var v *verdict
	off := 0
	for i, w := range writes {
		// The connection's own copy of the rule, shared, not copied
		// (ruleRef): the usual write of one namespace points at it.
		rr := g.ruleRef(pol, req, w.NS.String())
		if rr[0].Mode == policy.Off {
			off++
		}
		if rules == nil {
			if rr[0].Mode == policy.Off {
				continue
			}
			v = newVerdict(req, start)
			if len(writes) == 1 {
				rules = rr
				continue
			}
			rules = make([]policy.Rule, i, len(writes))
			for j := range rules {
				rules[j] = g.ruleRef(pol, req, writes[j].NS.String())[0]
			}
		}
		rules = append(rules, rr[0])
	}
	if rules == nil {
		return proxy.Decision{Action: proxy.Forward}
	}
	v.Checked = v.CheckedBuf[:0]
	switch {
	case off == 0:
		v.Writes, v.Rules = writes, rules
	case off < len(writes):
		for i, w := range writes {
			if rules[i].Mode != policy.Off {
				v.Writes, v.Rules = append(v.Writes, w), append(v.Rules, rules[i])
			}
		}
	}
	if len(v.Writes) == 0 {
		return proxy.Decision{Action: proxy.Forward}
	}
	// Where the database requires authentication, a connection that has
	// not authenticated may write nothing and holds no lock. Its enforced
	// writes are refused before any lock is looked at, so that no answer
	// depends on one: an insert of a locked _id would otherwise be refused
	// here and one of a free _id by the database, telling which is locked.
	if g.authority.Required() && req.Client.User() == "" {
		for i, w := range v.Writes {
			if v.Rules[i].Mode == policy.Enforce {
				v.Add(v.Rules[i], w, refuse.ReasonUnauthenticated, nil, "this connection has not authenticated, and the database requires it, so it holds no lock")
				return g.decider.Decide(req, pol, v, &v.Verdict, start)
			}
		}
	}
	if d, ok := g.schemes.Enforce(ctx, req, pol, writes, rules, start); ok {
		return d
	}

	o, hasSession := g.writeOwner(req, v)
	var deferred []int // writes whose documents must be resolved first
	need := enforce.Needs(v.needBuf[:0])
	var inserts enforce.Needs
	for i, w := range writes {
		r := &rules[i] // by pointer: a rule is too large to copy on every call
		if r.Mode == policy.Off {
			continue
		}
		switch w.Kind {
		case policy.KindCollectionWrite:
			if !r.AllowCollectionWrites {
				v.Add(*r, w, reasonCollectionWrite, nil, fmt.Sprintf("%s replaces or removes documents wholesale, which the policy does not allow on %s (allowCollectionWrites is false)", w.What, w.NS))
			}
		case policy.KindInsert:
			v.fenceWrite(r, w, nil)
			if g.cappedInsertRefused(ctx, v, *r, w) {
				continue
			}
			if r.Inserts == policy.InsertsRequireUnlocked {
				id, found, certain := policy.InsertID(w)
				switch {
				case !certain:
					v.Add(*r, w, reasonUnclassifiable, nil, "the inserted document's _id cannot be told with certainty (it appears twice)")
				case found:
					// A value that cannot be an _id names no lock, and
					// the database refuses the insert itself.
					if did, err := idCopy(id); err == nil {
						if r.Implicit() {
							v.implicitPlan().inserts.Add(w.NS.String(), r, did)
						} else {
							inserts.Add(w.NS.String(), r, did)
						}
					}
				}
			}
		default:
			if !hasSession && !r.Implicit() {
				v.Add(*r, w, refuse.ReasonNoSession, nil, "the command carries no logical session (lsid), so it cannot hold locks")
				continue
			}
			if w.Upsert && g.cappedInsertRefused(ctx, v, *r, w) {
				continue
			}
			ids, ok, later := g.targets(ctx, v, r, w, false)
			if later {
				deferred = append(deferred, i)
				continue
			}
			if !ok {
				continue
			}
			v.fenceWrite(r, w, ids)
			need.Add(w.NS.String(), r, ids...)
		}
	}
	g.checker.Needs(ctx, v, &v.Verdict, o, need)
	// Statements whose filter names no _id are resolved last, and only
	// while the command can still be allowed: a query for the documents
	// they match is the expensive part, and pointless once anything in the
	// command is refused.
	if len(deferred) > 0 {
		if v.EnforcedViolation() {
			g.targeting.Skipped(len(deferred))
		} else {
			var resolved enforce.Needs
			for _, i := range deferred {
				ids, ok, _ := g.targets(ctx, v, &rules[i], writes[i], true)
				if ok {
					v.fenceWrite(&rules[i], writes[i], ids)
					resolved.Add(writes[i].NS.String(), &rules[i], ids...)
				}
			}
			g.checker.Needs(ctx, v, &v.Verdict, o, resolved)
		}
	}
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
		return g.settleImplicit(v, g.decider.Decide(req, pol, v, &v.Verdict, start))
	}
	return g.decider.Decide(req, pol, v, &v.Verdict, start)
}

// cappedInsertRefused records a violation for an insert, or an upsert that
// may insert, into a capped collection (enforce.Targets.Capped).
func (g *Guard) cappedInsertRefused(ctx context.Context, v *verdict, r policy.Rule, w policy.Write) bool {
	reason, detail := g.targeting.Capped(ctx, &r, w)
	if reason == "" {
		return false
	}
	v.Add(r, w, reason, nil, detail)
	return true
}

// targets returns the ids whose locks write w needs (enforce.Targets.Of)
// and records on v what it found: the ids the request names, the pin of
// a resolved statement, the resolution's time, the violation that stops
// the write. later: w must be resolved, and resolve was false.
func (g *Guard) targets(ctx context.Context, v *verdict, r *policy.Rule, w policy.Write, resolve bool) (_ []docid.ID, ok, later bool) {
	x := g.targeting.Of(ctx, v.Req, r, w, resolve, len(v.Violations) > 0 && v.Blocked(w.NS.String()), v.PinBuf[:0])
	if x.Pinned != nil {
		if v.Named == nil {
			v.Named = slices.Clip(x.Pinned) // shared until appended to
		} else {
			v.Named = append(v.Named, x.Pinned...)
		}
	}
	if x.HasUpserted {
		v.Named = append(v.Named, x.Upserted)
	}
	if x.Resolved {
		v.Now = time.Time{} // read again after the resolution (flightLocks)
		v.ResolveSpent += x.Spent
	}
	if x.Pins {
		v.Pins = append(v.Pins, x.Pin)
	}
	if x.Reason != "" {
		v.Add(*r, w, x.Reason, nil, x.Detail)
		v.Violations[len(v.Violations)-1].Advice = x.Advice
	}
	return x.IDs, x.OK, x.Later
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
	return g.decider.Decide(req, pol, v, &v.Verdict, start)
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

// idCopy is enforce.IDCopy.
func idCopy(v bsoncore.Value) (docid.ID, error) { return enforce.IDCopy(v) }

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
