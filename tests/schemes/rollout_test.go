package schemes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

func connect(t testing.TB, uri, app string) *mongo.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetAppName(app).SetRetryWrites(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c
}

func code(err error) int {
	var se mongo.ServerError
	if errors.As(err, &se) {
		for _, c := range []int{46, 11000} {
			if se.HasErrorCode(c) {
				return c
			}
		}
		return -1
	}
	return 0
}

// TestRolloutNarrowedRules: a rule narrowed to one application enforces
// for it and audits everyone else, under a scheme and under lockgate's
// own commands: the other application's write that does not follow lands
// and is counted as would_reject; the named application's is refused.
// lockStatus shows a scheme lock like one of lockgate's own.
func TestRolloutNarrowedRules(t *testing.T) {
	ctx := context.Background()
	direct := connect(t, directURI, "seed")
	for _, ns := range []string{"narrow", "narrowown"} {
		c := direct.Database(ns).Collection("jobs")
		c.Drop(ctx)
		if _, err := c.InsertOne(ctx, bson.D{{"_id", 1}, {"locked", false}, {"n", 0}}); err != nil {
			t.Fatal(err)
		}
	}
	app := connect(t, proxyURI, "narrow-app")
	other := connect(t, proxyURI, "other-app")
	inc := bson.D{{"$inc", bson.D{{"n", 1}}}}
	byID := bson.D{{"_id", 1}}

	// Scheme (flag), enforced for narrow-app only.
	jobs := app.Database("narrow").Collection("jobs")
	if _, err := jobs.UpdateOne(ctx, byID, inc); code(err) != 46 {
		t.Fatalf("narrow-app's write without the flag: %v, want LockBusy", err)
	}
	would := map[string]string{"rule": "narrow.*", "decision": "would_reject", "reason": "scheme_not_holder"}
	before := metricValue(t, "lockgate_decisions_total", would)
	r, err := other.Database("narrow").Collection("jobs").UpdateOne(ctx, byID, inc)
	if err != nil || r.ModifiedCount != 1 {
		t.Fatalf("other-app's audited write: %+v, %v; want it applied", r, err)
	}
	if n := metricValue(t, "lockgate_decisions_total", would) - before; n != 1 {
		t.Fatalf("would_reject scheme_not_holder counted %v times, want 1", n)
	}
	if r, err := jobs.UpdateOne(ctx, bson.D{{"_id", 1}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}}}}); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("narrow-app's acquire: %+v, %v", r, err)
	}
	// lockStatus, from any client, shows the scheme lock and its holder.
	var st bson.M
	if err := other.Database("narrow").RunCommand(ctx, bson.D{{"lockStatus", "jobs"}, {"ids", bson.A{1}}}).Decode(&st); err != nil {
		t.Fatalf("lockStatus: %v", err)
	}
	locks, _ := st["locks"].(bson.A)
	if len(locks) != 1 || locks[0].(bson.M)["held"] != true || !strings.Contains(bsonString(locks[0]), "narrow-app") {
		t.Fatalf("lockStatus = %v, want the flag lock held by narrow-app", st)
	}
	if r, err := jobs.UpdateOne(ctx, byID, inc); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("narrow-app's write under the flag: %+v, %v", r, err)
	}
	if _, err := jobs.UpdateOne(ctx, byID, bson.D{{"$set", bson.D{{"locked", false}}}}); err != nil {
		t.Fatalf("narrow-app's release: %v", err)
	}

	// lockgate's own commands, enforced for own-app only.
	own := connect(t, proxyURI, "own-app").Database("narrowown").Collection("jobs")
	if _, err := own.UpdateOne(ctx, byID, inc); code(err) != 46 {
		t.Fatalf("own-app's write without acquireLock: %v, want LockBusy", err)
	}
	would = map[string]string{"rule": "narrowown.*", "decision": "would_reject", "reason": "not_locked"}
	before = metricValue(t, "lockgate_decisions_total", would)
	if r, err := other.Database("narrowown").Collection("jobs").UpdateOne(ctx, byID, inc); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("other-app's audited write: %+v, %v; want it applied", r, err)
	}
	if n := metricValue(t, "lockgate_decisions_total", would) - before; n != 1 {
		t.Fatalf("would_reject not_locked counted %v times, want 1", n)
	}
	var doc bson.M
	direct.Database("narrow").Collection("jobs").FindOne(ctx, byID).Decode(&doc)
	if doc["n"] != int32(2) {
		t.Fatalf("narrow.jobs n = %v, want 2 (other-app's audited write and narrow-app's write under the flag)", doc["n"])
	}
}

func bsonString(v any) string {
	b, _ := bson.MarshalExtJSON(v, false, false)
	return string(b)
}

// metricValue sums the gateway's series named name whose labels include
// labels; a series never created reads as 0.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := gw.Registry().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			match := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					match++
				}
			}
			if match == len(labels) {
				sum += m.GetCounter().GetValue()
			}
		}
		return sum
	}
	return 0
}

// TestSchemeCollectionWrites: a drop of a collection under a scheme is a
// collection write, refused unless the rule allows collection writes, as
// on any enforced namespace.
func TestSchemeCollectionWrites(t *testing.T) {
	ctx := context.Background()
	direct := connect(t, directURI, "seed")
	if _, err := direct.Database("flag").Collection("dropme").InsertOne(ctx, bson.D{{"_id", 1}, {"locked", false}}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, proxyURI, "dropper")
	if err := c.Database("flag").Collection("dropme").Drop(ctx); code(err) != 46 {
		t.Fatalf("drop under the flag scheme: %v, want LockBusy", err)
	}
	if n, err := direct.Database("flag").Collection("dropme").CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("after the refused drop: %d documents, %v", n, err)
	}
}

// TestSchemeHotReload: a namespace moves under a scheme on reload, without
// a restart or a reconnect; a reload with an invalid scheme is refused
// with the key named, and the policy in force stays.
func TestSchemeHotReload(t *testing.T) {
	ctx := context.Background()
	direct := connect(t, directURI, "seed")
	coll := direct.Database("reload").Collection("jobs")
	coll.Drop(ctx)
	if _, err := coll.InsertOne(ctx, bson.D{{"_id", 1}, {"locked", false}, {"n", 0}}); err != nil {
		t.Fatal(err)
	}
	rogue := connect(t, proxyURI, "reload-rogue").Database("reload").Collection("jobs")
	inc := bson.D{{"$inc", bson.D{{"n", 1}}}}
	if _, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, inc); err != nil {
		t.Fatalf("before the reload (no rule): %v", err)
	}
	defer func() {
		if err := gw.Reload(baseCfg); err != nil {
			t.Errorf("restoring the policy: %v", err)
		}
	}()
	next := *baseCfg
	next.Policy.Namespaces = append(append([]config.NamespaceRule(nil), baseCfg.Policy.Namespaces...),
		config.NamespaceRule{Match: "reload.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag}})
	if err := gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, inc); code(err) != 46 {
		t.Fatalf("after the reload, on the same connection: %v, want LockBusy", err)
	}
	bad := next
	bad.Policy.Namespaces = append(append([]config.NamespaceRule(nil), next.Policy.Namespaces...),
		config.NamespaceRule{Match: "reload2.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields}})
	err := gw.Reload(&bad)
	if err == nil || !strings.Contains(err.Error(), ".scheme.leaseMS") {
		t.Fatalf("reload with holderFields without leaseMS: %v, want it refused naming the key", err)
	}
	if _, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, inc); code(err) != 46 {
		t.Fatalf("after the refused reload: %v, want the scheme still enforced", err)
	}
}

// TestSchemeLockThenCreate: under inserts: requireUnlocked (the default),
// a document locked before it exists (a lock record for a new _id) can be
// created by its holder only; another client's insert is refused.
func TestSchemeLockThenCreate(t *testing.T) {
	ctx := context.Background()
	direct := connect(t, directURI, "seed")
	direct.Database("lockCollectionLong").Collection("create").Drop(ctx)
	direct.Database("lockCollectionLong").Collection("create.lock").Drop(ctx)
	holder := connect(t, proxyURI, "creator").Database("lockCollectionLong")
	rogue := connect(t, proxyURI, "squatter").Database("lockCollectionLong")
	if _, err := holder.Collection("create.lock").InsertOne(ctx, bson.D{{"_id", 9}, {"ts", time.Now()}, {"aid", "c"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Collection("create").InsertOne(ctx, bson.D{{"_id", 9}, {"n", -1}}); code(err) != 46 {
		t.Fatalf("another client's insert of the locked _id: %v, want LockBusy", err)
	}
	if _, err := holder.Collection("create").InsertOne(ctx, bson.D{{"_id", 9}, {"n", 1}}); err != nil {
		t.Fatalf("the holder's insert: %v", err)
	}
	if _, err := rogue.Collection("create").InsertOne(ctx, bson.D{{"_id", 10}, {"n", 1}}); err != nil {
		t.Fatalf("an insert of an unlocked _id: %v", err)
	}
}
