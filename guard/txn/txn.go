// Package txn is the transaction check (docs/ENFORCEMENT.md,
// "Transactions"): each statement of a transaction is checked when it is
// sent, but nothing of it is written until commitTransaction, which may
// come long after, on another connection, through another proxy. What
// each allowed enforced statement needs at the commit (the locks it
// needed, the inserted _ids no other session may hold) is stored in the
// shared lock store, keyed by owner session and txnNumber, before the
// statement is forwarded (Check.Record, called by enforcement); so every
// proxy's commit finds it, and no proxy's memory limit or restart can
// lose it. The commit (Check.End, called by the sessions stage) first
// seals the record, so that no statement sent meanwhile through another
// proxy is forwarded without being seen, then is checked against it,
// with lease enough for the commit, and is a write in flight until
// answered (launched by enforcement, Config.Launch). A commit that is not
// covered, or whose record cannot be read, is not forwarded: the proxy
// sends abortTransaction in its place, so that the transaction's writes
// are discarded upstream, and answers the client with the refusal. A
// record is forgotten only when the server answers a commit or abort of
// the transaction with ok, the one proof that it ended.
//
// The check knows nothing of the guard: it is built from what Config
// gives it.
package txn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// ReasonCommitNotCovered: a commit whose writes' locks were lost.
const ReasonCommitNotCovered = "commit_not_covered"

// Store is implemented by lock stores that keep transaction records
// (lockstore.Store and memstore). Without it, enforced statements in
// transactions are refused: nothing could check their commit.
type Store interface {
	RecordTxn(ctx context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error
	BeginCommit(ctx context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error)
	EndTxn(ctx context.Context, session []byte, txn int64) error
}

// Commit is a covered commit's flight, which enforcement launches as a
// write in flight under its locks.
type Commit struct {
	Owner lockstore.Owner
	Locks inflight.Locks
	// End is the local monotonic time when the earliest lease surely
	// ends, Left the lease surely left then.
	End  time.Time
	Left time.Duration
	// Margin is the largest margin of the rules of the namespaces written.
	Margin time.Duration
	// ForceSeq is the tracker's force-release sequence read before the
	// locks were checked: the launch is refused if a force-release of one
	// of them was under way at any moment since.
	ForceSeq uint64
}

// Config is what the check needs from outside.
type Config struct {
	// Store keeps the transaction records; nil when the lock store keeps
	// none.
	Store Store
	// Policy is the policy in force (nil before the first).
	Policy func() *policy.Policy
	// SessionKey is the owner key of a (user, lsid) session, under which
	// its records are kept.
	SessionKey func(user string, lsid []byte) []byte
	// Owner is the lock owner of the request's session under bind.
	Owner func(req *proxy.Request, lsid []byte, bind string) lockstore.Owner
	// LeaseMargin is the margin of the rule that applies to ns for req.
	LeaseMargin func(req *proxy.Request, pol *policy.Policy, ns namespace.Namespace) time.Duration
	// Confirmed is the lock store's status of ids, not trusting a head
	// that lags behind its claims.
	Confirmed func(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	// LeaseLeft reports whether o holds ids with more than margin left,
	// and how much lease is surely left.
	LeaseLeft func(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (time.Duration, bool, error)
	// Collated is the insert check under a default collation that is not
	// simple (enforce's Locks.CollatedInsertable, where the namespace's
	// is not): why inserting ids into ns, as o, may create a document
	// another session locked under another spelling of its _id; "" when
	// it may not. nil refuses every commit that inserts (fail closed).
	Collated func(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) string
	// ForceSeq is the in-flight tracker's force-release sequence.
	ForceSeq func() uint64
	// Launch launches a covered commit as a write in flight, with next
	// as the hook after its own, and returns the hook of its decision;
	// nil, launching nothing, when a force-release may have freed one of
	// its locks since ForceSeq was read.
	Launch func(c *Commit, maxTime time.Duration, next proxy.ReplyHook) proxy.ReplyHook
	// Refused counts a refused commit (the guard's decision metric).
	Refused func()
	// Checked, when set (tests only), runs when a commit's locks were
	// checked, before it is launched.
	Checked func()
	Log     *zap.Logger
}

// Check is the transaction check. It is safe for concurrent use.
type Check struct{ cfg Config }

// New returns the check.
func New(cfg Config) *Check { return &Check{cfg: cfg} }

// In reports whether a command runs inside a multi-document transaction
// (autocommit: false), where the server refuses a maxTimeMS of its own
// statements; the commit is checked instead.
func In(cmd *wire.Command) bool {
	v, ok := cmd.Kept(wire.KeyAutocommit)
	if !ok {
		return false
	}
	b, ok := v.BooleanOK()
	return ok && !b
}

// Refusal is why a transaction statement cannot be allowed: its commit
// could not be checked. NS is the namespace of the need it names.
type Refusal struct {
	NS                     namespace.Namespace
	Reason, Detail, Advice string
}

// Record stores what the commit of a transaction statement allowed so
// far will need (needs, all under session, the statement's owner key).
// It runs before the statement is forwarded; a statement whose needs
// cannot be stored is refused, with the refusal returned.
func (c *Check) Record(ctx context.Context, req *proxy.Request, session []byte, needs []lockstore.TxnNeed) *Refusal {
	if len(needs) == 0 {
		return nil
	}
	fail := func(detail string) *Refusal {
		return &Refusal{NS: needs[0].NS, Reason: refuse.ReasonUnavailable, Detail: detail}
	}
	n, ok := req.Command.Body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return fail("it is part of a transaction (autocommit: false) without a txnNumber, so its commit could not be checked")
	}
	if c.cfg.Store == nil {
		return fail("this lock store keeps no transaction records, so the transaction's commit could not be checked")
	}
	switch err := c.cfg.Store.RecordTxn(ctx, session, n, needs); {
	case errors.Is(err, lockstore.ErrTxnCommitting):
		return &Refusal{NS: needs[0].NS, Reason: ReasonCommitNotCovered,
			Detail: "its transaction's commit has already begun, and was checked without it",
			Advice: "nothing of it was written; send a transaction's statements before its commit, and start a new transaction for more"}
	case err != nil:
		return fail(fmt.Sprintf("the lock store could not record what the transaction's commit needs (%v)", err))
	}
	return nil
}

// End decides commitTransaction and abortTransaction.
func (c *Check) End(ctx context.Context, req *proxy.Request) proxy.Decision {
	cfg := &c.cfg
	session, ok := req.Command.SessionID()
	if !ok {
		return proxy.Decision{Action: proxy.Forward} // the server refuses it
	}
	n, ok := req.Command.Body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return proxy.Decision{Action: proxy.Forward} // the server refuses it
	}
	key := cfg.SessionKey(req.Client.User(), session)
	ts, hasTxns := cfg.Store, cfg.Store != nil
	pol := cfg.Policy()
	if pol == nil || pol.AllOff() {
		return proxy.Decision{Action: proxy.Forward}
	}
	if req.Command.Spec().Aborts {
		// Forgotten once the server says it aborted, not before: an
		// abort it refuses leaves the transaction open.
		if !hasTxns {
			return proxy.Decision{Action: proxy.Forward}
		}
		return proxy.Decision{Action: proxy.Forward, OnReply: &end{log: cfg.Log, ts: ts, key: key, txn: n}}
	}
	if !hasTxns {
		return c.refuse(req, nil, key, n, "this lock store keeps no transaction records, so what the transaction wrote cannot be checked")
	}
	// From here no statement of the transaction is recorded, so none is
	// forwarded, through any proxy: what is read is all it will commit.
	recorded, err := ts.BeginCommit(ctx, key, n)
	if err != nil {
		return c.refuse(req, ts, key, n, fmt.Sprintf("the lock store cannot tell what the transaction's writes needed (%v)", err))
	}
	done := &end{log: cfg.Log, ts: ts, key: key, txn: n}
	if len(recorded) == 0 {
		// No statement of it wrote where it is enforced, through any proxy.
		return proxy.Decision{Action: proxy.Forward, OnReply: done}
	}
	o := cfg.Owner(req, session, "")
	o.Bind = recorded[0].Bind
	var held, unlocked inflight.Locks
	for _, x := range recorded {
		if x.Bind != o.Bind {
			return c.refuse(req, ts, key, n, "its writes were made under more than one owner binding, which one commit cannot hold")
		}
		held.Add(x.NS, x.Held)
		unlocked.Add(x.NS, x.Unlocked)
	}
	// The insert check first: it needs no lease. It is the statement's
	// (enforce's Locks.Insertable and CollatedInsertable), against the
	// locks taken since: of the namespace whose locks apply (a case
	// variant of a protected database's are the protected one's), exact,
	// then under the namespace's default collation.
	for _, l := range unlocked {
		if len(l.IDs) == 0 {
			continue
		}
		r := pol.Lookup(l.NS)
		ns := r.LockNamespace(l.NS)
		sts, err := cfg.Confirmed(ctx, o, ns, l.IDs)
		if err != nil {
			return c.refuse(req, ts, key, n, fmt.Sprintf("the lock store cannot confirm that the _ids it inserts into %s are unlocked (%v)", l.NS, err))
		}
		for _, st := range sts {
			if st.Held && !st.HeldByYou {
				return c.refuse(req, ts, key, n, fmt.Sprintf("another session has locked _id %s, which it inserts into %s", st.ID, l.NS))
			}
		}
		if cfg.Collated == nil {
			return c.refuse(req, ts, key, n, fmt.Sprintf("this proxy cannot check the _ids it inserts into %s under that collection's collation", l.NS))
		}
		if why := cfg.Collated(ctx, o, ns, l.IDs); why != "" {
			return c.refuse(req, ts, key, n, why)
		}
	}
	// Guarded: a force-release of one of the locks through this proxy
	// from now on refuses the commit at its launch.
	plan := &Commit{Owner: o, ForceSeq: cfg.ForceSeq()}
	for _, l := range held {
		if len(l.IDs) == 0 {
			continue
		}
		plan.Margin = max(plan.Margin, cfg.LeaseMargin(req, pol, l.NS))
	}
	for _, l := range held {
		if len(l.IDs) == 0 {
			continue
		}
		left, ok, err := cfg.LeaseLeft(ctx, o, l.NS, l.IDs, plan.Margin)
		switch {
		case err != nil:
			return c.refuse(req, ts, key, n, fmt.Sprintf("the lock store cannot confirm the locks its writes on %s needed (%v)", l.NS, err))
		case !ok:
			return c.refuse(req, ts, key, n, fmt.Sprintf("this session no longer holds, with at least the policy's margin of %s (policy.leaseMarginMS) of lease, every lock its writes on %s needed", lockstore.FormatMS(plan.Margin), l.NS))
		}
		e := time.Now().Add(left)
		if plan.End.IsZero() || e.Before(plan.End) {
			plan.End, plan.Left = e, left
		}
		plan.Locks.Add(l.NS, l.IDs)
	}
	if len(plan.Locks) == 0 {
		// Inserts only: checked now, as a plain insert is when sent.
		return proxy.Decision{Action: proxy.Forward, OnReply: done}
	}
	if time.Until(plan.End) <= plan.Margin {
		return c.refuse(req, ts, key, n, "the lease of its locks would end before the commit could")
	}
	// Covered: the commit is a write in flight under those locks.
	budget := time.Until(plan.End) - plan.Margin
	d := proxy.Decision{Action: proxy.Forward}
	b, _, at, err := policy.EditMessageAt(req.Message, req.Command, policy.Edit{MaxTimeMS: max(budget.Milliseconds(), 1)})
	if err != nil {
		// Uncapped, the commit could run past its locks' lease.
		return c.refuse(req, ts, key, n, fmt.Sprintf("lockgate could not bound the commit's maxTimeMS by its locks' lease (%v)", err))
	}
	// The proxy lowers the cap to what is left when the commit leaves
	// (d.MaxTime), so the database may run it until the deadline,
	// whatever maxTimeMS it leaves with.
	maxTime := budget
	d.MaxTime = at
	if b != nil {
		d.Action, d.Message = proxy.Rewrite, b
	}
	refused := refusal("the lease of its locks would have ended before the commit left for the database")
	if h := cfg.Checked; h != nil {
		h()
	}
	fl := cfg.Launch(plan, maxTime, done)
	if fl == nil {
		return c.refuse(req, ts, key, n, "an operator force-released the lock on a document it wrote while lockgate was checking the commit")
	}
	d.Deadline, d.LateReply, d.OnReply = plan.End.Add(-plan.Margin), refused, fl
	return d
}

func refusal(why string) *refuse.Error {
	return &refuse.Error{Code: mongoerr.LockBusy, Reason: ReasonCommitNotCovered,
		Msg: "lockgate: commitTransaction refused: " + why + "; the transaction was aborted and nothing of it was written: acquire the locks again and redo the transaction"}
}

// refuse sends abortTransaction upstream in the commit's place, in the
// connection's order, and answers the client with the refusal. The
// record stays until the server confirms the abort.
func (c *Check) refuse(req *proxy.Request, ts Store, key []byte, n int64, why string) proxy.Decision {
	e := refusal(why)
	c.cfg.Log.Info("commit refused: not covered by the locks its writes needed", zap.Uint64("conn", req.Client.ID), zap.String("why", why))
	c.cfg.Refused()
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
	return proxy.Decision{Action: proxy.Rewrite, Message: abort, OnReply: &end{log: c.cfg.Log, ts: ts, key: key, txn: n, reply: e.Document()}}
}

// end forgets a transaction's record once the server answered its commit
// or abort with ok; any other answer (a refused abort, a failed commit
// that may be retried) leaves the transaction open as far as lockgate
// knows. With reply set, the client is answered with it whatever the
// server said.
type end struct {
	log   *zap.Logger
	ts    Store
	key   []byte
	txn   int64
	reply bsoncore.Document
}

func (h *end) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	if ok, _ := body.Lookup("ok").AsInt64OK(); ok == 1 && h.ts != nil {
		if err := h.ts.EndTxn(ctx, h.key, h.txn); err != nil {
			// Kept: a later commit of it is checked again, and refused
			// if no longer covered; the record expires with
			// lockstore.TxnRetention.
			h.log.Info("could not forget an ended transaction", zap.Error(err))
		}
	}
	return h.reply
}
func (*end) Abandon() {}
