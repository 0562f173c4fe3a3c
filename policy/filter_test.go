package policy

import (
	"bytes"
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// clValues marshals each element of a as a value.
func clValues(t testing.TB, a A) []bsoncore.Value {
	out := []bsoncore.Value{}
	for _, v := range a {
		out = append(out, clVal(t, v))
	}
	return out
}

func clSameValues(a, b []bsoncore.Value) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

func TestPinnedIDs(t *testing.T) {
	re := primitive.Regex{Pattern: "x", Options: ""}
	oid := primitive.ObjectID{1, 2, 3}
	cases := []struct {
		name      string
		filter    D
		ids       A // nil: not pinned
		hasString bool
	}{
		{name: "scalar", filter: D{{"_id", 1}}, ids: A{1}},
		{name: "objectid", filter: D{{"_id", oid}}, ids: A{oid}},
		{name: "string", filter: D{{"_id", "abc"}}, ids: A{"abc"}, hasString: true},
		{name: "symbol", filter: D{{"_id", primitive.Symbol("s")}}, ids: A{primitive.Symbol("s")}, hasString: true},
		{name: "int64 and double kept as sent", filter: D{{"_id", int64(7)}}, ids: A{int64(7)}},
		{name: "literal document", filter: D{{"_id", D{{"a", 1}}}}, ids: A{D{{"a", 1}}}},
		{name: "literal document with string", filter: D{{"_id", D{{"a", D{{"b", "x"}}}}}}, ids: A{D{{"a", D{{"b", "x"}}}}}, hasString: true},
		{name: "literal empty document", filter: D{{"_id", D{}}}, ids: A{D{}}},
		{name: "literal document with later $ key", filter: D{{"_id", D{{"a", 1}, {"$gt", 1}}}}, ids: A{D{{"a", 1}, {"$gt", 1}}}},
		{name: "$eq", filter: D{{"_id", D{{"$eq", 5}}}}, ids: A{5}},
		{name: "$eq operator-looking document is literal", filter: D{{"_id", D{{"$eq", D{{"$gt", 1}}}}}}, ids: A{D{{"$gt", 1}}}},
		{name: "$in", filter: D{{"_id", D{{"$in", A{1, 2, 3}}}}}, ids: A{1, 2, 3}},
		{name: "$in duplicates", filter: D{{"_id", D{{"$in", A{1, 1, "a", "a"}}}}}, ids: A{1, "a"}, hasString: true},
		{name: "$in empty matches nothing", filter: D{{"_id", D{{"$in", A{}}}}}, ids: A{}},
		{name: "$in with regex", filter: D{{"_id", D{{"$in", A{1, re}}}}}},
		{name: "$in with null", filter: D{{"_id", D{{"$in", A{1, nil}}}}}},
		{name: "$in with array", filter: D{{"_id", D{{"$in", A{1, A{2}}}}}}},
		{name: "$in not an array", filter: D{{"_id", D{{"$in", 1}}}}},
		{name: "$in with $ne", filter: D{{"_id", D{{"$in", A{1, 2, 3}}, {"$ne", 3}}}}, ids: A{1, 2, 3}},
		{name: "$gt with $eq", filter: D{{"_id", D{{"$gt", 1}, {"$eq", 9}}}}, ids: A{9}},
		{name: "$in and $eq: smallest", filter: D{{"_id", D{{"$in", A{1, 2}}, {"$eq", 2}}}}, ids: A{2}},
		{name: "$gt", filter: D{{"_id", D{{"$gt", 1}}}}},
		{name: "$ne alone", filter: D{{"_id", D{{"$ne", 1}}}}},
		{name: "$nin", filter: D{{"_id", D{{"$nin", A{1}}}}}},
		{name: "$not", filter: D{{"_id", D{{"$not", D{{"$eq", 1}}}}}}},
		{name: "regex", filter: D{{"_id", re}}},
		{name: "$eq regex", filter: D{{"_id", D{{"$eq", re}}}}},
		{name: "$regex", filter: D{{"_id", D{{"$regex", "x"}}}}},
		{name: "array", filter: D{{"_id", A{1, 2}}}},
		{name: "null", filter: D{{"_id", nil}}},
		{name: "$eq null", filter: D{{"_id", D{{"$eq", nil}}}}},
		{name: "undefined", filter: D{{"_id", primitive.Undefined{}}}},
		{name: "minKey", filter: D{{"_id", primitive.MinKey{}}}},
		{name: "maxKey", filter: D{{"_id", primitive.MaxKey{}}}},
		{name: "no _id", filter: D{{"x", 1}}},
		{name: "empty", filter: D{}},
		{name: "dotted _id", filter: D{{"_id.a", 1}}},
		{name: "$and", filter: D{{"$and", A{D{{"_id", 1}}, D{{"x", 2}}}}}, ids: A{1}},
		{name: "$and nested", filter: D{{"$and", A{D{{"$and", A{D{{"_id", D{{"$in", A{4, 5}}}}}}}}}}}, ids: A{4, 5}},
		{name: "$and smallest", filter: D{{"_id", D{{"$in", A{1, 2, 3}}}}, {"$and", A{D{{"_id", D{{"$in", A{2, 3}}}}}}}}, ids: A{2, 3}},
		{name: "$and first of equal size", filter: D{{"_id", 1}, {"$and", A{D{{"_id", 2}}}}}, ids: A{1}},
		{name: "$and without pin", filter: D{{"$and", A{D{{"x", 1}}, D{{"_id", D{{"$gt", 1}}}}}}}},
		{name: "$and not an array", filter: D{{"$and", D{{"_id", 1}}}}},
		{name: "$or of _ids", filter: D{{"$or", A{D{{"_id", 1}}, D{{"_id", 2}}}}}, ids: A{1, 2}},
		{name: "$or union dedup", filter: D{{"$or", A{D{{"_id", D{{"$in", A{1, 2}}}}}, D{{"_id", 2}}, D{{"_id", "s"}, {"x", 1}}}}}, ids: A{1, 2, "s"}, hasString: true},
		{name: "$or with unpinned branch", filter: D{{"$or", A{D{{"_id", 1}}, D{{"x", 2}}}}}},
		{name: "$or empty", filter: D{{"$or", A{}}}},
		{name: "$or branch not a document", filter: D{{"$or", A{D{{"_id", 1}}, 2}}}},
		{name: "$or with pinning conjunct", filter: D{{"$or", A{D{{"_id", 1}}, D{{"x", 2}}}}, {"_id", 7}}, ids: A{7}},
		{name: "$or nested in $and", filter: D{{"$and", A{D{{"$or", A{D{{"_id", 1}}, D{{"$and", A{D{{"_id", 2}}}}}}}}}}}, ids: A{1, 2}},
		{name: "$nor of _ids", filter: D{{"$nor", A{D{{"_id", 1}}, D{{"_id", 2}}}}}},
		{name: "$nor does not prevent", filter: D{{"$nor", A{D{{"_id", 1}}}}, {"_id", D{{"$in", A{1, 2}}}}}, ids: A{1, 2}},
		{name: "$expr beside", filter: D{{"$expr", D{{"$eq", A{"$_id", 1}}}}, {"_id", 3}}, ids: A{3}},
		{name: "$expr alone", filter: D{{"$expr", D{{"$eq", A{"$_id", 1}}}}}},
		{name: "$where beside", filter: D{{"$where", "true"}, {"_id", 3}}, ids: A{3}},
		{name: "$jsonSchema beside", filter: D{{"$jsonSchema", D{}}, {"_id", D{{"$eq", 3}}}}, ids: A{3}},
		{name: "duplicate _id keys", filter: D{{"_id", D{{"$in", A{1, 2}}}}, {"_id", 2}}, ids: A{2}},
		{name: "unpinned _id then pinned", filter: D{{"_id", D{{"$gt", 0}}}, {"_id", 2}}, ids: A{2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids, hasString, ok := PinnedIDs(clDoc(t, tc.filter))
			var buf [1]bsoncore.Value
			if into, s, o, _ := PinnedIDsInto(buf[:0], clDoc(t, tc.filter), math.MaxInt); o != ok || s != hasString || !clSameValues(into, ids) {
				t.Fatalf("into a buffer: %v %v %v, want %v %v %v", into, s, o, ids, hasString, ok)
			}
			if tc.ids == nil {
				if ok {
					t.Fatalf("pinned %v, want not pinned", ids)
				}
				return
			}
			if !ok {
				t.Fatalf("not pinned, want %v", tc.ids)
			}
			if want := clValues(t, tc.ids); !clSameValues(ids, want) {
				t.Fatalf("ids %v, want %v", ids, want)
			}
			if hasString != tc.hasString {
				t.Fatalf("hasString %v, want %v", hasString, tc.hasString)
			}
		})
	}
}

// TestPinnedIDsIntoAllocatesNothing: a filter pinning one _id, the usual
// write's, is read into the caller's buffer without an allocation.
func TestPinnedIDsIntoAllocatesNothing(t *testing.T) {
	for _, f := range []D{{{"_id", 7}}, {{"_id", D{{"$eq", "a"}}}}, {{"n", 1}, {"_id", primitive.ObjectID{1}}}} {
		filter := clDoc(t, f)
		var buf [1]bsoncore.Value
		if n := testing.AllocsPerRun(100, func() {
			if ids, _, ok, _ := PinnedIDsInto(buf[:0], filter, 1000); !ok || len(ids) != 1 || &ids[0] != &buf[0] {
				t.Fatalf("%v: %v %v, want its one value in the buffer", f, ids, ok)
			}
		}); n != 0 {
			t.Errorf("%v: %v allocations", f, n)
		}
	}
}

// TestPinnedIDsDepth: a filter nested deeper than the limit does not pin
// and does not overflow the stack.
func TestPinnedIDsDepth(t *testing.T) {
	f := D{{"_id", 1}}
	for i := 0; i < maxFilterDepth+5; i++ {
		f = D{{"$and", A{f}}}
	}
	b := clDoc(t, f)
	if _, _, ok := PinnedIDs(b); ok {
		t.Fatal("a filter deeper than the limit pinned")
	}
}

func TestPinnedIDsMalformed(t *testing.T) {
	for _, b := range [][]byte{nil, {1, 2}, {9, 0, 0, 0, 3, 'a', 0, 1, 0}} {
		if _, _, ok := PinnedIDs(b); ok {
			t.Fatalf("malformed filter %x pinned", b)
		}
	}
}

// TestPinnedIDsUpTo: a caller's limit (the rule's maxCandidates) stops
// a pin set at its limit+1st distinct value, and over tells that apart
// from a filter that does not pin, whatever the order of its clauses.
func TestPinnedIDsUpTo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		filter   D
		want     A
		ok, over bool
	}{
		{"at the limit", D{{"_id", D{{"$in", A{1, 2, 3}}}}}, A{1, 2, 3}, true, false},
		{"over the limit", D{{"_id", D{{"$in", A{1, 2, 3, 4}}}}}, nil, false, true},
		{"repeats count once", D{{"_id", D{{"$in", A{1, 1, 1, 1, 2}}}}}, A{1, 2}, true, false},
		{"a value after the limit that cannot pin", D{{"_id", D{{"$in", A{1, 2, 3, 4, nil}}}}}, nil, false, false},
		{"a smaller conjunct pins", D{{"_id", D{{"$in", A{1, 2, 3, 4}}}}, {"$and", A{D{{"_id", 7}}}}}, A{7}, true, false},
		{"a smaller operator pins", D{{"_id", D{{"$in", A{1, 2, 3, 4}}, {"$eq", 9}}}}, A{9}, true, false},
		{"$or over the limit", D{{"$or", A{D{{"_id", 1}}, D{{"_id", 2}}, D{{"_id", 3}}, D{{"_id", 4}}}}}, nil, false, true},
		{"$or at the limit", D{{"$or", A{D{{"_id", 1}}, D{{"_id", D{{"$in", A{2, 3}}}}}}}}, A{1, 2, 3}, true, false},
		{"$or with an over branch and one that does not pin", D{{"$or", A{D{{"_id", D{{"$in", A{1, 2, 3, 4}}}}}, D{{"status", "open"}}}}}, nil, false, false},
		{"the same, branches swapped", D{{"$or", A{D{{"status", "open"}}, D{{"_id", D{{"$in", A{1, 2, 3, 4}}}}}}}}, nil, false, false},
		{"no pin", D{{"name", "x"}}, nil, false, false},
	} {
		ids, _, ok, over := PinnedIDsUpTo(clDoc(t, tc.filter), 3)
		if ok != tc.ok || over != tc.over || (ok && !clSameValues(ids, clValues(t, tc.want))) {
			t.Errorf("%s: ids %v ok %v over %v, want %v %v %v", tc.name, ids, ok, over, tc.want, tc.ok, tc.over)
		}
	}
}

// TestPinnedIDsUpToWorkIsBounded: past the limit, values are only checked,
// never collected: a filter naming 50,000 ids allocates what one naming
// 100 does (collecting them all takes a growing list and index).
func TestPinnedIDsUpToWorkIsBounded(t *testing.T) {
	small, large := bigInFilter(t, 100, 0, false), bigInFilter(t, 50000, 0, false)
	count := func(f bsoncore.Document) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, _, _, over := PinnedIDsUpTo(f, 10); !over {
				t.Fatal("not over the limit")
			}
		})
	}
	if a, b := count(small), count(large); b > a {
		t.Errorf("50,000 ids: %v allocations, 100 ids: %v; past the limit nothing should be collected", b, a)
	}
}
