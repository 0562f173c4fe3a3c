package docid

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestTagIsTheKeys: an id's tag is its key's fingerprint however the id
// was made (New, Copy of one value, Copy of several), so that the ids of
// one document, made by different paths, have one tag: a lock store's
// memo found by tag would otherwise miss the document it holds
// (lockstore.HeldMemos). The tag takes no room: an ID stays six words.
func TestTagIsTheKeys(t *testing.T) {
	if got := unsafe.Sizeof(ID{}); got != 48 {
		t.Fatalf("an ID is %d bytes, not 48", got)
	}
	long := make([]byte, 100) // longer than copyOne's box holds
	for i := range long {
		long[i] = byte('a' + i%26)
	}
	groups := [][]any{
		{int32(1), int64(1), 1.0, dec(t, "1")},
		{"doc-000012", primitive.Symbol("doc-000012")},
		{primitive.ObjectID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{string(long)},
		{bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: 1.0}}},
		{math.Inf(1), dec(t, "Infinity")},
	}
	seen := map[uint32]string{}
	for _, g := range groups {
		var want uint32
		for i, v := range g {
			r := rv(t, v)
			one, err := New(r)
			if err != nil {
				t.Fatal(err)
			}
			copied, err := Copy([]bsoncore.Value{{Type: r.Type, Data: r.Value}})
			if err != nil {
				t.Fatal(err)
			}
			batch, err := Copy([]bsoncore.Value{{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 99)}, {Type: r.Type, Data: r.Value}})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []ID{one, copied[0], batch[1]} {
				if id.TagAt() != keyTag(id.KeyAt()) || id.TagAt() == 0 {
					t.Fatalf("%v: tag %#x, the key's %#x", v, id.TagAt(), keyTag(id.KeyAt()))
				}
				if i == 0 && want == 0 {
					want = id.TagAt()
				}
				if id.TagAt() != want {
					t.Fatalf("%v: tag %#x, its group's %#x", v, id.TagAt(), want)
				}
			}
			if batch[0].TagAt() != keyTag(batch[0].KeyAt()) {
				t.Fatal("the first id of a batch has another tag than its key's")
			}
		}
		// Distinct documents here have distinct tags (not a promise in
		// general, but a tag that most ids share would spare nothing).
		if prev, ok := seen[want]; ok {
			t.Fatalf("%v and %s have one tag", g[0], prev)
		}
		seen[want] = fmt.Sprint(g[0])
	}
	if (ID{}).tag != keyTag("") {
		t.Fatal("the zero ID's tag is not the empty key's")
	}
}
