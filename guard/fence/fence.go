// Package fence is the document fence's reply check (docs/ENFORCEMENT.md,
// "Document fence"): after a fenced write, it tells a statement the
// database refused because a newer holder stamped the document from one
// that simply matched nothing, and turns the former into an error for the
// client. It is its own unit, called by enforcement (which gathers the
// writer's tokens and has the statements rewritten) and given the
// deployment (DB) it reads the stamps from; it knows nothing of the guard.
package fence

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
)

// ReasonFencedOut: the database refused the write because a newer holder
// had stamped the document.
const ReasonFencedOut = "fenced_out"

// DB is what the document fence needs from the deployment, through
// the proxy's own client (MongoResolver implements it): never over a
// client's connection, since the stamps are re-read from the upstream pump,
// which must not wait for its own connection.
type DB interface {
	// StampFence raises field to tokens[i] in the document ids[i] of ns,
	// where it exists, never lowering it ($max).
	StampFence(ctx context.Context, ns namespace.Namespace, field string, ids []docid.ID, tokens []int64) error
	// FenceStamps reads field of the documents ids of ns: for each id, the
	// stamp (zero Type when the field is absent) and whether the document
	// exists.
	FenceStamps(ctx context.Context, ns namespace.Namespace, field string, ids []docid.ID) (stamps []bson.RawValue, exists []bool, err error)
}

// Check is what the reply hook knows of one fenced statement.
type Check struct {
	Index  int // the statement's index in its command
	Multi  bool
	NS     namespace.Namespace
	Field  string // the fence field
	IDs    []docid.ID
	Tokens []int64 // the writer's token on IDs[i]
	Named  []bool  // whether the request named IDs[i] itself
}

// fenceHook tells a fenced-out statement from one that simply matched
// nothing. The rule: when a reply counts fewer documents than the
// statements could touch (n + upserted below the number of single-document
// statements plus the ids of multi-document ones), or an upsert failed
// with a duplicate key, lockgate reads the stamps of those documents with
// its own client. A statement is fenced out when one of its documents
// exists and carries a stamp other than the writer's token: a newer holder
// stamped it, so the database refused the write there. The full reply
// costs nothing extra.
//
// It is a proxy.ReplyHook.
type Hook struct {
	DB      DB
	Command string
	// OneStatement: the command is its own statement (findAndModify), so
	// the reply is the statement's own, not a count.
	OneStatement bool
	Checks       []Check
	Log          *zap.Logger
	// FencedOut counts the statements the fence refused
	// (lockgate_fenced_out_total, owned by the guard's metrics).
	FencedOut prometheus.Counter
}

// Abandon implements proxy.ReplyHook: a write that got no reply has nothing to check.
func (h *Hook) Abandon() {}

// Reply implements proxy.ReplyHook: a fenced-out statement becomes a write
// error at its index (or, for findAndModify, the command's error).
func (h *Hook) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	if body == nil {
		return nil // never sent
	}
	if h.OneStatement {
		return h.findAndModify(ctx, body)
	}
	if ok, _ := body.Lookup("ok").AsInt64OK(); ok != 1 {
		return nil
	}
	expected := 0
	for _, c := range h.Checks {
		switch {
		case c.Multi:
			expected += len(c.IDs)
		case len(c.IDs) > 0:
			expected++
		}
	}
	n, _ := body.Lookup("n").AsInt64OK()
	upserted := 0
	if arr, ok := body.Lookup("upserted").ArrayOK(); ok {
		vals, _ := arr.Values()
		upserted = len(vals)
	}
	dupKey := false
	var errs []bsoncore.Document
	if arr, ok := body.Lookup("writeErrors").ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, ok := v.DocumentOK(); ok {
				errs = append(errs, d)
				if code, _ := d.Lookup("code").AsInt64OK(); code == int64(mongoerr.DuplicateKey) {
					dupKey = true
				}
			}
		}
	}
	if int(n)+upserted >= expected && !dupKey {
		return nil
	}
	out := h.fencedOut(ctx)
	if len(out) == 0 {
		return nil
	}
	h.FencedOut.Add(float64(len(out)))
	// Each fenced-out statement becomes a write error at its index,
	// replacing the duplicate-key error of a fenced-out upsert.
	byIndex := map[int]bsoncore.Document{}
	for _, d := range errs {
		i, _ := d.Lookup("index").AsInt64OK()
		byIndex[int(i)] = d
	}
	for i, msg := range out {
		info := bsoncore.AppendDocumentElement(nil, "errInfo", bsoncore.NewDocumentBuilder().AppendDocument("lockgate",
			bsoncore.NewDocumentBuilder().AppendString("reason", ReasonFencedOut).Build()).Build())
		byIndex[i] = (&mongoerr.Error{Code: mongoerr.LockBusy, Msg: msg}).WriteError(i, info)
	}
	idx := make([]int, 0, len(byIndex))
	for i := range byIndex {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	arr := bsoncore.NewArrayBuilder()
	for _, i := range idx {
		arr.AppendDocument(byIndex[i])
	}
	b := bsoncore.NewDocumentBuilder()
	elems, _ := body.Elements()
	for _, e := range elems {
		if e.Key() != "writeErrors" {
			b.AppendValue(e.Key(), e.Value())
		}
	}
	return b.AppendArray("writeErrors", arr.Build()).Build()
}

func (h *Hook) findAndModify(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	ok, _ := body.Lookup("ok").AsInt64OK()
	if ok == 1 {
		if n, _ := body.Lookup("lastErrorObject", "n").AsInt64OK(); n > 0 {
			return nil
		}
	} else if code, _ := body.Lookup("code").AsInt64OK(); code != int64(mongoerr.DuplicateKey) {
		return nil
	}
	out := h.fencedOut(ctx)
	msg, found := out[0]
	if !found {
		return nil
	}
	h.FencedOut.Inc()
	e := &refuse.Error{Code: mongoerr.LockBusy, Reason: ReasonFencedOut, NS: h.Checks[0].NS.String(), Msg: msg}
	return e.Document()
}

// fencedOut reads the stamps and returns, by statement index, the error
// message of each fenced-out statement.
func (h *Hook) fencedOut(ctx context.Context) map[int]string {
	out := map[int]string{}
	byNS := map[namespace.Namespace][]docid.ID{}
	for _, c := range h.Checks {
		byNS[c.NS] = append(byNS[c.NS], c.IDs...)
	}
	stamps := map[docid.Key]bson.RawValue{} // stamp of an existing document
	read := map[namespace.Namespace]bool{}
	for ns, ids := range byNS {
		if len(ids) == 0 {
			continue
		}
		st, exists, err := h.DB.FenceStamps(ctx, ns, h.Checks[0].Field, ids)
		if err != nil {
			// The write was refused or matched nothing; which one cannot
			// be told. The reply goes through as the database sent it.
			h.Log.Warn("fence: cannot read the stamps after a short reply", zap.String("ns", ns.String()), zap.Error(err))
			continue
		}
		read[ns] = true
		for j, id := range ids {
			if exists[j] {
				stamps[docid.KeyOf(ns, id)] = st[j]
			}
		}
	}
	for _, c := range h.Checks {
		if !read[c.NS] {
			continue
		}
		for i, id := range c.IDs {
			s, ok := stamps[docid.KeyOf(c.NS, id)]
			if !ok || s.Type == 0 || s.Type == bson.TypeNull {
				continue // gone, or never stamped: not fenced out
			}
			st, isToken := StampToken(s)
			if isToken && st == c.Tokens[i] {
				continue
			}
			what := "a document its filter matched"
			if c.Named[i] {
				what = "_id " + id.String()
			}
			if !isToken {
				out[c.Index] = fmt.Sprintf("lockgate: %s on %s fenced out: the fence field of %s holds %s, not a fencing token (written before the fence was turned on, or by a writer the rule does not cover), so the database refused the write and nothing was written there; take the lock again with acquireLock, which replaces the value with its token",
					h.Command, c.NS, what, DescribeStamp(s))
				break
			}
			out[c.Index] = fmt.Sprintf("lockgate: %s on %s fenced out: this session's lock on %s (token %d) had passed to a newer holder (the document carries token %s) when the write reached the database, so the database refused it and nothing was written there; acquire the lock again and redo the work from a fresh read",
				h.Command, c.NS, what, c.Tokens[i], stampString(s))
			break
		}
	}
	return out
}

func stampString(v bson.RawValue) string {
	if n, ok := v.AsInt64OK(); ok {
		return fmt.Sprint(n)
	}
	return v.String()
}

// StampToken reads a fence field as a token: an integral number. Anything
// else (null and a missing field included) is not one.
func StampToken(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return v.AsInt64OK()
	case bson.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// DescribeStamp names what a fence field holds, without its content (it
// may be application data).
func DescribeStamp(v bson.RawValue) string {
	if v.Type == 0 {
		return "nothing"
	}
	return "a value of type " + v.Type.String()
}
