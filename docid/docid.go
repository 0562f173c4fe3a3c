// Package docid is a document's _id as lockgate carries it from the wire
// to the lock store and back: the BSON value as the client sent it, which
// pinned statements, replies and messages repeat byte for byte, together
// with its canonical key, which is what a lock is taken on. Two ids are
// one lock exactly when MongoDB's _id index holds them equal, so 1,
// NumberLong(1) and 1.0 are one ID by Equal, while each keeps its own
// bytes.
//
// An ID is made once, where the value enters the proxy (a filter's pin,
// a lock command, a resolved document, a lock record), and validated
// then: every ID is a valid _id, and nothing downstream validates or
// canonicalises it again.
package docid

import (
	"errors"
	"fmt"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// ErrInvalid: a value that cannot be a document _id (array, regex,
// undefined, "$"-prefixed field, malformed BSON).
var ErrInvalid = errors.New("invalid _id for a lock")

// ID is one document _id. The zero ID is no id (IsZero); every other ID is
// valid. An ID is a small value, copied freely; it shares its bytes with
// whatever it was made from (New) or with the other ids of its batch
// (Copy), and nothing ever modifies them.
type ID struct {
	typ bsontype.Type
	// tag is a fingerprint of key (keyTag), made with it: a memo of one
	// document's lock check tells itself from its neighbours' by it
	// without reading their keys (lockstore.HeldMemos). It sits in typ's
	// padding, so an ID is no larger for it.
	tag uint32
	val []byte
	key string
}

// New makes the ID of v, keeping v's bytes: they must not change while
// the ID is in use.
func New(v bson.RawValue) (ID, error) {
	b := keyBuf{b: make([]byte, 0, len(v.Value)+8)} // most ids encode to about their own size
	if err := appendKey(&b, v); err != nil {
		return ID{}, err
	}
	key := b.asString()
	return ID{typ: v.Type, tag: keyTag(key), val: v.Value, key: key}, nil
}

// Copy makes the IDs of vs, which usually point into a request's buffer,
// with their own copy of the bytes: values and keys each in one
// allocation, whatever the number of ids (the usual ids: a number, a
// string, an ObjectId; a nested document costs its elements' slice).
func Copy(vs []bsoncore.Value) ([]ID, error) {
	if len(vs) == 1 {
		if ids, ok, err := copyOne(vs[0]); ok || err != nil {
			return ids, err
		}
	}
	n := 0
	for _, v := range vs {
		n += len(v.Data)
	}
	buf := make([]byte, 0, n)
	keys := keyBuf{b: make([]byte, 0, n+8*len(vs))}
	var endsBuf [8]int // a write names one id or few
	ends := endsBuf[:0]
	if len(vs) > len(endsBuf) {
		ends = make([]int, 0, len(vs))
	}
	ends = ends[:len(vs)]
	out := make([]ID, len(vs))
	for i, v := range vs {
		at := len(buf)
		buf = append(buf, v.Data...)
		val := buf[at:len(buf):len(buf)]
		if err := appendKey(&keys, bson.RawValue{Type: v.Type, Value: val}); err != nil {
			return nil, err
		}
		ends[i] = keys.Len()
		out[i] = ID{typ: v.Type, val: val}
	}
	all, at := keys.asString(), 0
	for i := range out {
		out[i].key = all[at:ends[i]]
		out[i].tag = keyTag(out[i].key)
		at = ends[i]
	}
	return out, nil
}

// oneID is the single id of a write that pins one, its value and
// (usually) its key in one allocation: the usual _id (a number, an
// ObjectId, a short string) and its key take well under len(b) bytes.
type oneID struct {
	ids [1]ID
	b   [48]byte
}

// copyOne is Copy of one value in one allocation, false for a value
// longer than oneID holds. A key that outgrows the room left is built
// on the heap instead (the value stays in the box).
func copyOne(v bsoncore.Value) (_ []ID, ok bool, _ error) {
	box := new(oneID)
	if len(v.Data) > len(box.b) {
		return nil, false, nil
	}
	n := copy(box.b[:], v.Data)
	val := box.b[:n:n]
	key := keyBuf{b: box.b[n:n]}
	if err := appendKey(&key, bson.RawValue{Type: v.Type, Value: val}); err != nil {
		return nil, true, err
	}
	k := key.asString()
	box.ids[0] = ID{typ: v.Type, tag: keyTag(k), val: val, key: k}
	return box.ids[:], true, nil
}

// Of makes the ID of a Go value (marshalled as BSON), for callers that
// build ids rather than read them: tests, the admin API's JSON.
func Of(v any) (ID, error) {
	t, b, err := bson.MarshalValue(v)
	if err != nil {
		return ID{}, errors.Join(ErrInvalid, err)
	}
	return New(bson.RawValue{Type: t, Value: b})
}

// Type is the BSON type of the id as sent.
func (id ID) Type() bsontype.Type { return id.typ }

// Raw is the id as sent.
func (id ID) Raw() bson.RawValue { return bson.RawValue{Type: id.typ, Value: id.val} }

// Core is the id as sent, for building BSON with bsoncore.
func (id ID) Core() bsoncore.Value { return bsoncore.Value{Type: id.typ, Data: id.val} }

// Key is the canonical key: equal for two ids exactly when they are one
// document's _id. It is binary, for maps and for the lock store's record
// names, not for people (String is).
func (id ID) Key() string { return id.key }

// KeyAt is Key read through a pointer, for a caller that holds the ID by
// one: Key's value receiver, called through a pointer, has the whole ID
// (six words) copied before its one field is read, on every call (the
// lock store's memo check, on every enforced write).
func (id *ID) KeyAt() string { return id.key }

// TagAt is a fingerprint of the id's key, read through a pointer as
// KeyAt: two ids that are one document's _id have one tag; two that are
// not usually have two, which is all it promises, so that it only ever
// spares a compare of keys that differ, never stands for one.
func (id *ID) TagAt() uint32 { return id.tag }

// keyTag is FNV-1a (32 bits) of k, and 0 for the zero ID's empty key. It
// is computed once, where the ID is made, and read on every lock check
// of the document after that.
func keyTag(k string) uint32 {
	if k == "" {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h ^= uint32(k[i])
		h *= 16777619
	}
	return h
}

// Key names one document's lock: its namespace and its _id's canonical
// key. Comparable, so it is a map key as it is, made without building a
// string.
type Key struct {
	NS namespace.Namespace
	ID string
}

// KeyOf is the Key of id in namespace ns.
func KeyOf(ns namespace.Namespace, id ID) Key { return Key{NS: ns, ID: id.key} }

// Equal reports whether id and o are one document's _id.
func (id ID) Equal(o ID) bool { return id.key == o.key }

// IsZero reports whether id is the zero ID, which names no document.
func (id ID) IsZero() bool { return id.typ == 0 }

// String renders the id for people (Format).
func (id ID) String() string { return Format(id.Raw()) }

// MarshalBSONValue makes an ID marshal as the id it is, wherever the
// driver meets one (a filter, a command): without it the driver would
// marshal the struct, an empty document, and match nothing.
func (id ID) MarshalBSONValue() (bsontype.Type, []byte, error) {
	if id.IsZero() {
		return 0, nil, fmt.Errorf("%w: the zero ID names no document", ErrInvalid)
	}
	return id.typ, id.val, nil
}

// Cores returns ids as sent, for building BSON with bsoncore.
func Cores(ids []ID) []bsoncore.Value {
	out := make([]bsoncore.Value, len(ids))
	for i, id := range ids {
		out[i] = id.Core()
	}
	return out
}
