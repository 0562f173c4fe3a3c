package lockstore

import (
	"errors"
	"math"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

func dec(t *testing.T, s string) primitive.Decimal128 {
	t.Helper()
	d, err := primitive.ParseDecimal128(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func key(t *testing.T, v any) string {
	t.Helper()
	k, err := canonicalID(rv(t, v))
	if err != nil {
		t.Fatalf("canonicalID(%v): %v", v, err)
	}
	return recordID("db.c", k)
}

func TestCanonicalIDEqual(t *testing.T) {
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

func TestCanonicalIDDistinct(t *testing.T) {
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

func TestCanonicalIDInvalid(t *testing.T) {
	for name, v := range map[string]bson.RawValue{
		"array":     rv(t, bson.A{int32(1)}),
		"regex":     rv(t, primitive.Regex{Pattern: "a"}),
		"undefined": {Type: bson.TypeUndefined},
		"dollar":    rv(t, bson.D{{Key: "$gt", Value: int32(1)}}),
		"nested $":  rv(t, bson.D{{Key: "a", Value: bson.D{{Key: "$in", Value: bson.A{}}}}}),
		"truncated": {Type: bson.TypeInt64, Value: []byte{1, 2}},
		"empty":     {},
	} {
		if _, err := canonicalID(v); !errors.Is(err, ErrInvalidID) {
			t.Errorf("%s: err %v, want ErrInvalidID", name, err)
		}
	}
}

func TestRecordIDLongKeyHashed(t *testing.T) {
	long := strings.Repeat("x", 1000)
	a, b := key(t, long), key(t, long+"y")
	if len(a) > 100 || a == b {
		t.Fatalf("long keys should be hashed and distinct: %q %q", a, b)
	}
	if !strings.HasPrefix(a, "db.c/#") {
		t.Fatalf("hashed key %q", a)
	}
}

func TestKeysDedupAndOrder(t *testing.T) {
	ks, err := keys("db.c", ids(t, int32(3), 1.0, int64(1), "a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 3 {
		t.Fatalf("got %d keys, want 3 (1 and 1.0 are one)", len(ks))
	}
	if ks[1].id.Type != bson.TypeDouble {
		t.Fatalf("the first spelling should win, got %v", ks[1].id.Type)
	}
	ord := canonicalOrder(ks)
	for i := 1; i < len(ord); i++ {
		if ord[i-1].rid >= ord[i].rid {
			t.Fatalf("not sorted: %v", ord)
		}
	}
	if _, err := keys("db.c", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no ids: %v", err)
	}
	if _, err := keys("", ids(t, 1)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no ns: %v", err)
	}
}
