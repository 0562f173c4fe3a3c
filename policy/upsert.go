package policy

import (
	"bytes"
	"math"
	"strings"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// UpsertID returns the _id that an upsert statement inserts when no
// document matches, when the statement determines it.
//
// The server builds the inserted document from the filter's equality
// conditions (`_id: v`, `_id: {$eq: v}`, a one-element $in, $all, inside
// $and or a one-branch $or) and then applies the update: a replacement's own _id,
// or `$set`/`$setOnInsert` of `_id` in a modifier document. found is false
// when the document would get a generated _id (nothing in the statement
// sets one), and for a statement that is not an upsert (nothing is
// inserted; certain is then true).
//
// certain is false when the _id cannot be known from the statement, which
// the engine must treat as "may insert any _id":
//   - the filter conditions _id in a way the server may copy but which is
//     no key (null, an array, a regex, minKey/maxKey, a dotted "_id.x"
//     path, two different equality values, an $or of several branches on
//     _id, a DBRef literal or an unknown operator);
//   - a modifier other than $set/$setOnInsert touches _id or a path below
//     it ($inc, $min, $max, $mul, $currentDate, $rename to _id, "_id.x"),
//     or sets a value different from the filter's;
//   - a replacement's _id differs from the filter's, or is not a valid _id;
//   - a pipeline update whose filter does not pin a single _id (a stage
//     may compute any _id);
//   - an update that is neither a document nor a pipeline.
func UpsertID(w Write) (id bsoncore.Value, found bool, certain bool) {
	if !w.Upsert || w.Remove || w.Kind == KindInsert || w.Kind == KindDelete || w.Kind == KindCollectionWrite {
		return bsoncore.Value{}, false, true
	}
	q, qFound, qCertain := filterEqualityID(w.Filter)
	if !qCertain {
		return bsoncore.Value{}, false, false
	}
	switch w.Update.Type {
	case bson.TypeArray:
		if qFound {
			return q, true, true
		}
		return bsoncore.Value{}, false, false
	case bson.TypeEmbeddedDocument:
	default:
		return bsoncore.Value{}, false, false
	}
	u := bsoncore.Document(w.Update.Data)
	var set bsoncore.Value
	setFound, ok := false, true
	if isOperatorDoc(u) {
		set, setFound, ok = modifierID(u)
	} else {
		set, setFound, ok = replacementID(u)
	}
	switch {
	case !ok:
		return bsoncore.Value{}, false, false
	case setFound && qFound && !sameValue(set, q):
		return bsoncore.Value{}, false, false
	case setFound:
		return set, true, true
	case qFound:
		return q, true, true
	default:
		return bsoncore.Value{}, false, true
	}
}

// InsertID returns the _id of an inserted document: found is false when
// the document has none (the server generates one); certain is false when
// the _id is not one the server can store (an array, a regex, undefined) or
// appears twice.
func InsertID(w Write) (id bsoncore.Value, found bool, certain bool) {
	if w.Kind != KindInsert {
		return bsoncore.Value{}, false, true
	}
	return replacementID(w.Doc)
}

// replacementID reads the _id of a whole document.
func replacementID(d bsoncore.Document) (bsoncore.Value, bool, bool) {
	f, err := fieldsOf(d, "_id")
	if err != nil {
		return bsoncore.Value{}, false, false
	}
	switch {
	case f[0].Type == 0:
		return bsoncore.Value{}, false, true
	case !docid.ValidType(f[0].Type):
		return bsoncore.Value{}, false, false
	}
	return f[0], true, true
}

// modifierID reads $set/$setOnInsert of _id from a modifier document;
// ok=false when any other modifier touches _id.
func modifierID(u bsoncore.Document) (id bsoncore.Value, found bool, ok bool) {
	it := iterate(u)
	for {
		op, spec, more := it.next()
		if !more {
			break
		}
		d, isDoc := spec.DocumentOK()
		if !isDoc {
			return bsoncore.Value{}, false, false
		}
		pt := iterate(d)
		for {
			path, v, more := pt.next()
			if !more {
				break
			}
			if string(op) == "$rename" {
				s, isStr := v.StringValueOK()
				if !isStr || touchesID(s) {
					return bsoncore.Value{}, false, false
				}
			}
			if !touchesID(string(path)) {
				continue
			}
			if (string(op) != "$set" && string(op) != "$setOnInsert") || string(path) != "_id" {
				return bsoncore.Value{}, false, false
			}
			if !docid.ValidType(v.Type) || (found && !sameValue(id, v)) {
				return bsoncore.Value{}, false, false
			}
			id, found = v, true
		}
		if pt.bad {
			return bsoncore.Value{}, false, false
		}
	}
	if it.bad {
		return bsoncore.Value{}, false, false
	}
	return id, found, true
}

func touchesID(path string) bool {
	return path == "_id" || strings.HasPrefix(path, "_id.")
}

func sameValue(a, b bsoncore.Value) bool {
	return a.Type == b.Type && bytes.Equal(a.Data, b.Data)
}

// filterEqualityID finds the _id the server copies from the filter into an
// upserted document.
func filterEqualityID(filter bsoncore.Document) (id bsoncore.Value, found bool, certain bool) {
	var cands []bsoncore.Value
	if !equalityIDs(filter, 0, &cands) {
		return bsoncore.Value{}, false, false
	}
	switch len(cands) {
	case 0:
		return bsoncore.Value{}, false, true
	case 1:
		return cands[0], true, true
	default:
		return bsoncore.Value{}, false, false
	}
}

// equalityIDs collects the equality _id values of the conjuncts of filter;
// false when a condition on _id makes the inserted _id unknowable.
func equalityIDs(filter []byte, depth int, cands *[]bsoncore.Value) bool {
	if depth > maxFilterDepth {
		return false
	}
	it := iterate(filter)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		key := string(k)
		switch {
		case key == "_id":
			if !equalityCondition(v, cands) {
				return false
			}
		case strings.HasPrefix(key, "_id."):
			return false
		case key == "$and":
			arr, ok := v.ArrayOK()
			if !ok {
				return false
			}
			at := iterate(arr)
			for {
				_, c, ok := at.next()
				if !ok {
					break
				}
				d, ok := c.DocumentOK()
				if !ok || !equalityIDs(d, depth+1, cands) {
					return false
				}
			}
			if at.bad {
				return false
			}
		case key == "$or":
			arr, ok := v.ArrayOK()
			if !ok {
				return false
			}
			var branches []bsoncore.Document
			at := iterate(arr)
			for {
				_, c, ok := at.next()
				if !ok {
					break
				}
				d, ok := c.DocumentOK()
				if !ok {
					return false
				}
				branches = append(branches, d)
			}
			if at.bad {
				return false
			}
			if len(branches) == 1 {
				if !equalityIDs(branches[0], depth+1, cands) {
					return false
				}
				continue
			}
			// Several branches: the server copies nothing from them, but
			// one that optimizes them into one equality would.
			for _, b := range branches {
				if mentionsID(b, depth+1) {
					r := (&pinner{limit: math.MaxInt}).orPins(v, depth)
					if !r.ok || len(r.set) != 1 {
						return false
					}
					*cands = addUnique(*cands, r.set[0])
					break
				}
			}
		}
	}
	return !it.bad
}

// equalityCondition handles the value of a top-level _id condition.
func equalityCondition(v bsoncore.Value, cands *[]bsoncore.Value) bool {
	d, isDoc := v.DocumentOK()
	if !isDoc || !isOperatorDoc(d) {
		if !pinnable(v) {
			return false
		}
		*cands = addUnique(*cands, v)
		return true
	}
	it := iterate(d)
	for {
		k, op, ok := it.next()
		if !ok {
			break
		}
		switch string(k) {
		case "$eq":
			if !pinnable(op) {
				return false
			}
			*cands = addUnique(*cands, op)
		case "$in", "$all":
			// A one-element $in is optimized into an equality; $all is
			// parsed into one equality per element.
			arr, ok := op.ArrayOK()
			if !ok {
				return false
			}
			vals, err := arr.Values()
			if err != nil {
				return false
			}
			if len(vals) == 1 || string(k) == "$all" {
				for _, v := range vals {
					if !pinnable(v) {
						return false
					}
					*cands = addUnique(*cands, v)
				}
			}
		default:
			// Operators the server copies nothing from; anything else
			// (a DBRef literal {$ref, $id}, an unknown operator) is
			// unknowable.
			if !nonEqualityOps[string(k)] {
				return false
			}
		}
	}
	return !it.bad
}

// nonEqualityOps are the field operators from which an upsert copies no
// value into the inserted document.
var nonEqualityOps = map[string]bool{
	"$gt": true, "$gte": true, "$lt": true, "$lte": true, "$ne": true, "$nin": true,
	"$exists": true, "$type": true, "$not": true, "$regex": true, "$options": true,
	"$mod": true, "$elemMatch": true, "$size": true, "$bitsAllSet": true,
	"$bitsAnySet": true, "$bitsAllClear": true, "$bitsAnyClear": true,
	"$geoWithin": true, "$geoIntersects": true, "$near": true, "$nearSphere": true,
	"$maxDistance": true, "$minDistance": true, "$within": true,
}

// mentionsID reports whether a filter has a condition on _id or below it
// anywhere in its logical operators.
func mentionsID(d []byte, depth int) bool {
	if depth > maxFilterDepth {
		return true
	}
	it := iterate(d)
	for {
		k, v, ok := it.next()
		if !ok {
			return it.bad
		}
		key := string(k)
		if touchesID(key) {
			return true
		}
		if key == "$and" || key == "$or" || key == "$nor" {
			at := iterate(v.Data)
			if v.Type != bson.TypeArray {
				continue
			}
			for {
				_, c, ok := at.next()
				if !ok {
					break
				}
				if c.Type == bson.TypeEmbeddedDocument && mentionsID(c.Data, depth+1) {
					return true
				}
			}
		}
	}
}
