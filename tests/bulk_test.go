package tests

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// bulkScript writes a large batch and mixed bulk writes to db (dropped
// first) and returns the results and a digest of the final contents. The
// Go driver sends insert/update/delete batches as OP_MSG document sequences
// (kind-1 sections), and bulkBig documents of 1 KiB make a message of several
// megabytes.
func bulkScript(ctx context.Context, db *mongo.Database) ([]string, error) {
	if err := db.Drop(ctx); err != nil {
		return nil, err
	}
	big, c := db.Collection("big"), db.Collection("mixed")
	var out []string
	add := func(name string, v any, err error) {
		if err != nil {
			out = append(out, fmt.Sprintf("%s: error %v", name, err))
			return
		}
		b, _ := bson.MarshalExtJSON(bson.M{"v": v}, true, false)
		out = append(out, name+": "+string(b))
	}

	n := bulkBig()
	pad := strings.Repeat("p", 1000)
	docs := make([]any, n)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}, {Key: "pad", Value: pad}, {Key: "i", Value: i}}
	}
	r, err := big.InsertMany(ctx, docs)
	if err == nil {
		add("insertMany count", len(r.InsertedIDs), nil)
	} else {
		add("insertMany", nil, err)
	}
	cnt, err := big.CountDocuments(ctx, bson.D{})
	add("big count", cnt, err)
	add("big contents", digest(ctx, big), nil)

	// Mixed bulk writes on a small collection: FerretDB's SQLite backend
	// scans the collection for every update, which on the 5 MB one would
	// take minutes without testing anything more about the proxy.
	small := make([]any, 300)
	for i := range small {
		small[i] = bson.D{{Key: "_id", Value: i}, {Key: "pad", Value: pad[:100]}, {Key: "i", Value: i}}
	}
	_, err = c.InsertMany(ctx, small)
	add("small insertMany", nil, err)

	var models []mongo.WriteModel
	for i := 0; i < 250; i++ {
		switch i % 5 {
		case 0:
			models = append(models, mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: n + i}, {Key: "pad", Value: pad}}))
		case 1:
			models = append(models, mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: i}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "u", Value: i}}}}))
		case 2:
			models = append(models, mongo.NewReplaceOneModel().SetFilter(bson.D{{Key: "_id", Value: i}}).SetReplacement(bson.D{{Key: "r", Value: i}}))
		case 3:
			models = append(models, mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: i}}))
		case 4:
			models = append(models, mongo.NewUpdateManyModel().SetFilter(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{i, i + 100}}}}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "m", Value: 1}}}}))
		}
	}
	br, err := c.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
	add("bulkWrite ordered", br, err)

	// Unordered, with duplicate keys in the middle: the other writes happen.
	models, _ = unorderedModels(pad)
	br, err = c.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	add("bulkWrite unordered result", br, nil)
	add("bulkWrite unordered error", bulkErrorSummary(err), nil)

	// Ordered with a duplicate key: stops at the first error.
	models = []mongo.WriteModel{
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 20000}}),
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 20000}}),
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 20001}}),
	}
	br, err = c.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
	add("bulkWrite ordered-with-error result", br, nil)
	add("bulkWrite ordered-with-error error", bulkErrorSummary(err), nil)

	cnt, err = c.CountDocuments(ctx, bson.D{})
	add("mixed count", cnt, err)
	add("mixed contents", digest(ctx, c), nil)
	return out, nil
}

// bulkBig is how many 1 KiB documents the big insertMany writes: 5,000,
// about 5 MB in one OP_MSG, under the race detector too (see
// TestManyConcurrentClients).
func bulkBig() int {
	return 5000
}

// unorderedModels are 500 inserts with 5 duplicate _ids among them, and a
// deleteMany after every 10th insert; dups are the indexes of the
// duplicates, which an unordered bulk write must report and skip.
func unorderedModels(pad string) (models []mongo.WriteModel, dups []int) {
	for i := 0; i < 500; i++ {
		id := 10000 + i
		if i%100 == 50 {
			id-- // the previous insert's _id
			dups = append(dups, len(models))
		}
		models = append(models, mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: id}, {Key: "pad", Value: pad}}))
		if i%10 == 0 {
			models = append(models, mongo.NewDeleteManyModel().SetFilter(bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: 100 + i/10*4}, {Key: "$lt", Value: 102 + i/10*4}}}}))
		}
	}
	return models, dups
}

// digest is the number of documents of c and a SHA-256 over their bytes in
// _id order.
func digest(ctx context.Context, c *mongo.Collection) string {
	cur, err := c.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return "error: " + err.Error()
	}
	defer cur.Close(ctx)
	h := sha256.New()
	n := 0
	for cur.Next(ctx) {
		h.Write(cur.Current)
		n++
	}
	if err := cur.Err(); err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%d documents, sha256 %x", n, h.Sum(nil))
}

// bulkErrorSummary keeps what a server decides about a failed bulk write:
// which operations failed and with which code.
func bulkErrorSummary(err error) any {
	if err == nil {
		return "no error"
	}
	bwe, ok := err.(mongo.BulkWriteException)
	if !ok {
		return "unexpected error: " + err.Error()
	}
	var s []string
	for _, e := range bwe.WriteErrors {
		s = append(s, fmt.Sprintf("index %d code %d", e.Index, e.Code))
	}
	return s
}

// TestBulkWritesMatchDirect runs large and mixed bulk writes directly and
// through the proxy and requires identical results and identical final
// contents (byte-for-byte, by digest). A recording relay between the proxy
// and the upstream shows that the big insert really travelled as OP_MSG
// document sequences and reached the upstream as such.
func TestBulkWritesMatchDirect(t *testing.T) {
	rec := startRecorder(t, upstream.Addr())
	g := startGateway(t, rec.URI())
	ctx := testCtx(t, 5*time.Minute)
	name := dbName(t)

	direct, err := bulkScript(ctx, connect(t, upstream.URI()).Database(name))
	if err != nil {
		t.Fatalf("direct run: %v", err)
	}
	// Sanity of the reference run, from what the operations must do.
	want := map[string]string{
		"insertMany count":                   fmt.Sprintf(`{"v":{"$numberInt":"%d"}}`, bulkBig()),
		"big count":                          fmt.Sprintf(`{"v":{"$numberLong":"%d"}}`, bulkBig()),
		"bulkWrite ordered-with-error error": `{"v":["index 1 code 11000"]}`,
	}
	_, dups := unorderedModels("")
	var dupErrs []string
	for _, i := range dups {
		dupErrs = append(dupErrs, fmt.Sprintf("%q", fmt.Sprintf("index %d code 11000", i)))
	}
	want["bulkWrite unordered error"] = `{"v":[` + strings.Join(dupErrs, ",") + `]}`
	for _, line := range direct {
		name, v, _ := strings.Cut(line, ": ")
		if w, ok := want[name]; ok && v != w {
			t.Errorf("direct run: %s = %s, want %s", name, v, w)
		}
		if strings.Contains(v, "error") && !strings.HasSuffix(name, " error") {
			t.Errorf("direct run: %s", line)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	proxied, err := bulkScript(ctx, connect(t, g.URI).Database(name))
	if err != nil {
		t.Fatalf("proxied run: %v", err)
	}
	diffLines(t, "direct", direct, "proxy", proxied)

	// Every document of the big insert reached the upstream in a kind-1
	// "documents" section of an insert on the big collection.
	inSequences, bigMessages := 0, 0
	for _, m := range rec.messages() {
		body, err := msgBody(m)
		if coll, ok := body.Lookup("insert").StringValueOK(); err != nil || !ok || coll != "big" {
			continue
		}
		seqs, err := msgSequences(m)
		if err != nil {
			t.Fatalf("insert message at the upstream: %v", err)
		}
		inSequences += seqs["documents"]
		if len(m.Body) > 512<<10 {
			bigMessages++
		}
	}
	if inSequences != bulkBig() || bigMessages == 0 {
		t.Errorf("the upstream received %d documents of the big insert in document sequences (want %d), in %d messages over 512 KiB (want at least 1)", inSequences, bulkBig(), bigMessages)
	}
}
