package guard

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Transactions (docs/ENFORCEMENT.md, "Transactions"): each statement of a
// transaction is checked when it is sent, but nothing of it is written
// until commitTransaction, which may come long after. The guard remembers
// which locks each open transaction's enforced writes needed; at the
// commit it checks them again, with lease enough for the commit, and
// keeps them from being released until the commit is answered (the
// commit is a write in flight). A commit that is no longer covered is not
// forwarded: the proxy sends abortTransaction in its place, so that the
// transaction's writes are discarded upstream, and answers the client
// with the refusal.

// reasonCommitNotCovered: a commit whose writes' locks were lost.
const reasonCommitNotCovered = "commit_not_covered"

// maxOpenTxns bounds the transactions remembered at once; the oldest are
// forgotten first (a transaction the server timed out never commits).
const maxOpenTxns = 10000

type txnTracker struct {
	mu sync.Mutex
	m  map[string]*txnLocks
}

type txnLocks struct {
	owner  lockstore.Owner
	locks  nsLocks
	margin time.Duration
	at     time.Time
}

func newTxnTracker() *txnTracker { return &txnTracker{m: map[string]*txnLocks{}} }

// txnKey names a transaction: the stored owner session and txnNumber.
func txnKey(session []byte, body bsoncore.Document) (string, bool) {
	n, ok := body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return "", false
	}
	return string(binary.BigEndian.AppendUint64(append([]byte(nil), session...), uint64(n))), true
}

// recordTxn remembers the locks of an allowed enforced write inside a
// transaction.
func (g *Guard) recordTxn(req *proxy.Request, p *flightPlan) {
	key, ok := txnKey(p.owner.Session, req.Command.Body)
	if !ok {
		return
	}
	t := g.txns
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		if len(t.m) >= maxOpenTxns {
			var oldest string
			var at time.Time
			for k, v := range t.m {
				if oldest == "" || v.at.Before(at) {
					oldest, at = k, v.at
				}
			}
			delete(t.m, oldest)
		}
		e = &txnLocks{owner: p.owner, at: time.Now()}
		t.m[key] = e
	}
	e.margin = max(e.margin, p.margin)
	for _, l := range p.locks {
		e.locks.add(l.ns, l.ids)
	}
}

func (t *txnTracker) take(key string, remove bool) *txnLocks {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if remove {
		delete(t.m, key)
	}
	return e
}

// endTransaction decides commitTransaction and abortTransaction of a
// transaction that wrote under locks.
func (g *Guard) endTransaction(ctx context.Context, req *proxy.Request) proxy.Decision {
	session, ok := req.Command.SessionID()
	if !ok {
		return proxy.Decision{Action: proxy.Forward}
	}
	key, ok := txnKey(g.owners.session(req.Client.User(), session), req.Command.Body)
	if !ok {
		return proxy.Decision{Action: proxy.Forward}
	}
	if req.Command.Name == "abortTransaction" {
		g.txns.take(key, true)
		return proxy.Decision{Action: proxy.Forward}
	}
	e := g.txns.take(key, false)
	if e == nil {
		return proxy.Decision{Action: proxy.Forward}
	}
	plan := &flightPlan{owner: e.owner, locks: e.locks, margin: e.margin}
	var why string
	for _, l := range e.locks {
		ns, ids := l.ns, l.ids
		left, held, err := g.leaseLeft(ctx, e.owner, ns, ids, e.margin)
		switch {
		case err != nil:
			why = fmt.Sprintf("the lock store cannot confirm the locks its writes on %s needed (%v)", ns, err)
		case !held:
			why = fmt.Sprintf("this session no longer holds, with at least the policy's margin of %v of lease, every lock its writes on %s needed", e.margin, ns)
		default:
			end := time.Now().Add(left)
			if plan.end.IsZero() || end.Before(plan.end) {
				plan.end, plan.left = end, left
			}
			continue
		}
		break
	}
	if why == "" && time.Until(plan.end) <= e.margin {
		why = "the lease of its locks would end before the commit could"
	}
	if why != "" {
		return g.refuseCommit(req, key, why)
	}
	// Covered: the commit is a write in flight under those locks.
	budget := time.Until(plan.end) - e.margin
	d := proxy.Decision{Action: proxy.Forward}
	var maxTime time.Duration
	if b, capped, err := policy.CapMaxTime(req.Message.Raw(), max(budget.Milliseconds(), 1)); err == nil {
		maxTime = capped
		if b != nil {
			d.Action, d.Message = proxy.Rewrite, b
		}
	}
	refused := commitRefusal("the lease of its locks would have ended before the commit left for the database")
	d.Deadline, d.LateReply = plan.end.Add(-e.margin), refused.document
	d.OnReply = g.launch(plan, maxTime, &commitHook{t: g.txns, key: key})
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

func commitRefusal(why string) *cmdError {
	return &cmdError{code: codeLockBusy, reason: reasonCommitNotCovered,
		msg: "lockgate: commitTransaction refused: " + why + "; the transaction was aborted and nothing of it was written: acquire the locks again and redo the transaction"}
}

// refuseCommit sends abortTransaction upstream in the commit's place, in
// the connection's order, and answers the client with the refusal.
func (g *Guard) refuseCommit(req *proxy.Request, key, why string) proxy.Decision {
	g.txns.take(key, true)
	e := commitRefusal(why)
	g.log.Info("commit refused: its locks were lost", zap.Uint64("conn", req.Client.ID), zap.String("why", why))
	g.metrics.decisions.WithLabelValues("transaction", decisionReject, reasonCommitNotCovered).Inc()
	m, ok := req.Message.(*wire.OpMsg)
	if !ok || req.Command.MoreToCome {
		// No OP_MSG to put the abort in: the server times the
		// transaction out.
		return proxy.Decision{Action: proxy.Reply, Reply: e.document()}
	}
	b := bsoncore.NewDocumentBuilder().AppendInt32("abortTransaction", 1)
	for _, k := range []string{"lsid", "txnNumber", "autocommit", "writeConcern", "$clusterTime"} {
		if v, err := req.Command.Body.LookupErr(k); err == nil {
			b.AppendValue(k, v)
		}
	}
	b.AppendString("$db", "admin")
	abort := wire.AppendMsg(nil, m.Header().RequestID, 0, 0, b.Build())
	return proxy.Decision{Action: proxy.Rewrite, Message: abort, OnReply: fixedReply(e.document())}
}

// fixedReply answers the client with body whatever the upstream said.
type fixedReply bsoncore.Document

func (f fixedReply) Reply(context.Context, bsoncore.Document) bsoncore.Document {
	return bsoncore.Document(f)
}
func (fixedReply) Abandon() {}

// commitHook forgets the transaction once its commit succeeded (a failed
// commit may be retried, and stays covered).
type commitHook struct {
	t   *txnTracker
	key string
}

func (h *commitHook) Reply(_ context.Context, body bsoncore.Document) bsoncore.Document {
	if ok, _ := body.Lookup("ok").AsInt64OK(); ok == 1 {
		h.t.take(h.key, true)
	}
	return nil
}
func (h *commitHook) Abandon() {}
