package docid

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestValidTypeIsWhatNewAccepts: one value of every BSON type is an ID by
// New exactly when ValidType says its type can be one, and Pinnable is
// ValidType less null, minKey and maxKey.
func TestValidTypeIsWhatNewAccepts(t *testing.T) {
	values := []any{1.5, "s", bson.D{{Key: "a", Value: 1}}, bson.A{1}, primitive.Binary{Data: []byte{1}},
		primitive.Undefined{}, primitive.NewObjectID(), true, primitive.DateTime(1), primitive.Null{},
		primitive.Regex{Pattern: "a"}, primitive.DBPointer{DB: "d", Pointer: primitive.NewObjectID()},
		primitive.JavaScript("x"), primitive.Symbol("s"), primitive.CodeWithScope{Code: "x", Scope: bson.D{}},
		int32(1), primitive.Timestamp{T: 1}, int64(1), primitive.NewDecimal128(0, 1), primitive.MinKey{}, primitive.MaxKey{}}
	seen := map[bsontype.Type]bool{}
	for _, v := range values {
		typ, data, err := bson.MarshalValue(v)
		if err != nil {
			t.Fatal(err)
		}
		seen[typ] = true
		_, err = New(bson.RawValue{Type: typ, Value: data})
		if (err == nil) != ValidType(typ) {
			t.Errorf("%v: New error %v, ValidType %v", typ, err, ValidType(typ))
		}
		wantPin := ValidType(typ) && typ != bson.TypeNull && typ != bson.TypeMinKey && typ != bson.TypeMaxKey
		if Pinnable(typ) != wantPin {
			t.Errorf("%v: Pinnable %v", typ, Pinnable(typ))
		}
	}
	if len(seen) != 21 {
		t.Errorf("covered %d BSON types, want all 21", len(seen))
	}
	if ValidType(0) || Pinnable(0) {
		t.Error("no value is a valid _id")
	}
}

func TestSameComparesCanonicalKeys(t *testing.T) {
	val := func(v any) bsoncore.Value {
		typ, data, err := bson.MarshalValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return bsoncore.Value{Type: typ, Data: data}
	}
	for _, tt := range []struct {
		a, b any
		same bool
	}{
		{int32(1), int64(1), true},
		{int32(1), 1.0, true},
		{"1", int32(1), false},
		{"a", primitive.Symbol("a"), true},
		{bson.D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}, bson.D{{Key: "b", Value: 2}, {Key: "a", Value: 1}}, false},
		{bson.A{1}, bson.A{1}, false}, // no _id at all
	} {
		if got := Same(val(tt.a), val(tt.b)); got != tt.same {
			t.Errorf("Same(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.same)
		}
	}
}
