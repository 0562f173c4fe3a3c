package policy

import (
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Pin restricts one statement, named as in Write (List and Index), to the
// verified ids.
type Pin struct {
	List  string
	Index int
	IDs   []bsoncore.Value
}

// PinStatements returns msg re-encoded so that the filter of each pinned
// statement becomes {$and: [{_id: {$in: ids}}, <original filter>]}, or
// {_id: {$in: ids}} when the original filter is empty (an absent
// findAndModify query is added as such). Everything else keeps its meaning:
// the header ids, the OP_MSG flags (a checksum is recomputed), every other
// field and statement in order, document sequences stay sequences, an
// OP_QUERY keeps its $query wrapper and other fields. OP_COMPRESSED yields
// the rewritten inner message, uncompressed.
//
// It handles update and delete (statements in the body or in a kind-1
// section), findAndModify (List "", Index 0) and bulkWrite update and
// delete ops, over OP_MSG and OP_QUERY "<db>.$cmd". Legacy OP_UPDATE and
// OP_DELETE, inserts, collection writes, a pin that names no statement or
// one statement twice, a pinned value that is a regex or an array (in $in
// they would match by pattern or by element, widening the statement), and
// a statement whose filter is not a single document are errors: the engine
// then rejects the write. Pinning an empty IDs list is allowed: the
// statement then matches nothing.
//
// Note for upserts: a pinned upsert that no longer matches inserts a
// document whose _id the server copies from a one-element $in; the engine
// should only pin an upsert whose UpsertID it has checked, or pin more than
// one id, or refuse it.
//
// The result may exceed the size limits the message was read under; the
// caller checks it against the upstream's limits before sending it.
func PinStatements(msg wire.Message, cmd *wire.Command, pins []Pin) ([]byte, error) {
	return rewriteStatements("PinStatements", "pinned", msg, cmd, pins, func(cmd *wire.Command) (bsoncore.Document, []wire.Sequence, error) {
		return pinCommand(cmd, pins)
	})
}

// rewriteStatements is the envelope that PinStatements and FenceStatements
// share: it finds the command (inside OP_COMPRESSED too), refuses what
// cannot be rewritten and pinned ids that would widen a statement, lets
// edit build the new body and sequences, and re-encodes the message in its
// own opcode. op and verb name the caller in errors.
func rewriteStatements(op, verb string, msg wire.Message, cmd *wire.Command, pins []Pin,
	edit func(*wire.Command) (bsoncore.Document, []wire.Sequence, error)) ([]byte, error) {
	if c, ok := msg.(*wire.OpCompressed); ok {
		if c.Inner == nil {
			return nil, fmt.Errorf("policy: %s: OP_COMPRESSED without an inner message", op)
		}
		msg = c.Inner
	}
	switch msg.(type) {
	case *wire.OpMsg, *wire.OpQuery:
	default:
		return nil, fmt.Errorf("policy: %s: %v statements cannot be %s", op, msg.Header().OpCode, verb)
	}
	if cmd == nil {
		c, err := wire.CommandOf(msg)
		if err != nil {
			return nil, fmt.Errorf("policy: %s: %w", op, err)
		}
		if c == nil {
			return nil, fmt.Errorf("policy: %s: not a command", op)
		}
		cmd = c
	}
	for _, p := range pins {
		for _, id := range p.IDs {
			// In $in a regex matches by pattern and an array by element:
			// either would widen the statement instead of pinning it.
			if !docid.ValidType(id.Type) {
				return nil, fmt.Errorf("policy: %s: statement %q[%d]: a %v cannot be a pinned _id", op, p.List, p.Index, id.Type)
			}
		}
	}
	body, seqs, err := edit(cmd)
	if err != nil {
		return nil, fmt.Errorf("policy: %s: %s: %w", op, cmd.Name, err)
	}
	if q, ok := msg.(*wire.OpQuery); ok {
		query, err := rewrapQuery(q.Query, body)
		if err != nil {
			return nil, fmt.Errorf("policy: %s: OP_QUERY: %w", op, err)
		}
		return wire.WithBody(q, query)
	}
	// A copy of the OP_MSG keeps its flags and section order; only the
	// sequences and the body change.
	cp := *msg.(*wire.OpMsg)
	cp.Sequences = seqs
	return wire.WithBody(&cp, body)
}

// pinCommand returns the new body and sequences of cmd.
func pinCommand(cmd *wire.Command, pins []Pin) (bsoncore.Document, []wire.Sequence, error) {
	var list, key string
	switch cmd.Name {
	case "update":
		list, key = "updates", "q"
	case "delete":
		list, key = "deletes", "q"
	case "bulkWrite":
		list, key = "ops", "filter"
	case "findAndModify", "findandmodify":
		for _, p := range pins {
			if p.List != ListFindAndModify || p.Index != 0 {
				return nil, nil, fmt.Errorf("no statement %q[%d]", p.List, p.Index)
			}
		}
		if len(pins) > 1 {
			return nil, nil, fmt.Errorf("statement %q[0] pinned twice", ListFindAndModify)
		}
		if len(pins) == 0 {
			return cmd.Body, cmd.Sequences, nil
		}
		body, err := pinStatement(cmd.Body, "query", pins[0].IDs, true)
		return body, cmd.Sequences, err
	default:
		return nil, nil, fmt.Errorf("command has no statements to pin")
	}
	byIndex := make(map[int][]bsoncore.Value, len(pins))
	for _, p := range pins {
		if p.List != list {
			return nil, nil, fmt.Errorf("no statement list %q", p.List)
		}
		if _, dup := byIndex[p.Index]; dup {
			return nil, nil, fmt.Errorf("statement %q[%d] pinned twice", p.List, p.Index)
		}
		byIndex[p.Index] = p.IDs
	}
	docs, err := cmd.Documents(list)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pins {
		if p.Index < 0 || p.Index >= len(docs) {
			return nil, nil, fmt.Errorf("no statement %q[%d] among %d", list, p.Index, len(docs))
		}
	}
	rewritten := make([]bsoncore.Document, len(docs))
	for i, d := range docs {
		ids, ok := byIndex[i]
		if !ok {
			rewritten[i] = d
			continue
		}
		if list == "ops" {
			if err := checkBulkOp(d); err != nil {
				return nil, nil, fmt.Errorf("ops[%d]: %w", i, err)
			}
		}
		if rewritten[i], err = pinStatement(d, key, ids, false); err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", list, i, err)
		}
	}
	for si, s := range cmd.Sequences {
		if s.Identifier != list {
			continue
		}
		seqs := append([]wire.Sequence(nil), cmd.Sequences...)
		seqs[si] = wire.Sequence{Identifier: list, Documents: rewritten}
		return cmd.Body, seqs, nil
	}
	body, err := replaceField(cmd.Body, list, bsoncore.Value{Type: bson.TypeArray, Data: buildArray(rewritten)}, false)
	return body, cmd.Sequences, err
}

// checkBulkOp accepts only update and delete ops, by their first key.
func checkBulkOp(op bsoncore.Document) error {
	it := iterate(op)
	k, _, _ := it.next()
	if s := string(k); s != "update" && s != "delete" {
		return fmt.Errorf("a %q op has no filter to pin", s)
	}
	return nil
}

// pinStatement replaces the filter under key in stmt.
func pinStatement(stmt bsoncore.Document, key string, ids []bsoncore.Value, addIfMissing bool) (bsoncore.Document, error) {
	f, err := fieldsOf(stmt, key)
	if err != nil {
		return nil, err
	}
	orig := emptyDoc
	if f[0].Type != 0 || !addIfMissing {
		if orig, err = requiredDoc(f[0], key); err != nil {
			return nil, err
		}
	}
	filter := pinnedFilter(orig, ids)
	return replaceField(stmt, key, bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: filter}, addIfMissing)
}

// pinnedFilter restricts orig to ids. The filter's own top-level fields stay
// where they are, and the restriction joins its $and (or a new one): the
// server ANDs every top-level condition, and it builds an upsert's new
// document from the top-level equalities (FerretDB only from those), so
// wrapping the whole filter in $and would change what an upsert inserts.
// A filter whose $and is not an array is wrapped whole instead; the server
// refuses it either way.
func pinnedFilter(orig bsoncore.Document, ids []bsoncore.Value) bsoncore.Document {
	idx, in := bsoncore.AppendDocumentStart(nil)
	in = bsoncore.BuildArrayElement(in, "$in", ids...)
	in, _ = bsoncore.AppendDocumentEnd(in, idx)
	idx, pin := bsoncore.AppendDocumentStart(nil)
	pin = bsoncore.AppendDocumentElement(pin, "_id", in)
	pin, _ = bsoncore.AppendDocumentEnd(pin, idx)
	return joinClause(orig, pin)
}

// joinClause ANDs clause into orig the way pinnedFilter describes: as the
// first element of orig's own $and (or of a new one), the other top-level
// fields staying where they are.
func joinClause(orig, pin bsoncore.Document) bsoncore.Document {
	if len(orig) <= 5 {
		return pin
	}
	elems, err := orig.Elements()
	if err != nil {
		return wrapped(pin, orig)
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(orig)+len(pin)+16))
	joined := false
	for _, e := range elems {
		if e.Key() != "$and" || joined {
			out = append(out, e...)
			continue
		}
		arr, ok := e.Value().ArrayOK()
		if !ok {
			return wrapped(pin, orig)
		}
		vals, err := arr.Values()
		if err != nil {
			return wrapped(pin, orig)
		}
		aidx, a := bsoncore.AppendArrayStart(nil)
		a = bsoncore.AppendDocumentElement(a, "0", pin)
		for i, v := range vals {
			a = bsoncore.AppendValueElement(a, fmt.Sprint(i+1), v)
		}
		a, _ = bsoncore.AppendArrayEnd(a, aidx)
		out = bsoncore.AppendArrayElement(out, "$and", a)
		joined = true
	}
	if !joined {
		out = bsoncore.AppendArrayElement(out, "$and", buildArray([]bsoncore.Document{pin}))
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// wrapped is {$and: [pin, orig]}.
func wrapped(pin, orig bsoncore.Document) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendArrayElement(out, "$and", buildArray([]bsoncore.Document{pin, orig}))
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func buildArray(docs []bsoncore.Document) bsoncore.Array {
	idx, arr := bsoncore.AppendArrayStart(nil)
	for i, d := range docs {
		arr = bsoncore.AppendDocumentElement(arr, fmt.Sprint(i), d)
	}
	arr, _ = bsoncore.AppendArrayEnd(arr, idx)
	return arr
}

// replaceField copies d with the value of key replaced (appended when
// missing and add is set). key must appear at most once.
func replaceField(d bsoncore.Document, key string, v bsoncore.Value, add bool) (bsoncore.Document, error) {
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+len(v.Data)+len(key)+8))
	done := false
	it := iterate(d)
	for {
		k, old, ok := it.next()
		if !ok {
			break
		}
		if string(k) != key {
			out = bsoncore.AppendValueElement(out, string(k), old)
			continue
		}
		if done {
			return nil, fmt.Errorf("field %q appears twice", key)
		}
		done = true
		out = bsoncore.AppendValueElement(out, key, v)
	}
	if it.bad {
		return nil, fmt.Errorf("unreadable document")
	}
	if !done {
		if !add {
			return nil, fmt.Errorf("no field %q", key)
		}
		out = bsoncore.AppendValueElement(out, key, v)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

// rewrapQuery puts the new command body back into an OP_QUERY's query,
// inside the {$query: ..., $readPreference: ...} or {query: ...} wrapper
// when the command came in one.
// The test is wire's: the first key is $query or query and holds a
// document.
func rewrapQuery(query, newBody bsoncore.Document) (bsoncore.Document, error) {
	it := iterate(query)
	k, v, ok := it.next()
	if !ok || (string(k) != "$query" && string(k) != "query") || v.Type != bson.TypeEmbeddedDocument {
		return newBody, nil
	}
	// Only the first element is the command, as for wire and the server;
	// the rest of the wrapper is copied as is.
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(query)+len(newBody)))
	out = bsoncore.AppendDocumentElement(out, string(k), newBody)
	out = append(out, it.rest...)
	out, err := bsoncore.AppendDocumentEnd(out, idx)
	return out, err
}
