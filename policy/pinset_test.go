package policy

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// bigInFilter is {_id: {$in: [0, 1, ..., n-1, 0, 1, ..., dup-1]}} with the
// ids as int64, followed by the same ids again as strings in an $or branch
// when withOr is set.
func bigInFilter(tb testing.TB, n, dup int, withOr bool) bsoncore.Document {
	tb.Helper()
	in := make(bson.A, 0, n+dup)
	for i := 0; i < n; i++ {
		in = append(in, int64(i))
	}
	for i := 0; i < dup; i++ {
		in = append(in, int64(i))
	}
	filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}
	if withOr {
		strs := make(bson.A, 0, n)
		for i := 0; i < n; i++ {
			strs = append(strs, fmt.Sprint(i))
		}
		filter = bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}},
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: strs}}}},
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}},
		}}}
	}
	raw, err := bson.Marshal(filter)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// Large pin sets keep first-seen order and drop only byte-for-byte
// duplicates, across the size at which the set starts indexing.
func TestPinnedIDsLargeSetsDeduplicate(t *testing.T) {
	for _, n := range []int{pinSetIndexAt - 1, pinSetIndexAt, pinSetIndexAt + 1, 5000} {
		ids, hasString, ok := PinnedIDs(bigInFilter(t, n, n/2+1, false))
		if !ok || hasString || len(ids) != n {
			t.Fatalf("n=%d: got %d ids ok=%v hasString=%v, want %d", n, len(ids), ok, hasString, n)
		}
		for i, v := range ids {
			if got, ok := v.Int64OK(); !ok || got != int64(i) {
				t.Fatalf("n=%d: id %d is %v, want %d", n, i, v, i)
			}
		}
		// The $or union: int64 and string ids are different keys, the
		// repeated branch adds nothing.
		ids, hasString, ok = PinnedIDs(bigInFilter(t, n, 0, true))
		if !ok || !hasString || len(ids) != 2*n {
			t.Fatalf("n=%d $or: got %d ids ok=%v hasString=%v, want %d", n, len(ids), ok, hasString, 2*n)
		}
	}
}

// A filter pinning 50,000 ids (the case: 12 s of CPU with the
// quadratic de-duplication) is read in time linear in its size. Compare
// the ns/id of the two sizes: equal within noise means linear.
func BenchmarkPinnedIDs(b *testing.B) {
	for _, n := range []int{5000, 50000} {
		for _, withOr := range []bool{false, true} {
			filter := bigInFilter(b, n, 0, withOr)
			b.Run(fmt.Sprintf("ids=%d/or=%v", n, withOr), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, _, ok := PinnedIDs(filter); !ok {
						b.Fatal("not pinned")
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/id")
			})
		}
		// What enforcement reads: no more than maxCandidates + 1 values,
		// whatever the filter's size.
		filter := bigInFilter(b, n, 0, false)
		b.Run(fmt.Sprintf("ids=%d/upTo=%d", n, DefaultMaxCandidates), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, _, _, over := PinnedIDsUpTo(filter, DefaultMaxCandidates); !over {
					b.Fatal("not over the limit")
				}
			}
		})
	}
}
