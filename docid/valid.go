package docid

import (
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// ValidType reports whether a value of type t can be a document's _id at
// all: not an array, a regular expression, undefined, or no value. It is
// the first check New makes; New also refuses what is wrong inside a
// value ("$"-prefixed fields, nesting, malformed bytes).
func ValidType(t bsontype.Type) bool {
	switch t {
	case bson.TypeArray, bson.TypeRegex, bson.TypeUndefined, 0:
		return false
	}
	return true
}

// Pinnable reports whether a filter's equality with a value of type t
// matches exactly the documents whose _id is that value, so that lockgate
// may take it for the one document the statement can touch: a valid _id
// type, and not null, minKey or maxKey, which the query engine does not
// treat as one key (null also matches documents where the field is
// missing, in ways that depend on the server).
func Pinnable(t bsontype.Type) bool {
	switch t {
	case bson.TypeNull, bson.TypeMinKey, bson.TypeMaxKey:
		return false
	}
	return ValidType(t)
}

// Same reports whether a and b are one document's _id: equal canonical
// keys (NumberLong(1) and 1.0 are one _id), never their bytes. A value
// that is no valid _id is the same as nothing.
func Same(a, b bsoncore.Value) bool {
	ka, err := New(bson.RawValue{Type: a.Type, Value: a.Data})
	if err != nil {
		return false
	}
	kb, err := New(bson.RawValue{Type: b.Type, Value: b.Data})
	return err == nil && ka.Equal(kb)
}
