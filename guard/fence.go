package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// The document fence (docs/ENFORCEMENT.md, "Document fence"): on a
// namespace whose rule sets fence: document, acquireLock stamps the new
// fencing token into each locked document that exists, and every enforced
// write is rewritten to apply only where the document's stamp is the
// writer's token. A write from a holder that is no longer current (delayed
// past its lease, from a paused or partitioned proxy, or checked against a
// stale cache) then matches nothing, decided by the database atomically with
// the write itself; the proxy turns that into an error for the client.

// Reasons of the fence.
const (
	// reasonFenceField: the write would change the fence field itself.
	reasonFenceField = "fence_field"
	// reasonFenceUnsupported: a write form the fence cannot rewrite.
	reasonFenceUnsupported = "fence_unsupported"
	// reasonFenceStamp: acquireLock could not stamp the documents.
	reasonFenceStamp = "fence_stamp_failed"
)

// fenced reports whether r fences documents. By pointer: every lock
// check asks it, and a rule (about 330 bytes) passed by value was copied
// for the question on every write.
func fenced(r *policy.Rule) bool { return r.Mode == policy.Enforce && r.FenceField != "" }

// fenceStmt is one statement of a fenced namespace.
type fenceStmt struct {
	r   policy.Rule
	w   policy.Write
	ids []docid.ID // the documents it may touch (empty for inserts)
	// tokens of an insert whose _id the writer holds (else nil).
	insertID    docid.ID
	insertToken []int64
}

// fencePlan is what the fence needs to rewrite a command.
type fencePlan struct {
	stmts  []fenceStmt
	tokens map[docid.Key]int64 // token held, per document
}

func (v *verdict) fencePlan() *fencePlan {
	if v.fence == nil {
		v.fence = &fencePlan{tokens: map[docid.Key]int64{}}
	}
	return v.fence
}

// fenceWrite records a statement of a fenced namespace, or refuses a form
// the fence cannot rewrite.
func (v *verdict) fenceWrite(r *policy.Rule, w policy.Write, ids []docid.ID) {
	if !fenced(r) {
		return
	}
	switch {
	case w.InBulkWrite():
		v.Add(*r, w, reasonFenceUnsupported, nil, "bulkWrite cannot be fenced yet; send update, delete and insert commands (drivers' collection-level bulk writes do)")
		return
	case w.List == policy.ListLegacy:
		v.Add(*r, w, reasonFenceUnsupported, nil, "legacy write opcodes cannot be fenced; use the insert command")
		return
	}
	p := v.fencePlan()
	p.stmts = append(p.stmts, fenceStmt{r: *r, w: w, ids: ids})
}

func (p *fencePlan) token(ns namespace.Namespace, id docid.ID) (int64, bool) {
	t, ok := p.tokens[docid.KeyOf(ns, id)]
	return t, ok
}

// fenceInserts finds, for each fenced insert, whether the writer holds the
// lock on the inserted _id, and its token: the new document then carries
// it, so that a stale holder of the same _id cannot write it afterwards.
// Where no lock is held in the namespace at all, nothing is looked up.
func (g *Guard) fenceInserts(ctx context.Context, v *verdict, o *lockstore.Owner, hasSession bool) {
	if v.fence == nil || !hasSession {
		return
	}
	for i := range v.fence.stmts {
		s := &v.fence.stmts[i]
		if s.w.Kind != policy.KindInsert {
			continue
		}
		id, found, certain := policy.InsertID(s.w)
		if !found || !certain {
			continue
		}
		if h, ok := g.opts.Store.(enforce.LockTeller); ok && !h.MayHoldLocks(s.w.NS) {
			continue
		}
		rid, err := enforce.IDCopy(id)
		if err != nil {
			continue // no lock can be held on it; the database refuses it
		}
		sts, err := g.opts.Store.Status(ctx, *o, s.w.NS, []docid.ID{rid})
		if err != nil {
			v.Violations = append(v.Violations, enforce.Violation{Rule: s.r, Write: s.w, Reason: refuse.ReasonUnavailable,
				Detail: fmt.Sprintf("the lock store cannot tell whether this session holds the inserted _id's lock, whose token the fenced document must carry (%v)", err)})
			return
		}
		if len(sts) == 1 && sts[0].HeldByYou {
			s.insertID, s.insertToken = rid, []int64{sts[0].Token}
		}
	}
}

// fenceDecision returns the fences of an allowed command on fenced
// namespaces, for the editor (guard/edit.go), and the decision carrying the
// hook that reports fenced-out statements, or a refusal.
func (g *Guard) fenceDecision(req *proxy.Request, v *verdict) (proxy.Decision, []policy.Fence) {
	var fences []policy.Fence
	var checks []fence.Check
	for _, s := range v.fence.stmts {
		f := policy.Fence{List: s.w.List, Index: s.w.Index, Field: s.r.FenceField}
		if s.w.Kind == policy.KindInsert {
			if len(s.insertToken) == 0 && !hasField(s.w.Doc, s.r.FenceField) {
				continue // nothing to stamp, nothing to drop
			}
			if len(s.insertToken) > 0 {
				f.IDs = []bsoncore.Value{s.insertID.Core()}
				f.Tokens = s.insertToken
			}
			fences = append(fences, f)
			continue
		}
		c := fence.Check{Index: s.w.Index, Multi: s.w.Multi, NS: s.w.NS, Field: s.r.FenceField}
		for _, id := range dedupIDs(s.ids) {
			t, ok := v.fence.token(s.w.NS, id)
			if !ok {
				x := enforce.Violation{Write: s.w, Rule: s.r, Reason: enforce.ReasonUnclassifiable, Detail: "the proxy lost track of a fencing token it had checked"}
				return proxy.Decision{Action: proxy.Reply, Reply: refusal(req, x).Document()}, nil
			}
			f.IDs = append(f.IDs, id.Core())
			f.Tokens = append(f.Tokens, t)
			c.IDs, c.Tokens, c.Named = append(c.IDs, id), append(c.Tokens, t), append(c.Named, v.IsNamed(s.w.NS, id))
		}
		fences, checks = append(fences, f), append(checks, c)
	}
	d := proxy.Decision{Action: proxy.Forward}
	if len(checks) > 0 && g.opts.Resolver != nil {
		if db, ok := g.opts.Resolver.(fence.DB); ok {
			d.OnReply = &fence.Hook{DB: db, Command: req.Command.Name, Checks: checks,
				OneStatement: req.Command.Spec().Writes == wire.WritesFindAndModify, Log: g.log, FencedOut: g.metrics.fencedOut}
		}
	}
	return d, fences
}

func hasField(d bsoncore.Document, field string) bool {
	_, err := d.LookupErr(field)
	return err == nil
}

func dedupIDs(ids []docid.ID) []docid.ID {
	out := make([]docid.ID, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id.Key()] {
			continue
		}
		seen[id.Key()] = true
		out = append(out, id)
	}
	return out
}

// fenceAcquired stamps the tokens of locks just acquired into the
// documents of a fenced namespace. A lock whose documents cannot be
// stamped would let the previous holder's late writes through, so on
// failure the locks are released again and acquireLock fails.
func (g *Guard) fenceAcquired(ctx context.Context, ns namespace.Namespace, o lockstore.Owner, locks []lockstore.Lock) *refuse.Error {
	pol := g.policy.Load()
	if pol == nil || len(locks) == 0 {
		return nil
	}
	r := pol.Lookup(ns)
	if !fenced(&r) {
		return nil
	}
	ids := make([]docid.ID, len(locks))
	tokens := make([]int64, len(locks))
	for i, l := range locks {
		ids[i], tokens[i] = l.ID, l.Token
	}
	db, ok := g.opts.Resolver.(fence.DB)
	var err error
	if !ok {
		err = errors.New("no client to stamp documents with")
	} else {
		err = db.StampFence(ctx, ns, r.FenceField, ids, tokens)
	}
	if err == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, rerr := g.opts.Store.Release(rctx, o, ns, ids, "lockgate: stamping the fencing token failed"); rerr != nil {
		g.log.Warn("fence: releasing locks whose documents could not be stamped failed; they expire with their lease",
			zap.String("ns", ns.String()), zap.Error(rerr))
	}
	return &refuse.Error{Code: mongoerr.LockBusy, Reason: reasonFenceStamp, NS: ns.String(),
		Msg: fmt.Sprintf("lockgate: acquireLock on %s: the fencing token could not be stamped into the documents (%v); the locks were released again: retry", ns, err)}
}
