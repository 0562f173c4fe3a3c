package guard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestCappedCollectionsLoseNoLockedDocument is issue 16 through the proxy
// on the embedded upstream: on a protected capped collection, compact (which
// trims it to its max, deleting the oldest documents, locked ones included)
// and every other command that may remove, rewrite or evict documents
// (reIndex, validate with repair, convertToCapped, collMod of the capped
// size or max, emptycapped, captrunc, godinsert, a capped clone or a
// capped or expiring create under a protected name), in their case
// variants too, are collection writes, refused unless the rule allows
// them; an insert, which may evict the oldest document, is refused in
// every form unless the rule opts in; the documents are unchanged either
// way. A plain validate still runs.
func TestCappedCollectionsLoseNoLockedDocument(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("capped_%d", collSeq.Add(1))
	direct, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Disconnect(ctx)
	for _, coll := range []string{name, name + "_open"} {
		if err := direct.Database("shop").CreateCollection(ctx, coll, options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<20).SetMaxDocuments(5)); err != nil {
			t.Fatalf("creating a capped collection: %v", err)
		}
		var docs []any
		for i := 1; i <= 5; i++ {
			docs = append(docs, bson.D{{"_id", i}, {"v", i}})
		}
		if _, err := direct.Database("shop").Collection(coll).InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, Namespaces: []config.NamespaceRule{
		{Match: "shop." + name, Mode: config.ModeEnforce},
		{Match: "shop." + name + "_open", Mode: config.ModeEnforce, AllowCappedInserts: true},
		// Protected, not created yet: lock-then-upsert will create it.
		{Match: "shop." + name + "_new", Mode: config.ModeEnforce},
	}}
	st := startStackWith(t, stackOptions{policy: pol})
	c := connect(t, st.uri, "capped")
	s := session(t, c)
	acquire(t, c, s, name, 1) // the oldest document, first to be evicted
	before := snapshot(t, name)

	db := c.Database("shop")
	for _, cmd := range []bson.D{
		{{"compact", name}},
		{{"compact", name}, {"force", true}},
		{{"reIndex", name}},
		{{"validate", name}, {"repair", true}},
		{{"convertToCapped", name}, {"size", 64}},
		{{"collMod", name}, {"cappedSize", 64}},
		{{"collMod", name}, {"cappedMax", 1}},
		{{"emptycapped", name}},
		{{"captrunc", name}, {"n", 1}, {"inc", true}},
		{{"godinsert", name}, {"obj", bson.D{{"_id", 6}}}},
		// A capped copy of another collection made under the protected
		// name, and a protected name made capped before anything is in
		// it: documents locked there later would be evicted.
		{{"cloneCollectionAsCapped", name + "_open"}, {"toCollection", name + "_new"}, {"size", 64}},
		{{"create", name + "_new"}, {"capped", true}, {"size", 64}, {"max", 1}},
		{{"create", name + "_new"}, {"clusteredIndex", bson.D{{"key", bson.D{{"_id", 1}}}, {"unique", true}}}, {"expireAfterSeconds", 1}},
	} {
		lockBusy(t, db.RunCommand(inSession(s), cmd).Err(), "replaces or removes documents wholesale")
	}
	// Case variants of the command names, for upstreams that fold them.
	for _, cmd := range []bson.D{
		{{"Compact", name}},
		{{"converttocapped", name}, {"size", 64}},
		{{"COLLMOD", name}, {"cappedMax", 1}},
		{{"CloneCollectionAsCapped", name + "_open"}, {"toCollection", name + "_new"}, {"size", 64}},
	} {
		lockBusy(t, db.RunCommand(inSession(s), cmd).Err(), "only by case")
	}
	names, err := direct.Database("shop").ListCollectionNames(ctx, bson.D{{"name", name + "_new"}})
	if err != nil || len(names) != 0 {
		t.Errorf("the protected name was created: %v, %v", names, err)
	}
	// Every way an insert arrives: insert, an upsert by update, by
	// findAndModify, by replace, in a bulk write.
	coll := db.Collection(name)
	_, err = coll.InsertOne(inSession(s), bson.D{{"_id", 6}})
	lockBusy(t, err, "capped collection")
	_, err = coll.UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"v", 1}}}}, options.Update().SetUpsert(true))
	lockBusy(t, err, "capped collection")
	err = coll.FindOneAndUpdate(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"v", 1}}}}, options.FindOneAndUpdate().SetUpsert(true)).Err()
	lockBusy(t, err, "capped collection")
	_, err = coll.ReplaceOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"v", 1}}, options.Replace().SetUpsert(true))
	lockBusy(t, err, "capped collection")
	_, err = coll.BulkWrite(inSession(s), []mongo.WriteModel{mongo.NewInsertOneModel().SetDocument(bson.D{{"_id", 7}})})
	lockBusy(t, err, "capped collection")
	if after := snapshot(t, name); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the capped collection changed:\nbefore %v\nafter  %v", before, after)
	}
	if err := db.RunCommand(inSession(s), bson.D{{"validate", name}}).Err(); err != nil {
		t.Errorf("a plain validate (it reads only) was refused: %v", err)
	}
	// The rule that opts in lets inserts through.
	if _, err := db.Collection(name+"_open").InsertOne(inSession(s), bson.D{{"_id", 6}}); err != nil {
		t.Errorf("insert where allowCappedInserts is set: %v", err)
	}
}

// TestInsertOfALockedIDIsRefusedByDefault: lock-then-upsert is the way to
// create a document safely, so by default (no inserts: key) an insert of an
// _id that another session has locked is refused; the holder's upsert then
// creates it. Where no lock is held in the namespace, an insert costs no
// lock store round trip (issue 16).
func TestInsertOfALockedIDIsRefusedByDefault(t *testing.T) {
	coll, pol := protected(t, 1)
	st := startStackWith(t, stackOptions{policy: pol})
	holder, intruder := connect(t, st.uri, "holder"), connect(t, st.uri, "intruder")
	hs, is := session(t, holder), session(t, intruder)

	// Nothing locked in the namespace yet: once the store has looked,
	// inserts are decided without a round trip.
	testkit.Eventually(t, 10*time.Second, "the store to know nothing is locked there", func() bool { return !st.store.MayHoldLocks(namespace.Of("shop." + coll)) })
	if _, err := intruder.Database("shop").Collection(coll).InsertOne(inSession(is), bson.D{{"_id", 50}}); err != nil {
		t.Fatalf("insert into a namespace where nothing is locked: %v", err)
	}
	if got := testutil.ToFloat64(st.metrics.insertChecks.WithLabelValues("skipped")); got != 1 {
		t.Errorf("insert checks skipped = %v, want 1 (no lock held in the namespace)", got)
	}

	acquire(t, holder, hs, coll, 7) // a document that does not exist yet
	if !st.store.MayHoldLocks(namespace.Of("shop." + coll)) {
		t.Fatal("a lock taken through the store does not mark its namespace at once")
	}
	_, err := intruder.Database("shop").Collection(coll).InsertOne(inSession(is), bson.D{{"_id", 7}, {"by", "intruder"}})
	lockBusy(t, err, "another session has locked _id 7")
	res, err := holder.Database("shop").Collection(coll).UpdateOne(inSession(hs), bson.D{{"_id", 7}}, bson.D{{"$set", bson.D{{"by", "holder"}}}}, options.Update().SetUpsert(true))
	if err != nil || res.UpsertedCount != 1 {
		t.Fatalf("the holder's upsert: %+v, %v", res, err)
	}
}
