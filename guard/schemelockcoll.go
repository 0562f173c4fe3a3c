package guard

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// recordExists is the database's reply to an acquire of a lock record
// that exists: DuplicateKey for an insert; "matched, not inserted" for an
// upsert.
func recordExists(w policy.Write, st policy.Step) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	if w.Kind == policy.KindInsert {
		errmsg := fmt.Sprintf("E11000 duplicate key error collection: %s index: _id_ dup key: { _id: %s }", w.NS, docid.Format(bson.RawValue{Type: st.ID.Type, Value: st.ID.Data}))
		we := bsoncore.NewDocumentBuilder().AppendInt32("index", int32(w.Index)).AppendInt32("code", 11000).
			AppendString("errmsg", errmsg).Build()
		d = bsoncore.AppendInt32Element(d, "n", 0)
		d = bsoncore.AppendArrayElement(d, "writeErrors", bsoncore.NewArrayBuilder().AppendDocument(we).Build())
		d = bsoncore.AppendDoubleElement(d, "ok", 1)
		d, _ = bsoncore.AppendDocumentEnd(d, idx)
		return d
	}
	d = bsoncore.AppendInt32Element(d, "n", 1)
	d = bsoncore.AppendInt32Element(d, "nModified", 0)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func lockCollName(s policy.Scheme) string {
	if s.LockColl != "" {
		return s.LockColl
	}
	return "<collection>.lock"
}

// schemeReleaseAll runs a delete of every lock record of one holder id
// ({aid: X}): the records it matches are found with the client's own
// authority, each must be this client's or nobody's, and the delete is
// pinned to them, so that a record inserted meanwhile by someone else is
// never deleted. The mirrors of the deleted records are released.
func (g *Guard) schemeReleaseAll(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *verdict, op schemeOp, start time.Time) proxy.Decision {
	w, r := op.write, op.rule
	db, coll, _ := strings.Cut(w.NS, ".")
	find := bsoncore.NewDocumentBuilder().AppendString("find", coll).AppendDocument("filter", w.Filter).
		AppendDocument("projection", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).
		AppendInt32("limit", int32(r.MaxCandidates+1)).AppendBoolean("singleBatch", true).
		AppendString("$db", db).Build()
	found, err := req.Ask(ctx, find)
	if err != nil {
		return proxy.Decision{Action: proxy.Close, Reason: "scheme release-all: " + err.Error()}
	}
	batch, _ := found.Lookup("cursor", "firstBatch").ArrayOK()
	vals, _ := batch.Values()
	if ok, _ := found.Lookup("ok").AsInt64OK(); ok != 1 {
		return proxy.Decision{Action: proxy.Reply, Reply: found}
	}
	if len(vals) > r.MaxCandidates {
		v.add(r, w, reasonTooManyCandidates, nil, fmt.Sprintf("it deletes more than %d lock records (the policy's maxCandidates); delete them by _id", r.MaxCandidates))
		return g.decide(req, pol, v, start)
	}
	var mine []docid.ID
	var pins []bsoncore.Value
	for _, d := range vals {
		doc, ok := d.DocumentOK()
		if !ok {
			continue
		}
		id, err := idCopy(doc.Lookup("_id"))
		if err != nil {
			v.add(r, w, reasonUnclassifiable, nil, fmt.Sprintf("a lock record it matches has an _id that cannot be a lock's (%v)", err))
			return g.decide(req, pol, v, start)
		}
		held, _, err := g.opts.Store.Holds(ctx, op.owner, w.NS, []docid.ID{id}, 0)
		if err != nil {
			v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonUnavailable,
				detail: fmt.Sprintf("the lock store cannot confirm the scheme locks (%v), so the write is refused (fail closed)", err)})
			return g.decide(req, pol, v, start)
		}
		if !held {
			sts, err := g.confirmedStatus(ctx, op.owner, w.NS, []docid.ID{id})
			if err != nil || len(sts) != 1 || sts[0].Held {
				v.violations = append(v.violations, violation{rule: r, write: w, reason: reasonSchemeNotHolder,
					detail: fmt.Sprintf("under the lockCollection locking scheme of %s some of the lock records it matches belong to another holder; delete your own records by _id", w.NS)})
				return g.decide(req, pol, v, start)
			}
		} else {
			mine = append(mine, id)
		}
		pins = append(pins, id.Core())
	}
	if v.enforcedViolation() {
		return g.decide(req, pol, v, start)
	}
	pinned, err := policy.PinStatements(req.Message, req.Command, []policy.Pin{{List: w.List, Index: w.Index, IDs: pins}})
	var body bsoncore.Document
	if err == nil {
		body, err = bodyOf(pinned, w)
	}
	if err != nil {
		v.add(r, w, reasonUnclassifiable, nil, fmt.Sprintf("the proxy could not restrict it to the verified lock records (%v)", err))
		return g.decide(req, pol, v, start)
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		return proxy.Decision{Action: proxy.Close, Reason: "scheme release-all: " + err.Error()}
	}
	if len(mine) > 0 {
		if _, err := g.opts.Store.Release(ctx, op.owner, w.NS, mine, ""); err != nil {
			g.log.Warn("scheme lock release failed; they expire with their lease", zap.String("ns", w.NS), zap.Error(err))
		}
	}
	v.check(w.NS, mine)
	g.record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: reply}
}

// bodyOf is the one-body command of a rewritten message's statement w.
func bodyOf(msg []byte, w policy.Write) (bsoncore.Document, error) {
	m, err := wire.Parse(msg, wire.Limits{})
	if err != nil {
		return nil, err
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		return nil, err
	}
	return statementBody(cmd, w)
}
