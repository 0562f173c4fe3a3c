package scheme

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/policy"
)

// TestInsertedComparesIDsAsIDs: whether an acquire inserted its lock
// record is read from the reply's upserted _id, which is one document's
// _id with the request's however the server typed it: NumberLong(5) and
// 5 are one record (docid.Same), as they are one lock.
func TestInsertedComparesIDsAsIDs(t *testing.T) {
	upserted := func(id bsoncore.Value) bsoncore.Document {
		return bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).AppendInt32("n", 1).
			AppendArray("upserted", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
				AppendInt32("index", 0).AppendValue("_id", id).Build()).Build()).Build()
	}
	i32 := bsoncore.Value{Type: bsontype.Int32, Data: bsoncore.AppendInt32(nil, 5)}
	i64 := bsoncore.Value{Type: bsontype.Int64, Data: bsoncore.AppendInt64(nil, 5)}
	other := bsoncore.Value{Type: bsontype.Int32, Data: bsoncore.AppendInt32(nil, 6)}
	w := policy.Write{Kind: policy.KindUpdate}
	if !inserted(upserted(i64), w, i32) {
		t.Error("upserted NumberLong(5) for _id 5: not taken for the record's insert")
	}
	if inserted(upserted(other), w, i32) {
		t.Error("upserted _id 6 for _id 5: taken for the record's insert")
	}
}
