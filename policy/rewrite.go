package policy

import (
	"fmt"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Pin restricts one statement, named as in Write (List and Index), to the
// verified ids (EditMessage applies it).
type Pin struct {
	List  string
	Index int
	IDs   []bsoncore.Value
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
