package tests

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// crudScript runs a fixed sequence of CRUD operations on db (dropped first)
// and returns one line per operation: its name and its result or error as
// canonical extended JSON, which keeps BSON types. Every _id is set by the
// script, so two runs against the same server give the same lines.
func crudScript(ctx context.Context, db *mongo.Database) ([]string, error) {
	if err := db.Drop(ctx); err != nil {
		return nil, fmt.Errorf("drop: %w", err)
	}
	c := db.Collection("items")
	var out []string
	rec := func(name string, v any, err error) {
		if err != nil {
			var se mongo.ServerError
			if errors.As(err, &se) {
				out = append(out, fmt.Sprintf("%s: server error %v", name, err))
				return
			}
			out = append(out, fmt.Sprintf("%s: client error %v", name, err))
			return
		}
		b, merr := bson.MarshalExtJSON(bson.M{"v": v}, true, false)
		if merr != nil {
			out = append(out, fmt.Sprintf("%s: marshal %v", name, merr))
			return
		}
		out = append(out, name+": "+string(b))
	}
	docs := func(cur *mongo.Cursor, err error) ([]bson.D, error) {
		if err != nil {
			return nil, err
		}
		var all []bson.D
		err = cur.All(ctx, &all)
		return all, err
	}

	r1, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "name", Value: "one"}, {Key: "n", Value: int32(1)}, {Key: "when", Value: time.Date(2021, 2, 3, 4, 5, 6, 7e6, time.UTC)}})
	rec("insertOne", r1, err)
	var many []any
	for i := 2; i <= 40; i++ {
		many = append(many, bson.D{{Key: "_id", Value: i}, {Key: "name", Value: fmt.Sprintf("doc%02d", i)}, {Key: "n", Value: int64(i)}, {Key: "grp", Value: i % 4}, {Key: "f", Value: float64(i) / 3}})
	}
	r2, err := c.InsertMany(ctx, many)
	rec("insertMany", r2, err)
	_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	rec("insertOne duplicate", nil, err)
	var dupCode []int
	if we, ok := err.(mongo.WriteException); ok {
		for _, e := range we.WriteErrors {
			dupCode = append(dupCode, e.Code)
		}
	}
	rec("duplicate codes", dupCode, nil)

	all, err := docs(c.Find(ctx, bson.D{{Key: "grp", Value: 1}}, options.Find().SetSort(bson.D{{Key: "n", Value: -1}}).SetProjection(bson.D{{Key: "f", Value: 0}})))
	rec("find sort projection", all, err)
	all, err = docs(c.Find(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gte", Value: 10}, {Key: "$lt", Value: 20}}}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetSkip(2).SetLimit(5)))
	rec("find range skip limit", all, err)
	var one bson.D
	err = c.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&one)
	rec("findOne", one, err)
	err = c.FindOne(ctx, bson.D{{Key: "_id", Value: -1}}).Err()
	rec("findOne missing", errors.Is(err, mongo.ErrNoDocuments), nil)

	u1, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "name", Value: "two"}}}, {Key: "$inc", Value: bson.D{{Key: "n", Value: 100}}}})
	rec("updateOne", u1, err)
	u2, err := c.UpdateMany(ctx, bson.D{{Key: "grp", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "tag", Value: "g2"}}}})
	rec("updateMany", u2, err)
	u3, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1000}}, bson.D{{Key: "$set", Value: bson.D{{Key: "name", Value: "upserted"}}}}, options.Update().SetUpsert(true))
	rec("updateOne upsert", u3, err)
	u4, err := c.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 3}}, bson.D{{Key: "name", Value: "three"}, {Key: "replaced", Value: true}})
	rec("replaceOne", u4, err)
	u5, err := c.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 1001}}, bson.D{{Key: "name", Value: "replace-upserted"}}, options.Replace().SetUpsert(true))
	rec("replaceOne upsert", u5, err)
	d1, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: 4}})
	rec("deleteOne", d1, err)
	d2, err := c.DeleteMany(ctx, bson.D{{Key: "grp", Value: 3}, {Key: "n", Value: bson.D{{Key: "$gt", Value: 20}}}})
	rec("deleteMany", d2, err)
	var fam bson.D
	err = c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 5}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 5}}}}, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&fam)
	rec("findOneAndUpdate", fam, err)
	fam = nil
	err = c.FindOneAndReplace(ctx, bson.D{{Key: "_id", Value: 6}}, bson.D{{Key: "name", Value: "six"}}).Decode(&fam)
	rec("findOneAndReplace", fam, err)
	fam = nil
	err = c.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: 7}}).Decode(&fam)
	rec("findOneAndDelete", fam, err)
	n, err := c.CountDocuments(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 10}}}})
	rec("countDocuments", n, err)
	dist, err := c.Distinct(ctx, "grp", bson.D{})
	rec("distinct", dist, err)
	all, err = docs(c.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "n", Value: bson.D{{Key: "$lte", Value: 30}}}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$grp"}, {Key: "count", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
		{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}},
	}))
	rec("aggregate", all, err)
	all, err = docs(c.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}})))
	rec("final state", all, err)
	return out, nil
}

// TestCRUDMatchesDirect runs the same CRUD sequence with the Go driver
// directly against the upstream and through the proxy, and requires the same
// results, operation by operation.
func TestCRUDMatchesDirect(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, 2*time.Minute)
	name := dbName(t)

	direct, err := crudScript(ctx, connect(t, g.Direct).Database(name))
	if err != nil {
		t.Fatalf("direct run: %v", err)
	}
	// The direct run is the reference; make sure it is a meaningful one.
	for _, line := range direct {
		if strings.Contains(line, "client error") || (strings.Contains(line, "server error") && !strings.HasPrefix(line, "insertOne duplicate")) {
			t.Fatalf("direct run has an unexpected error, so it cannot serve as reference: %s", line)
		}
	}
	if want := `duplicate codes: {"v":[{"$numberInt":"11000"}]}`; !contains(direct, want) {
		t.Fatalf("direct run: want %q among the results, got:\n%s", want, strings.Join(direct, "\n"))
	}

	proxied, err := crudScript(ctx, connect(t, g.URI).Database(name))
	if err != nil {
		t.Fatalf("proxied run: %v", err)
	}
	diffLines(t, "direct", direct, "proxy", proxied)
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// diffLines fails the test at every line where a and b differ.
func diffLines(t testing.TB, aName string, a []string, bName string, b []string) {
	t.Helper()
	n := max(len(a), len(b))
	bad := 0
	for i := 0; i < n; i++ {
		var la, lb string
		if i < len(a) {
			la = a[i]
		}
		if i < len(b) {
			lb = b[i]
		}
		if la != lb {
			bad++
			t.Errorf("line %d differs:\n  %s: %s\n  %s: %s", i+1, aName, la, bName, lb)
		}
	}
	if bad == 0 && len(a) == 0 {
		t.Errorf("nothing to compare: both runs are empty")
	}
}

// TestLargeUpsertStatement is pymongo's test_upsert_large through the
// proxy: a replacement just under maxBsonObjectSize makes its update
// statement (q, u, upsert) larger than 16 MiB, which MongoDB accepts in a
// kind-1 section (the 16 KiB command allowance applies to every document of
// a message). The proxy used to close the connection; it must answer as the
// upstream does. pymongo, because it sends such statements (the Go driver
// refuses them client-side).
func TestLargeUpsertStatement(t *testing.T) {
	testkit.RequireTool(t, "pymongo", testkit.Pymongo())
	const script = `
import sys, pymongo
coll = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000)["large_upsert"][sys.argv[2]]
coll.drop()
# {_id: "big", s: big} is len(big)+26 bytes: 10 under 16 MiB.
big = "x" * (16 * 1024 * 1024 - 36)
r = coll.replace_one({"_id": "big"}, {"_id": "big", "s": big}, upsert=True)
print("upserted %s, count %d" % (r.upserted_id, coll.count_documents({"_id": "big"})))
`
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, 2*time.Minute)
	for _, target := range []struct{ name, uri string }{{"direct", g.Direct}, {"proxy", g.URI}} {
		out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", script, target.uri, target.name).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", target.name, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != "upserted big, count 1" {
			t.Fatalf("%s: %s", target.name, got)
		}
	}
}
