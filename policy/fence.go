package policy

import (
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Fence makes one statement of a document-fenced namespace apply only
// where the document's fence field holds the writer's fencing token (or no
// token at all: a document that no fenced acquireLock has stamped yet), and
// keeps the field the proxy's alone: what the statement writes carries the
// writer's token, and a client's own value for the field is dropped.
//
// IDs are the documents the statement may touch (its pinned or verified
// _ids, and the _id an upsert would insert), Tokens the writer's token for
// each, in the same order. For an insert (List "documents") IDs and Tokens
// hold the inserted _id and the token of the writer's lock on it, or are
// empty when the writer holds none: the document is then inserted
// without the field.
//
// EditMessage rewrites a fenced statement so:
//
//   - its filter gains, ANDed as a pin is, {F: {$in: [t, null], $not:
//     {$type: "array"}}} when every id has the token t, or {$or: [{_id: id,
//     F: {...}}, ...]} with each id's token when the tokens differ;
//   - an update with operators loses any $set/$setOnInsert of F and gains
//     $set {F: t} (one token only); any other operator on F, or on a path
//     below it, is ErrFenceField;
//   - a replacement loses F and gains F: t; a pipeline gains a last stage
//     {$set: {F: {$literal: t}}}; with differing tokens both are
//     ErrFenceField, since which document they replace is not known;
//   - an inserted document loses F and gains F: t when a token is given.
//
// Every statement not named keeps its bytes; bulkWrite ops are fenced by
// the same rules (the guard refuses bulkWrite on a fenced namespace for
// now: its reply hook cannot read bulkWrite's per-op results).
type Fence struct {
	List   string
	Index  int
	Field  string
	IDs    []bsoncore.Value
	Tokens []int64
}

// ErrFenceField: the statement would change the fence field itself, or
// cannot carry one token to what it writes. The engine refuses it.
var ErrFenceField = errors.New("policy: fence field")

// oneToken returns the token every id of f shares.
func oneToken(f *Fence) (int64, bool) {
	if len(f.Tokens) == 0 {
		return 0, false
	}
	for _, t := range f.Tokens[1:] {
		if t != f.Tokens[0] {
			return 0, false
		}
	}
	return f.Tokens[0], true
}

// fenceClause is the condition a fenced statement's documents must meet.
// null in $in also matches a missing field: a document no fenced
// acquireLock has stamped (created by an unlocked insert, or there before
// the fence was enabled) can be written by the current holder, whose write
// then stamps it. An array never matches: $in would match one holding the
// token or null among its elements, so a field poisoned with [null] would
// let every stale holder in; acquireLock replaces such a value with its
// token (guard.StampFence).
func fenceClause(f *Fence) bsoncore.Document {
	match := func(t int64) bsoncore.Document {
		return bsoncore.NewDocumentBuilder().AppendArray("$in",
			bsoncore.NewArrayBuilder().AppendInt64(t).AppendNull().Build()).
			AppendDocument("$not", bsoncore.NewDocumentBuilder().AppendString("$type", "array").Build()).Build()
	}
	if t, ok := oneToken(f); ok {
		return bsoncore.NewDocumentBuilder().AppendDocument(f.Field, match(t)).Build()
	}
	or := bsoncore.NewArrayBuilder()
	for i, id := range f.IDs {
		or.AppendDocument(bsoncore.NewDocumentBuilder().
			AppendValue("_id", id).
			AppendDocument(f.Field, match(f.Tokens[i])).Build())
	}
	if len(f.IDs) == 0 {
		// Nothing may be touched: a filter that matches nothing.
		return bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().
			AppendArray("$in", bsoncore.NewArrayBuilder().Build()).Build()).Build()
	}
	return bsoncore.NewDocumentBuilder().AppendArray("$or", or.Build()).Build()
}

// onField reports whether path is the fence field or below it.
func onField(path, field string) bool {
	return path == field || strings.HasPrefix(path, field+".")
}

// fenceUpdate rewrites an update (operators, replacement or pipeline).
func fenceUpdate(u bsoncore.Value, f *Fence) (bsoncore.Value, error) {
	t, one := oneToken(f)
	switch u.Type {
	case bson.TypeArray:
		if !one {
			return u, fmt.Errorf("%w: a pipeline update of documents locked under different tokens cannot carry one token; update them one by one", ErrFenceField)
		}
		vals, err := bsoncore.Array(u.Data).Values()
		if err != nil {
			return u, err
		}
		stage := bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().
			AppendDocument(f.Field, bsoncore.NewDocumentBuilder().AppendInt64("$literal", t).Build()).Build()).Build()
		vals = append(vals, bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: stage})
		ab := bsoncore.NewArrayBuilder()
		for _, v := range vals {
			ab.AppendValue(v)
		}
		return bsoncore.Value{Type: bson.TypeArray, Data: ab.Build()}, nil
	case bson.TypeEmbeddedDocument:
	default:
		return u, fmt.Errorf("update is a %v", u.Type)
	}
	d := bsoncore.Document(u.Data)
	it := iterate(d)
	k, _, ok := it.next()
	if !ok || !strings.HasPrefix(string(k), "$") {
		if !one {
			return u, fmt.Errorf("%w: a replacement that may replace documents locked under different tokens cannot carry one token; name one _id", ErrFenceField)
		}
		out, err := stampDocument(d, &Fence{Field: f.Field, Tokens: []int64{t}, IDs: f.IDs[:1]})
		return bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: out}, err
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+len(f.Field)+24))
	hasSet := false
	it = iterate(d)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		op := string(k)
		fields, isDoc := v.DocumentOK()
		if !isDoc {
			out = bsoncore.AppendValueElement(out, op, v)
			continue // the server refuses it
		}
		var kept []bsoncore.Element
		elems, err := fields.Elements()
		if err != nil {
			return u, err
		}
		for _, e := range elems {
			path := e.Key()
			if op == "$rename" {
				if to, ok := e.Value().StringValueOK(); ok && onField(to, f.Field) {
					return u, fmt.Errorf("%w: $rename to %q, the fence field", ErrFenceField, to)
				}
			}
			switch {
			case !onField(path, f.Field):
				kept = append(kept, e)
			case (op == "$set" || op == "$setOnInsert") && path == f.Field:
				// A read-modify-write echoing the document back: the
				// proxy's stamp replaces the client's copy.
			default:
				return u, fmt.Errorf("%w: %s of %q: the fence field %q is the proxy's; leave it alone", ErrFenceField, op, path, f.Field)
			}
		}
		if op == "$set" && one {
			hasSet = true
			kept = append(kept, bsoncore.AppendInt64Element(nil, f.Field, t))
		}
		if len(kept) == 0 {
			continue
		}
		didx, nd := bsoncore.AppendDocumentStart(nil)
		for _, e := range kept {
			nd = append(nd, e...)
		}
		nd, _ = bsoncore.AppendDocumentEnd(nd, didx)
		out = bsoncore.AppendDocumentElement(out, op, nd)
	}
	if it.bad {
		return u, fmt.Errorf("unreadable update")
	}
	if one && !hasSet {
		out = bsoncore.AppendDocumentElement(out, "$set", bsoncore.NewDocumentBuilder().AppendInt64(f.Field, t).Build())
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: out}, nil
}

// stampDocument drops the fence field from d and, given a token, appends
// it. An update that is a replacement must keep its _id first-or-absent as
// the client sent it, so the field goes last.
func stampDocument(d bsoncore.Document, f *Fence) (bsoncore.Document, error) {
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+len(f.Field)+16))
	it := iterate(d)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		if string(k) == f.Field {
			continue
		}
		out = bsoncore.AppendValueElement(out, string(k), v)
	}
	if it.bad {
		return nil, fmt.Errorf("unreadable document")
	}
	if len(f.Tokens) > 0 {
		out = bsoncore.AppendInt64Element(out, f.Field, f.Tokens[0])
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}
