package policy

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// maxFilterDepth bounds the recursion over $and/$or; wire already refuses
// documents nested deeper than the server's limit.
const maxFilterDepth = 200

// PinnedIDs returns the _id values a filter pins by MongoDB equality, when
// it provably restricts the matched documents to a known finite set; the
// set is a superset of what the filter can match (the engine compares the
// values the way MongoDB does: 1, NumberLong(1) and 1.0 are one key).
//
// A conjunct pins when it is
//   - `_id: v` where v is not a regex, an array, null, undefined, minKey or
//     maxKey, and not a document whose first key starts with "$" (a
//     document that does not is a literal: `_id: {a: 1}` pins {a: 1});
//   - `_id: {$eq: v}` with v as above except that a document is always
//     literal (`{$eq: {$gt: 1}}` pins the document {$gt: 1});
//   - `_id: {$in: [v...]}` when no element is a regex, an array, null,
//     undefined, minKey or maxKey; other operators beside $eq/$in in the
//     same document ({$in: [...], $ne: 3}) are ANDed and do not matter;
//   - `$and: [...]`: every conjunct of every element counts;
//   - `$or: [...]` when every branch pins: the union of the branches.
//
// Conditions at the top level are ANDed, so any pinning conjunct pins the
// filter whatever the others are ($expr, $where, $jsonSchema, $nor, other
// fields). When several conjuncts pin, the smallest set is returned (the
// first of equal sizes): each alone is a superset of the matches, and
// choosing one needs no MongoDB value comparison, which an intersection
// would, so a comparison mistake can never shrink the set. Values are
// deduplicated byte for byte only.
//
// ok with no ids means the filter matches no document (`_id: {$in: []}`).
// hasString reports whether a returned value is or contains a string (or
// symbol): under a non-simple collation "abc" may match "ABC", so the
// engine treats such pins as unpinned there. The returned values are views
// into filter.
func PinnedIDs(filter bsoncore.Document) (ids []bsoncore.Value, hasString bool, ok bool) {
	ids, hasString, ok, _ = PinnedIDsUpTo(filter, math.MaxInt)
	return ids, hasString, ok
}

// PinnedIDsUpTo is PinnedIDs for a caller that accepts at most limit
// pinned values (the rule's maxCandidates). A list of values stops being
// collected at its limit+1st distinct value; the rest of it is only
// checked for values that cannot pin, so the work that grows with the
// number of ids (de-duplication, and everything the caller does with
// them) is bounded by limit. over reports that the filter pins, but only
// with more than limit values (ok is then false); a filter that does not
// pin at all is neither ok nor over.
func PinnedIDsUpTo(filter bsoncore.Document, limit int) (ids []bsoncore.Value, hasString, ok, over bool) {
	return PinnedIDsInto(nil, filter, limit)
}

// PinnedIDsInto is PinnedIDsUpTo returning a single pinned value (the
// usual `_id: v` or `{$eq: v}`) in buf[:1], the caller's room, so that it
// allocates nothing; a set of several values is made as before.
func PinnedIDsInto(buf []bsoncore.Value, filter bsoncore.Document, limit int) (ids []bsoncore.Value, hasString, ok, over bool) {
	p := pinner{limit: limit}
	r := p.pinsOf(filter, 0)
	if !r.ok {
		return nil, false, false, r.over
	}
	ids = r.set
	if r.single {
		ids = append(buf[:0], r.one)
	}
	for _, v := range ids {
		if containsString(v, 0) {
			hasString = true
			break
		}
	}
	return ids, hasString, true, false
}

// pinner reads the pins of one filter, at most limit values per set.
type pinner struct {
	limit int
}

// pins is what a clause pins: ok with its set (at most limit values), or
// over (it pins, with more than limit values), or neither (it does not
// pin).
type pins struct {
	set      []bsoncore.Value
	ok, over bool
	// single: the set is the one value one (set is nil), kept by value
	// so that no slice is made for it.
	single bool
	one    bsoncore.Value
}

// pinOne is the set of the one value v.
func pinOne(v bsoncore.Value) pins { return pins{ok: true, single: true, one: v} }

// size is the number of values in the set.
func (r pins) size() int {
	if r.single {
		return 1
	}
	return len(r.set)
}

// pinsOf returns the smallest pin set among the conjuncts of filter.
func (p *pinner) pinsOf(filter []byte, depth int) pins {
	var best pins
	over := false
	consider := func(r pins) {
		switch {
		case r.ok && (!best.ok || r.size() < best.size()):
			best = r
		case r.over:
			over = true
		}
	}
	if depth > maxFilterDepth {
		return pins{}
	}
	it := iterate(filter)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		switch string(k) {
		case "_id":
			consider(p.idCondition(v))
		case "$and":
			arr, ok := v.ArrayOK()
			if !ok {
				continue
			}
			at := iterate(arr)
			for {
				_, c, ok := at.next()
				if !ok {
					break
				}
				if d, ok := c.DocumentOK(); ok {
					consider(p.pinsOf(d, depth+1))
				}
			}
		case "$or":
			consider(p.orPins(v, depth))
		}
	}
	if it.bad {
		return pins{}
	}
	if best.ok {
		return best
	}
	return pins{over: over}
}

// orPins returns the union of the branches of an $or when every branch
// pins.
func (p *pinner) orPins(v bsoncore.Value, depth int) pins {
	arr, ok := v.ArrayOK()
	if !ok {
		return pins{}
	}
	var union pinSet
	n, over := 0, false
	it := iterate(arr)
	for {
		_, b, ok := it.next()
		if !ok {
			break
		}
		d, ok := b.DocumentOK()
		if !ok {
			return pins{}
		}
		// Every branch must pin, over the limit or not, for the $or to.
		r := p.pinsOf(d, depth+1)
		switch {
		case !r.ok && !r.over:
			return pins{}
		case r.over:
			over = true
		case !over:
			if r.single {
				union.add(r.one)
			}
			for _, id := range r.set {
				union.add(id)
			}
			over = len(union.list) > p.limit
		}
		n++
	}
	if it.bad || n == 0 {
		return pins{}
	}
	if over {
		return pins{over: true}
	}
	return pins{set: union.values(), ok: true}
}

// idCondition returns the set that the value of a top-level _id condition
// pins.
func (p *pinner) idCondition(v bsoncore.Value) pins {
	if !pinnable(v) {
		return pins{}
	}
	d, isDoc := v.DocumentOK()
	if !isDoc || !isOperatorDoc(d) {
		return pinOne(v)
	}
	var best pins
	over := false
	it := iterate(d)
	for {
		k, op, ok := it.next()
		if !ok {
			break
		}
		var r pins
		switch string(k) {
		case "$eq":
			if !pinnable(op) {
				continue
			}
			r = pinOne(op)
		case "$in":
			r = p.inPins(op)
		default:
			continue
		}
		switch {
		case r.ok && (!best.ok || r.size() < best.size()):
			best = r
		case r.over:
			over = true
		}
	}
	if it.bad {
		return pins{}
	}
	if best.ok {
		return best
	}
	return pins{over: over}
}

func (p *pinner) inPins(v bsoncore.Value) pins {
	arr, ok := v.ArrayOK()
	if !ok {
		return pins{}
	}
	var set pinSet
	over := false
	it := iterate(arr)
	for {
		_, e, ok := it.next()
		if !ok {
			break
		}
		if !pinnable(e) {
			return pins{}
		}
		if !over {
			set.add(e)
			over = len(set.list) > p.limit
		}
	}
	if it.bad {
		return pins{}
	}
	if over {
		return pins{over: true}
	}
	return pins{set: set.values(), ok: true}
}

// isOperatorDoc reports whether the server reads d, the value of a field
// condition, as operators: its first key starts with "$".
func isOperatorDoc(d []byte) bool {
	it := iterate(d)
	k, _, ok := it.next()
	return ok && len(k) > 0 && k[0] == '$'
}

// pinnable reports whether equality with v matches exactly the documents
// whose _id equals v (docid.Pinnable).
func pinnable(v bsoncore.Value) bool { return docid.Pinnable(v.Type) }

func addUnique(set []bsoncore.Value, v bsoncore.Value) []bsoncore.Value {
	for _, s := range set {
		if same(s, v) {
			return set
		}
	}
	return append(set, v)
}

// pinSetIndexAt is the size from which a pinSet indexes its values: below
// it a scan is cheaper than hashing, above it the scan makes a filter with
// n pinned ids cost n² (50,000 ids took 12 s of the connection's CPU).
const pinSetIndexAt = 16

// pinSet collects values without duplicates (byte for byte), in the order
// first seen, in time linear in the number of values added. Above
// pinSetIndexAt it indexes the values by a seeded hash of type and bytes:
// no allocation per value, and a client cannot choose colliding ids
// without knowing the seed (a collision costs a scan, never a wrong
// answer).
type pinSet struct {
	list  []bsoncore.Value
	seed  maphash.Seed
	index map[uint64]int32 // hash -> position in list; nil below pinSetIndexAt
}

func (p *pinSet) add(v bsoncore.Value) {
	if p.index == nil {
		p.list = addUnique(p.list, v)
		if len(p.list) == pinSetIndexAt {
			p.seed = maphash.MakeSeed()
			p.index = make(map[uint64]int32, 4*pinSetIndexAt)
			for i, s := range p.list {
				p.index[p.hash(s)] = int32(i)
			}
		}
		return
	}
	h := p.hash(v)
	if i, seen := p.index[h]; seen {
		if same(p.list[i], v) {
			return
		}
		// A hash collision between different values: fall back to the
		// exact scan for this one value.
		for _, s := range p.list {
			if same(s, v) {
				return
			}
		}
		p.list = append(p.list, v)
		return
	}
	p.index[h] = int32(len(p.list))
	p.list = append(p.list, v)
}

func (p *pinSet) hash(v bsoncore.Value) uint64 {
	var h maphash.Hash
	h.SetSeed(p.seed)
	_ = h.WriteByte(byte(v.Type))
	_, _ = h.Write(v.Data)
	return h.Sum64()
}

// values returns the set; never nil, so an empty $in pins no document
// rather than nothing.
func (p *pinSet) values() []bsoncore.Value {
	if p.list == nil {
		return []bsoncore.Value{}
	}
	return p.list
}

func same(a, b bsoncore.Value) bool {
	return a.Type == b.Type && bytes.Equal(a.Data, b.Data)
}

// containsString reports whether v is or contains a string or a symbol.
func containsString(v bsoncore.Value, depth int) bool {
	switch v.Type {
	case bson.TypeString, bson.TypeSymbol:
		return true
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		if depth > maxFilterDepth {
			return true
		}
		it := iterate(v.Data)
		for {
			_, e, ok := it.next()
			if !ok {
				return it.bad
			}
			if containsString(e, depth+1) {
				return true
			}
		}
	}
	return false
}

// iterator walks the elements of a document or array without allocating.
// bad is set when an element cannot be read.
type iterator struct {
	rest []byte
	bad  bool
}

func iterate(d []byte) iterator {
	if len(d) < 5 {
		return iterator{bad: len(d) != 0}
	}
	return iterator{rest: d[4 : len(d)-1]}
}

func (it *iterator) next() (key []byte, v bsoncore.Value, ok bool) {
	if len(it.rest) == 0 || it.bad {
		return nil, bsoncore.Value{}, false
	}
	e, rest, ok := bsoncore.ReadElement(it.rest)
	if !ok {
		it.bad = true
		return nil, bsoncore.Value{}, false
	}
	it.rest = rest
	return e.KeyBytes(), e.Value(), true
}

// fields holds the values fieldsOf finds; an array, so that reading a
// statement allocates nothing.
type fields [8]bsoncore.Value

// fieldsOf returns the values of the named fields of d (at most 8), the
// zero Value for an absent one. A named field that appears twice is an
// error: the server refuses duplicate fields in commands and statements,
// and a proxy must never judge a different value than the one the server
// reads.
func fieldsOf(d bsoncore.Document, names ...string) (fields, error) {
	var out fields
	err := fieldsInto(&out, d, names...)
	return out, err
}

// fieldsInto is fieldsOf into out, which must be zero: the statement
// readers of every write keep their fields in their own frame rather than
// have 256 bytes zeroed and copied back on each call, on a stack whose
// lines the other connections' work has evicted since the last request.
func fieldsInto(out *fields, d bsoncore.Document, names ...string) error {
	if len(names) > len(out) {
		return fmt.Errorf("too many fields")
	}
	it := iterate(d)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		for i, n := range names {
			if string(k) != n {
				continue
			}
			if out[i].Type != 0 {
				return fmt.Errorf("field %q appears twice", n)
			}
			out[i] = v
		}
	}
	if it.bad {
		return fmt.Errorf("unreadable document")
	}
	return nil
}

func requiredDoc(v bsoncore.Value, name string) (bsoncore.Document, error) {
	if v.Type == 0 {
		return nil, fmt.Errorf("%s is missing", name)
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, fmt.Errorf("%s is a %v, not a document", name, v.Type)
	}
	return d, nil
}

func optionalDoc(v bsoncore.Value, name string) (bsoncore.Document, error) {
	if v.Type == 0 {
		return nil, nil
	}
	return requiredDoc(v, name)
}

// updateValue checks an update: a document (modifiers or replacement) or
// an array (pipeline).
func updateValue(v bsoncore.Value, name string) (bsoncore.Value, error) {
	switch v.Type {
	case 0:
		return v, fmt.Errorf("%s is missing", name)
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		return v, nil
	default:
		return bsoncore.Value{}, fmt.Errorf("%s is a %v, neither a document nor a pipeline", name, v.Type)
	}
}

// truthy reads a boolean option. Absent is false. The server's IDL wants a
// bool; numbers are read as the server reads a truthy value (non-zero is
// true), which can only make a statement look wider than it is. Anything
// else is refused.
func truthy(v bsoncore.Value, name string) (bool, error) {
	switch v.Type {
	case 0:
		return false, nil
	case bson.TypeBoolean:
		return v.Boolean(), nil
	case bson.TypeInt32:
		return v.Int32() != 0, nil
	case bson.TypeInt64:
		return v.Int64() != 0, nil
	case bson.TypeDouble:
		return v.Double() != 0, nil // NaN is true, as for the server
	default:
		return false, fmt.Errorf("%s is a %v, not a boolean", name, v.Type)
	}
}
