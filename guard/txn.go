package guard

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/txn"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Enforcement's side of the transaction check (package txn): what an
// allowed statement's commit will need, read from its verdict, and the
// commit's launch as a write in flight.

// newTxnCheck builds the transaction check from the guard's parts.
func (g *Guard) newTxnCheck() *txn.Check {
	cfg := txn.Config{Policy: g.Policy, SessionKey: g.owners.Session, Owner: g.owner,
		LeaseMargin: func(req *proxy.Request, pol *policy.Policy, ns namespace.Namespace) time.Duration {
			return g.ruleFor(pol.Lookup(ns), req).LeaseMargin
		},
		Confirmed: g.confirmedStatus, LeaseLeft: g.leaseLeft, ForceSeq: g.flights.ForceSeq,
		Collated: func(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) string {
			return enforce.CommitCollated(ctx, g.targeting, g.locks, o, ns, ids)
		},
		Launch: g.launchCommit,
		Refused: func() {
			g.metrics.decisions.WithLabelValues("transaction", enforce.DecisionReject, txn.ReasonCommitNotCovered).Inc()
		},
		Checked: func() {
			if h := g.testCommitChecked; h != nil {
				h()
			}
		},
		Log: g.log}
	if ts, ok := g.opts.Store.(txn.Store); ok {
		cfg.Store = ts
	}
	return txn.New(cfg)
}

// recordTxn stores what the commit of a transaction statement allowed so
// far will need: the locks of its enforced writes, and the _ids it inserts
// where inserts require them unlocked. It runs before the statement is
// forwarded; a statement whose needs cannot be stored is refused.
func (g *Guard) recordTxn(ctx context.Context, req *proxy.Request, v *verdict, o *lockstore.Owner, inserts enforce.Needs) {
	var rec []lockstore.TxnNeed
	if f := v.flight; f != nil {
		for _, l := range f.Locks {
			if g.ruleOf(v, l.NS).Mode == policy.Enforce {
				rec = append(rec, lockstore.TxnNeed{NS: l.NS, Bind: o.Bind, Held: l.IDs})
			}
		}
	}
	for _, n := range inserts {
		if n.Rule.Mode == policy.Enforce && len(n.IDs) > 0 {
			rec = append(rec, lockstore.TxnNeed{NS: n.NS, Bind: o.Bind, Unlocked: n.IDs})
		}
	}
	// An upsert inserts its _id when nothing matches: the commit checks
	// it as an insert under a collation that is not simple (its own lock
	// passes the exact check), for a lock taken since on another spelling.
	for i, w := range v.Writes {
		if w.Kind == policy.KindInsert || !w.Upsert || i >= len(v.Rules) || v.Rules[i].Mode != policy.Enforce || v.Rules[i].Inserts != policy.InsertsRequireUnlocked {
			continue
		}
		if val, found, certain := policy.UpsertID(w); found && certain && enforce.StringBearing(val) {
			if id, err := enforce.IDCopy(val); err == nil {
				rec = append(rec, lockstore.TxnNeed{NS: w.NS, Bind: o.Bind, Unlocked: []docid.ID{id}})
			}
		}
	}
	if x := g.txns.Record(ctx, req, o.Session, rec); x != nil {
		v.Violations = append(v.Violations, enforce.Violation{Rule: g.ruleOf(v, x.NS), Write: v.FirstWrite(x.NS), Reason: x.Reason, Detail: x.Detail, Advice: x.Advice})
	}
}

// ruleOf is the rule enforce applied to ns in v.
func (g *Guard) ruleOf(v *verdict, ns namespace.Namespace) policy.Rule {
	for i, w := range v.Writes {
		if w.NS.String() == ns.String() && i < len(v.Rules) {
			return v.Rules[i]
		}
	}
	return policy.Rule{}
}

// launchCommit launches a covered commit as a write in flight (launch),
// guarded: a force-release of one of its locks since c.ForceSeq refuses
// it, and then nothing is launched.
func (g *Guard) launchCommit(c *txn.Commit, maxTime time.Duration, next proxy.ReplyHook) proxy.ReplyHook {
	plan := &flightPlan{Flight: inflight.Flight{Locks: c.Locks, Left: c.Left}, at: c.End, margin: c.Margin,
		guarded: true, forceSeq: c.ForceSeq}
	plan.SetOwner(c.Owner)
	if fl := g.launch(plan, maxTime, next); fl != nil {
		return fl
	}
	return nil
}

// leaseLeft reports whether owner holds ids with more than margin left,
// and how much lease is surely left.
func (g *Guard) leaseLeft(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (time.Duration, bool, error) {
	ts, ok := g.opts.Store.(enforce.TokenStore)
	if !ok {
		held, _, err := g.opts.Store.Holds(ctx, o, ns, ids, margin)
		return margin + time.Millisecond, held, err
	}
	_, left, missing, err := ts.HeldTokens(ctx, o, ns, ids, margin)
	return left, err == nil && len(missing) == 0, err
}
