package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Transactions (docs/ENFORCEMENT.md, "Transactions"): each statement of a
// transaction is checked when it is sent, but nothing of it is written
// until commitTransaction, which may come long after, on another
// connection, through another proxy. What each allowed enforced statement
// needs at the commit (the locks it needed, the inserted _ids no other
// session may hold) is stored in the shared lock store, keyed by owner
// session and txnNumber, before the statement is forwarded; so every
// proxy's commit finds it, and no proxy's memory limit or restart can
// lose it. The commit first seals the record, so that no statement sent
// meanwhile through another proxy is forwarded without being seen, then
// is checked against it, with lease enough for the commit, and is a
// write in flight until answered. A commit that
// is not covered, or whose record cannot be read, is not forwarded: the
// proxy sends abortTransaction in its place, so that the transaction's
// writes are discarded upstream, and answers the client with the refusal.
// A record is forgotten only when the server answers a commit or abort of
// the transaction with ok, the one proof that it ended.

// reasonCommitNotCovered: a commit whose writes' locks were lost.
const reasonCommitNotCovered = "commit_not_covered"

// txnStore is implemented by lock stores that keep transaction records
// (lockstore.Store and memstore). Without it, enforced statements in
// transactions are refused: nothing could check their commit.
type txnStore interface {
	RecordTxn(ctx context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error
	BeginCommit(ctx context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error)
	EndTxn(ctx context.Context, session []byte, txn int64) error
}

// recordTxn stores what the commit of a transaction statement allowed so
// far will need: the locks of its enforced writes, and the _ids it inserts
// where inserts require them unlocked. It runs before the statement is
// forwarded; a statement whose needs cannot be stored is refused.
func (g *Guard) recordTxn(ctx context.Context, req *proxy.Request, v *verdict, o lockstore.Owner, inserts needs) {
	var rec []lockstore.TxnNeed
	if f := v.flight; f != nil {
		for _, l := range f.Locks {
			if g.ruleOf(v, l.NS).Mode == policy.Enforce {
				rec = append(rec, lockstore.TxnNeed{NS: l.NS, Bind: o.Bind, Held: l.IDs})
			}
		}
	}
	for _, n := range inserts {
		if n.r.Mode == policy.Enforce && len(n.ids) > 0 {
			rec = append(rec, lockstore.TxnNeed{NS: n.ns, Bind: o.Bind, Unlocked: n.ids})
		}
	}
	if len(rec) == 0 {
		return
	}
	fail := func(detail string) {
		ns := rec[0].NS
		v.violations = append(v.violations, violation{rule: g.ruleOf(v, ns), write: firstWrite(v.writes, ns), reason: refuse.ReasonUnavailable, detail: detail})
	}
	n, ok := req.Command.Body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		fail("it is part of a transaction (autocommit: false) without a txnNumber, so its commit could not be checked")
		return
	}
	ts, ok := g.opts.Store.(txnStore)
	if !ok {
		fail("this lock store keeps no transaction records, so the transaction's commit could not be checked")
		return
	}
	switch err := ts.RecordTxn(ctx, o.Session, n, rec); {
	case errors.Is(err, lockstore.ErrTxnCommitting):
		ns := rec[0].NS
		v.violations = append(v.violations, violation{rule: g.ruleOf(v, ns), write: firstWrite(v.writes, ns), reason: reasonCommitNotCovered,
			detail: "its transaction's commit has already begun, and was checked without it",
			advice: "nothing of it was written; send a transaction's statements before its commit, and start a new transaction for more"})
	case err != nil:
		fail(fmt.Sprintf("the lock store could not record what the transaction's commit needs (%v)", err))
	}
}

// ruleOf is the rule enforce applied to ns in v.
func (g *Guard) ruleOf(v *verdict, ns string) policy.Rule {
	for i, w := range v.writes {
		if w.NS.String() == ns && i < len(v.rules) {
			return v.rules[i]
		}
	}
	return policy.Rule{}
}

// endTransaction decides commitTransaction and abortTransaction.
func (g *Guard) endTransaction(ctx context.Context, req *proxy.Request) proxy.Decision {
	session, ok := req.Command.SessionID()
	if !ok {
		return proxy.Decision{Action: proxy.Forward} // the server refuses it
	}
	n, ok := req.Command.Body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return proxy.Decision{Action: proxy.Forward} // the server refuses it
	}
	key := g.owners.session(req.Client.User(), session)
	ts, hasTxns := g.opts.Store.(txnStore)
	pol := g.policy.Load()
	if pol == nil || pol.AllOff() {
		return proxy.Decision{Action: proxy.Forward}
	}
	if req.Command.Spec().Aborts {
		// Forgotten once the server says it aborted, not before: an
		// abort it refuses leaves the transaction open.
		if !hasTxns {
			return proxy.Decision{Action: proxy.Forward}
		}
		return proxy.Decision{Action: proxy.Forward, OnReply: &txnEnd{g: g, ts: ts, key: key, txn: n}}
	}
	if !hasTxns {
		return g.refuseCommit(req, nil, key, n, "this lock store keeps no transaction records, so what the transaction wrote cannot be checked")
	}
	// From here no statement of the transaction is recorded, so none is
	// forwarded, through any proxy: what is read is all it will commit.
	recorded, err := ts.BeginCommit(ctx, key, n)
	if err != nil {
		return g.refuseCommit(req, ts, key, n, fmt.Sprintf("the lock store cannot tell what the transaction's writes needed (%v)", err))
	}
	end := &txnEnd{g: g, ts: ts, key: key, txn: n}
	if len(recorded) == 0 {
		// No statement of it wrote where it is enforced, through any proxy.
		return proxy.Decision{Action: proxy.Forward, OnReply: end}
	}
	o := g.owner(req, session, "")
	o.Bind = recorded[0].Bind
	var held, unlocked inflight.Locks
	for _, x := range recorded {
		if x.Bind != o.Bind {
			return g.refuseCommit(req, ts, key, n, "its writes were made under more than one owner binding, which one commit cannot hold")
		}
		held.Add(x.NS, x.Held)
		unlocked.Add(x.NS, x.Unlocked)
	}
	// The insert check first: it needs no lease.
	for _, l := range unlocked {
		if len(l.IDs) == 0 {
			continue
		}
		sts, err := g.confirmedStatus(ctx, o, l.NS, l.IDs)
		if err != nil {
			return g.refuseCommit(req, ts, key, n, fmt.Sprintf("the lock store cannot confirm that the _ids it inserts into %s are unlocked (%v)", l.NS, err))
		}
		for _, st := range sts {
			if st.Held && !st.HeldByYou {
				return g.refuseCommit(req, ts, key, n, fmt.Sprintf("another session has locked _id %s, which it inserts into %s", st.ID, l.NS))
			}
		}
	}
	// Guarded: a force-release of one of the locks through this proxy
	// from now on refuses the commit at its launch (launchAt).
	plan := &flightPlan{Flight: inflight.Flight{Owner: o}, guarded: true, forceSeq: g.flights.ForceSeq()}
	for _, l := range held {
		if len(l.IDs) == 0 {
			continue
		}
		plan.margin = max(plan.margin, g.ruleFor(pol.Lookup(l.NS), req).LeaseMargin)
	}
	for _, l := range held {
		if len(l.IDs) == 0 {
			continue
		}
		left, ok, err := g.leaseLeft(ctx, o, l.NS, l.IDs, plan.margin)
		switch {
		case err != nil:
			return g.refuseCommit(req, ts, key, n, fmt.Sprintf("the lock store cannot confirm the locks its writes on %s needed (%v)", l.NS, err))
		case !ok:
			return g.refuseCommit(req, ts, key, n, fmt.Sprintf("this session no longer holds, with at least the policy's margin of %s (policy.leaseMarginMS) of lease, every lock its writes on %s needed", lockstore.FormatMS(plan.margin), l.NS))
		}
		end := time.Now().Add(left)
		if plan.end.IsZero() || end.Before(plan.end) {
			plan.end, plan.Left = end, left
		}
		plan.Locks.Add(l.NS, l.IDs)
	}
	if len(plan.Locks) == 0 {
		// Inserts only: checked now, as a plain insert is when sent.
		return proxy.Decision{Action: proxy.Forward, OnReply: end}
	}
	if time.Until(plan.end) <= plan.margin {
		return g.refuseCommit(req, ts, key, n, "the lease of its locks would end before the commit could")
	}
	// Covered: the commit is a write in flight under those locks.
	budget := time.Until(plan.end) - plan.margin
	d := proxy.Decision{Action: proxy.Forward}
	var maxTime time.Duration
	if b, capped, err := policy.EditMessage(req.Message, req.Command, policy.Edit{MaxTimeMS: max(budget.Milliseconds(), 1)}); err == nil {
		maxTime = capped
		if b != nil {
			d.Action, d.Message = proxy.Rewrite, b
		}
	}
	refused := commitRefusal("the lease of its locks would have ended before the commit left for the database")
	if h := g.testCommitChecked; h != nil {
		h()
	}
	fl := g.launch(plan, maxTime, end)
	if fl == nil {
		return g.refuseCommit(req, ts, key, n, "an operator force-released the lock on a document it wrote while lockgate was checking the commit")
	}
	d.Deadline, d.LateReply, d.OnReply = plan.end.Add(-plan.margin), refused, fl
	return d
}

// leaseLeft reports whether owner holds ids with more than margin left,
// and how much lease is surely left.
func (g *Guard) leaseLeft(ctx context.Context, o lockstore.Owner, ns string, ids []docid.ID, margin time.Duration) (time.Duration, bool, error) {
	ts, ok := g.opts.Store.(tokenStore)
	if !ok {
		held, _, err := g.opts.Store.Holds(ctx, o, ns, ids, margin)
		return margin + time.Millisecond, held, err
	}
	_, left, missing, err := ts.HeldTokens(ctx, o, ns, ids, margin)
	return left, err == nil && len(missing) == 0, err
}

func commitRefusal(why string) *refuse.Error {
	return &refuse.Error{Code: mongoerr.LockBusy, Reason: reasonCommitNotCovered,
		Msg: "lockgate: commitTransaction refused: " + why + "; the transaction was aborted and nothing of it was written: acquire the locks again and redo the transaction"}
}

// refuseCommit sends abortTransaction upstream in the commit's place, in
// the connection's order, and answers the client with the refusal. The
// record stays until the server confirms the abort.
func (g *Guard) refuseCommit(req *proxy.Request, ts txnStore, key []byte, n int64, why string) proxy.Decision {
	e := commitRefusal(why)
	g.log.Info("commit refused: not covered by the locks its writes needed", zap.Uint64("conn", req.Client.ID), zap.String("why", why))
	g.metrics.decisions.WithLabelValues("transaction", decisionReject, reasonCommitNotCovered).Inc()
	m, ok := req.Message.(*wire.OpMsg)
	if !ok || req.Command.MoreToCome {
		// No OP_MSG to put the abort in: the server times the
		// transaction out.
		return proxy.Decision{Action: proxy.Reply, Reply: e.Document()}
	}
	b := bsoncore.NewDocumentBuilder().AppendInt32("abortTransaction", 1)
	for _, k := range []string{"lsid", "txnNumber", "autocommit", "writeConcern", "$clusterTime"} {
		if v, err := req.Command.Body.LookupErr(k); err == nil {
			b.AppendValue(k, v)
		}
	}
	b.AppendString("$db", "admin")
	abort := wire.AppendMsg(nil, m.Header().RequestID, 0, 0, b.Build())
	return proxy.Decision{Action: proxy.Rewrite, Message: abort, OnReply: &txnEnd{g: g, ts: ts, key: key, txn: n, reply: e.Document()}}
}

// txnEnd forgets a transaction's record once the server answered its
// commit or abort with ok; any other answer (a refused abort, a failed
// commit that may be retried) leaves the transaction open as far as
// lockgate knows. With reply set, the client is answered with it whatever
// the server said.
type txnEnd struct {
	g     *Guard
	ts    txnStore
	key   []byte
	txn   int64
	reply bsoncore.Document
}

func (h *txnEnd) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	if ok, _ := body.Lookup("ok").AsInt64OK(); ok == 1 && h.ts != nil {
		if err := h.ts.EndTxn(ctx, h.key, h.txn); err != nil {
			// Kept: a later commit of it is checked again, and refused
			// if no longer covered; the record expires with
			// lockstore.TxnRetention.
			h.g.log.Info("could not forget an ended transaction", zap.Error(err))
		}
	}
	return h.reply
}
func (*txnEnd) Abandon() {}

// inTransaction reports whether a command runs inside a multi-document
// transaction (autocommit: false), where the server refuses a maxTimeMS of
// its own statements; the commit is checked instead.
func inTransaction(cmd *wire.Command) bool {
	v, ok := cmd.Lookup("autocommit")
	if !ok {
		return false
	}
	b, ok := v.BooleanOK()
	return ok && !b
}
