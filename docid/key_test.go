package docid

import (
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func dec(t *testing.T, s string) primitive.Decimal128 {
	t.Helper()
	d, err := primitive.ParseDecimal128(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func rv(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, b, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: b}
}

func key(t *testing.T, v any) string {
	t.Helper()
	id, err := New(rv(t, v))
	if err != nil {
		t.Fatalf("New(%v): %v", v, err)
	}
	if id.KeyAt() != id.Key() {
		t.Fatalf("%v: KeyAt %x, Key %x", v, id.KeyAt(), id.Key())
	}
	return id.Key()
}

func TestKeyEqual(t *testing.T) {
	groups := [][]any{
		{int32(1), int64(1), 1.0, dec(t, "1"), dec(t, "1.000"), dec(t, "0.1E1")},
		{0.0, math.Copysign(0, -1), int32(0), dec(t, "-0"), dec(t, "0E+10")},
		{0.5, dec(t, "0.50")},
		{math.NaN(), dec(t, "NaN")},
		{math.Inf(1), dec(t, "Infinity")},
		{"a", primitive.Symbol("a")},
		{bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: "x"}}, bson.D{{Key: "a", Value: 1.0}, {Key: "b", Value: "x"}}},
		{bson.D{{Key: "a", Value: bson.A{int32(1), 2.0}}}, bson.D{{Key: "a", Value: bson.A{int64(1), int32(2)}}}},
		{int64(math.MaxInt64)},
		// A double equals the decimal that is its value rounded to 34 digits,
		// as MongoDB converts it for the comparison.
		{0.1, dec(t, "0.1000000000000000055511151231257827")},
		{1e300, dec(t, "1.000000000000000052504760255204420E+300")},
	}
	for _, g := range groups {
		k0 := key(t, g[0])
		for _, v := range g[1:] {
			if k := key(t, v); k != k0 {
				t.Errorf("%#v and %#v should be one key: %s vs %s", g[0], v, k0, k)
			}
		}
	}
}

func TestKeyDistinct(t *testing.T) {
	vals := []any{
		int32(1), "1", 1.5, dec(t, "0.1"), 0.1, int64(2), true, false, primitive.Null{},
		1e300, dec(t, "1E+300"),
		primitive.MinKey{}, primitive.MaxKey{},
		bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(2)}},
		bson.D{{Key: "b", Value: int32(2)}, {Key: "a", Value: int32(1)}},
		bson.D{{Key: "a", Value: "1"}},
		bson.D{{Key: "a", Value: bson.A{int32(1)}}},
		bson.D{},
		primitive.ObjectID{1},
		primitive.ObjectID{2},
		primitive.DateTime(1),
		primitive.Timestamp{T: 1},
		primitive.Binary{Subtype: 0, Data: []byte{1}},
		primitive.Binary{Subtype: 4, Data: []byte{1}},
		primitive.JavaScript("1"),
		"",
	}
	seen := map[string]any{}
	for _, v := range vals {
		k := key(t, v)
		if prev, dup := seen[k]; dup {
			t.Errorf("%#v and %#v must be different keys", prev, v)
		}
		seen[k] = v
	}
}

func TestInvalid(t *testing.T) {
	for name, v := range map[string]bson.RawValue{
		"array":                   rv(t, bson.A{int32(1)}),
		"regex":                   rv(t, primitive.Regex{Pattern: "a"}),
		"undefined":               {Type: bson.TypeUndefined},
		"dollar":                  rv(t, bson.D{{Key: "$gt", Value: int32(1)}}),
		"nested $":                rv(t, bson.D{{Key: "a", Value: bson.D{{Key: "$in", Value: bson.A{}}}}}),
		"DBRef out of order":      rv(t, bson.D{{Key: "$id", Value: 1}, {Key: "$ref", Value: "c"}}),
		"DBRef $ref not a string": rv(t, bson.D{{Key: "$ref", Value: 1}, {Key: "$id", Value: 1}}),
		"DBRef without $id":       rv(t, bson.D{{Key: "$ref", Value: "c"}}),
		"DBRef $db first":         rv(t, bson.D{{Key: "$db", Value: "d"}, {Key: "$ref", Value: "c"}, {Key: "$id", Value: 1}}),
		"DBRef $db not a string":  rv(t, bson.D{{Key: "$ref", Value: "c"}, {Key: "$id", Value: 1}, {Key: "$db", Value: 2}}),
		"truncated":               {Type: bson.TypeInt64, Value: []byte{1, 2}},
		"empty":                   {},
	} {
		if _, err := New(v); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

// TestKeyGolden pins the canonical encoding: the lock store names its
// records by these keys, so a change here would make every lock held
// across an upgrade invisible to the new version.
func TestKeyGolden(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{int32(7), "0a0137"},
		{int64(7), "0a0137"},
		{2.5, "0a03352f32"},
		{dec(t, "2.50"), "0a03352f32"},
		{"abc", "0f03616263"},
		{primitive.ObjectID{1, 2, 3}, "23010203000000000000000000"},
		{bson.D{{Key: "a", Value: int64(1)}, {Key: "b", Value: bson.A{"x", true}}}, "140101610a013101016219010f01780128010000"},
		{primitive.DateTime(-1), "2d7fffffffffffffff"},
		{primitive.Timestamp{T: 5, I: 6}, "2f0000000500000006"},
		{primitive.Binary{Subtype: 4, Data: []byte{9, 8}}, "1e04020908"},
		{primitive.Null{}, "05"},
		{primitive.MinKey{}, "00"},
		{primitive.MaxKey{}, "7f"},
		{0.1, "0a46" + hex.EncodeToString([]byte("1000000000000000055511151231257827/10000000000000000000000000000000000"))},
	} {
		if got := hex.EncodeToString([]byte(key(t, c.v))); got != c.want {
			t.Errorf("key of %#v: %s, want %s", c.v, got, c.want)
		}
	}
}

// TestCopy: the ids of a batch own their bytes (the request's buffer is
// reused after the decision), keep each value's own type and bytes, and
// get the keys New gives them.
func TestCopy(t *testing.T) {
	vals := []any{int32(1), "a", 1.0, bson.D{{Key: "k", Value: "v"}}, strings.Repeat("z", 300)}
	buf := []byte{}
	var cores []bsoncore.Value
	for _, v := range vals {
		r := rv(t, v)
		at := len(buf)
		buf = append(buf, r.Value...)
		cores = append(cores, bsoncore.Value{Type: r.Type, Data: buf[at:len(buf):len(buf)]})
	}
	ids, err := Copy(cores)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0xff // the request's buffer, reused
	}
	for i, v := range vals {
		want, err := New(rv(t, v))
		if err != nil {
			t.Fatal(err)
		}
		if ids[i].Key() != want.Key() || !ids[i].Equal(want) {
			t.Errorf("id %d: key %x, want %x", i, ids[i].Key(), want.Key())
		}
		if ids[i].Type() != want.Type() || !bsoncore.Value.Equal(ids[i].Core(), want.Core()) {
			t.Errorf("id %d: %v, want %v (the value as sent)", i, ids[i].Raw(), want.Raw())
		}
	}
	if !ids[0].Equal(ids[2]) || ids[0].Type() == ids[2].Type() {
		t.Error("1 and 1.0 must be one id, each with its own type")
	}
	if _, err := Copy([]bsoncore.Value{cores[0], {Type: bson.TypeArray, Data: bsoncore.NewArrayBuilder().Build()}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an array among the ids: %v", err)
	}
	// The usual ids (strings, ObjectIds, small integers) cost the batch's
	// four allocations, whatever their number.
	var many []bsoncore.Value
	for i := range 50 {
		many = append(many, bsoncore.Value{Type: bson.TypeString, Data: bsoncore.AppendString(nil, strings.Repeat("s", i))},
			bsoncore.Value{Type: bson.TypeObjectID, Data: bsoncore.AppendObjectID(nil, primitive.NewObjectID())},
			bsoncore.Value{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, int32(i))})
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Copy(many) }); n > 4 {
		t.Errorf("Copy of %d ids: %v allocations, want at most 4", len(many), n)
	}
}

// TestCopyOne: the usual write's one id is one allocation (its slice,
// bytes and key together) for the usual _ids, and is in every case what
// Copy of a batch makes: its own bytes, New's key. Values and keys that
// outgrow the single allocation's room are covered too.
func TestCopyOne(t *testing.T) {
	vals := []any{int32(7), int32(123456), int64(-5), primitive.NewObjectID(), "a", strings.Repeat("s", 40),
		strings.Repeat("k", 55), strings.Repeat("v", 70), 0.1, dec(t, "2.50"), bson.D{{Key: "k", Value: "v"}},
		primitive.Binary{Subtype: 4, Data: make([]byte, 16)}, primitive.Null{}}
	for _, v := range vals {
		r := rv(t, v)
		buf := append([]byte(nil), r.Value...)
		ids, err := Copy([]bsoncore.Value{{Type: r.Type, Data: buf}})
		if err != nil {
			t.Fatalf("%#v: %v", v, err)
		}
		for i := range buf {
			buf[i] = 0xff // the request's buffer, reused
		}
		want, err := New(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 1 || ids[0].Key() != want.Key() || !bsoncore.Value.Equal(ids[0].Core(), want.Core()) {
			t.Errorf("%#v: %v key %x, want %v key %x", v, ids, ids[0].Key(), want.Raw(), want.Key())
		}
		// A second id made meanwhile shares nothing with the first.
		if other, err := Copy([]bsoncore.Value{{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 99)}}); err != nil || other[0].Equal(ids[0]) || ids[0].Key() != want.Key() {
			t.Errorf("%#v: changed by the next copy (%v)", v, err)
		}
	}
	if _, err := Copy([]bsoncore.Value{{Type: bson.TypeArray, Data: bsoncore.NewArrayBuilder().Build()}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an array: %v", err)
	}
	for _, v := range []bsoncore.Value{
		{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 7)},
		{Type: bson.TypeObjectID, Data: bsoncore.AppendObjectID(nil, primitive.NewObjectID())},
		{Type: bson.TypeString, Data: bsoncore.AppendString(nil, "order-2026-000123")},
	} {
		if n := testing.AllocsPerRun(100, func() { _, _ = Copy([]bsoncore.Value{v}) }); n > 1 {
			t.Errorf("Copy of one %v: %v allocations, want 1", v.Type, n)
		}
	}
}

// TestFormat: one format for an id in every message: numbers by value
// (they are one key whatever their type), the rest as typed in the shell
// or as relaxed extended JSON.
func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{"x", `"x"`},
		{int32(2), "2"},
		{int64(2), "2"},
		{2.5, "2.5"},
		{primitive.ObjectID{1}, `ObjectId("010000000000000000000000")`},
		{bson.D{{Key: "a", Value: int32(1)}}, `{"a":1}`},
		{primitive.NewDecimal128(0x3040000000000000, 7), `{"$numberDecimal":"7"}`},
	} {
		id, err := Of(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if got := id.String(); got != c.want {
			t.Errorf("%#v: %s, want %s", c.v, got, c.want)
		}
	}
	if got := Format(bson.RawValue{Type: bson.TypeInt64, Value: []byte{1}}); got != "<invalid>" {
		t.Errorf("a truncated value: %s", got)
	}
	if !(ID{}).IsZero() {
		t.Error("the zero ID")
	}
}

// TestServerStoredIDs: what the server stores as an _id is an ID: a DBRef
// (the one "$" field it allows inside an _id) and nesting up to its own
// limit; otherwise an insert lockgate lets through as "no lock can name
// it" would leave a document no enforced write could reach.
func TestServerStoredIDs(t *testing.T) {
	ref := func(id any, more ...bson.E) bson.D {
		return append(bson.D{{Key: "$ref", Value: "c"}, {Key: "$id", Value: id}}, more...)
	}
	for name, v := range map[string]any{
		"DBRef":                   ref(1),
		"DBRef with $db":          ref(1, bson.E{Key: "$db", Value: "d"}),
		"DBRef with other fields": ref(1, bson.E{Key: "$db", Value: "d"}, bson.E{Key: "x", Value: 2}),
		"nested DBRef":            bson.D{{Key: "a", Value: ref("x")}},
	} {
		if _, err := New(rv(t, v)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if key(t, ref(int32(1))) != key(t, ref(1.0)) {
		t.Error("DBRefs to one _id written as int and double must be one key")
	}
	nest := func(n int) bson.D {
		d := bson.D{{Key: "v", Value: 1}}
		for range n {
			d = bson.D{{Key: "a", Value: d}}
		}
		return d
	}
	if _, err := New(rv(t, nest(150))); err != nil {
		t.Errorf("150 levels (the server stores up to 200): %v", err)
	}
	if _, err := New(rv(t, nest(250))); !errors.Is(err, ErrInvalid) {
		t.Errorf("250 levels: %v, want ErrInvalid", err)
	}
}

// TestLockKey: one lock is one Key, as a map key: the same document in one
// namespace whatever its id's numeric type, and never the same id in two
// namespaces, nor a namespace and id whose concatenation is ambiguous.
func TestLockKey(t *testing.T) {
	id := func(v any) ID {
		t.Helper()
		x, err := New(rv(t, v))
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	m := map[Key]int{KeyOf(namespace.Of("shop.orders"), id(int32(1))): 1}
	if m[KeyOf(namespace.Of("shop.orders"), id(int64(1)))] != 1 || m[KeyOf(namespace.Of("shop.orders"), id(1.0))] != 1 {
		t.Error("1, NumberLong(1) and 1.0 in one namespace are not one lock")
	}
	if _, ok := m[KeyOf(namespace.Of("shop.carts"), id(int32(1)))]; ok {
		t.Error("one id in two namespaces is one lock")
	}
	a, b := KeyOf(namespace.Of("a.b"), id("c")), KeyOf(namespace.Of("a.bc"), id(""))
	if a == b {
		t.Errorf("%+v and %+v are one lock", a, b)
	}
}
