package guard

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

var collSeq atomic.Int64

// protected returns a fresh collection name in db "shop", seeded with
// {_id: 1..n, qty: 10*i}, and a policy enforcing it and auditing
// "<name>_audit".
func protected(t *testing.T, n int) (string, config.Policy) {
	t.Helper()
	name := fmt.Sprintf("orders_%d", collSeq.Add(1))
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	for _, coll := range []string{name, name + "_audit"} {
		var docs []any
		for i := 1; i <= n; i++ {
			docs = append(docs, bson.D{{"_id", i}, {"qty", 10 * i}})
		}
		if _, err := c.Database("shop").Collection(coll).InsertMany(context.Background(), docs); err != nil {
			t.Fatal(err)
		}
	}
	return name, config.Policy{
		Default:       config.ModeOff,
		MaxCandidates: 50,
		LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{
			{Match: "shop." + name, Mode: config.ModeEnforce},
			{Match: "shop." + name + "_audit", Mode: config.ModeAudit},
		},
	}
}

// snapshot reads a collection directly from the upstream, sorted by _id.
func snapshot(t *testing.T, coll string) []bson.M {
	t.Helper()
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	cur, err := c.Database("shop").Collection(coll).Find(context.Background(), bson.D{}, options.Find().SetSort(bson.D{{"_id", 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var out []bson.M
	if err := cur.All(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func lockBusy(t *testing.T, err error, reason string) mongo.ServerError {
	t.Helper()
	if err == nil {
		t.Fatalf("write allowed, want a LockBusy refusal (%s)", reason)
	}
	se, ok := err.(mongo.ServerError)
	if !ok {
		t.Fatalf("want a server error, got %T %v", err, err)
	}
	if !se.HasErrorCode(46) {
		t.Fatalf("want code 46 LockBusy, got %v", err)
	}
	if !strings.Contains(err.Error(), reason) {
		t.Fatalf("refusal %q does not mention %q", err, reason)
	}
	return se
}

func inSession(s mongo.Session) context.Context {
	return mongo.NewSessionContext(context.Background(), s)
}

func acquire(t *testing.T, c *mongo.Client, s mongo.Session, coll string, ids ...any) {
	t.Helper()
	if err := c.Database("shop").RunCommand(inSession(s), bson.D{{"acquireLock", coll}, {"ids", bson.A(ids)}, {"leaseMS", 20000}}).Err(); err != nil {
		t.Fatalf("acquireLock %v: %v", ids, err)
	}
}

// TestEnforcedWritesNeedTheLock walks the core promise with the Go driver:
// unlocked writes are refused and change nothing, locked writes apply.
func TestEnforcedWritesNeedTheLock(t *testing.T) {
	coll, pol := protected(t, 5)
	st := startStackWith(t, stackOptions{memStore: decisionStore(), policy: pol})
	alice := connect(t, st.uri, "alice")
	bob := connect(t, st.uri, "bob")
	sa, sb := session(t, alice), session(t, bob)
	ca, cb := alice.Database("shop").Collection(coll), bob.Database("shop").Collection(coll)
	before := snapshot(t, coll)

	// No lock at all: every write API is refused.
	refusals := []func(ctx context.Context) error{
		func(ctx context.Context) error {
			_, err := ca.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$inc", bson.D{{"qty", 1}}}})
			return err
		},
		func(ctx context.Context) error {
			_, err := ca.UpdateMany(ctx, bson.D{{"qty", bson.D{{"$gt", 0}}}}, bson.D{{"$inc", bson.D{{"qty", 1}}}})
			return err
		},
		func(ctx context.Context) error {
			_, err := ca.ReplaceOne(ctx, bson.D{{"_id", 2}}, bson.D{{"qty", 0}})
			return err
		},
		func(ctx context.Context) error { _, err := ca.DeleteOne(ctx, bson.D{{"_id", 3}}); return err },
		func(ctx context.Context) error { _, err := ca.DeleteMany(ctx, bson.D{}); return err },
		func(ctx context.Context) error {
			return ca.FindOneAndUpdate(ctx, bson.D{{"_id", 4}}, bson.D{{"$set", bson.D{{"x", 1}}}}).Err()
		},
		func(ctx context.Context) error {
			return ca.FindOneAndReplace(ctx, bson.D{{"qty", 50}}, bson.D{{"qty", 1}}).Err()
		},
		func(ctx context.Context) error { return ca.FindOneAndDelete(ctx, bson.D{{"_id", 5}}).Err() },
		func(ctx context.Context) error {
			_, err := ca.UpdateOne(ctx, bson.D{{"_id", 99}}, bson.D{{"$set", bson.D{{"qty", 1}}}}, options.Update().SetUpsert(true))
			return err
		},
		func(ctx context.Context) error {
			// The driver sends runs of one kind as one command each; the
			// first run is refused, so the ordered bulk write stops there.
			_, err := ca.BulkWrite(ctx, []mongo.WriteModel{
				mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", 1}}).SetUpdate(bson.D{{"$inc", bson.D{{"qty", 1}}}}),
				mongo.NewReplaceOneModel().SetFilter(bson.D{{"_id", 2}}).SetReplacement(bson.D{{"qty", 0}}),
				mongo.NewDeleteOneModel().SetFilter(bson.D{{"_id", 3}}),
				mongo.NewInsertOneModel().SetDocument(bson.D{{"_id", 100}}),
			})
			return err
		},
		func(ctx context.Context) error { return ca.Drop(ctx) },
	}
	for i, f := range refusals {
		if err := f(inSession(sa)); err == nil {
			t.Fatalf("write %d allowed without a lock", i)
		} else {
			lockBusy(t, err, "refused")
		}
	}
	if after := snapshot(t, coll); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused writes changed the collection:\nbefore %v\nafter  %v", before, after)
	}

	// Locked by Alice: Bob is refused and told who holds it.
	acquire(t, alice, sa, coll, 1, 2, 99)
	_, err := cb.UpdateOne(inSession(sb), bson.D{{"_id", 1}}, bson.D{{"$inc", bson.D{{"qty", 1}}}})
	if se := lockBusy(t, err, "wait for the holder"); !strings.Contains(se.Error(), `"alice"`) {
		t.Fatalf("refusal does not name the holder: %v", se)
	}
	// The same _id in another numeric type is the same lock.
	_, err = cb.UpdateOne(inSession(sb), bson.D{{"_id", 1.0}}, bson.D{{"$inc", bson.D{{"qty", 1}}}})
	lockBusy(t, err, "wait for the holder")

	// Alice's writes under her locks apply.
	if r, err := ca.UpdateOne(inSession(sa), bson.D{{"_id", int64(1)}}, bson.D{{"$inc", bson.D{{"qty", 1}}}}); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("locked update: %v %v", r, err)
	}
	if r, err := ca.UpdateMany(inSession(sa), bson.D{{"_id", bson.D{{"$in", bson.A{1, 2}}}}}, bson.D{{"$set", bson.D{{"seen", true}}}}); err != nil || r.ModifiedCount != 2 {
		t.Fatalf("locked updateMany: %v %v", r, err)
	}
	if r, err := ca.UpdateOne(inSession(sa), bson.D{{"_id", 99}}, bson.D{{"$set", bson.D{{"qty", 1}}}}, options.Update().SetUpsert(true)); err != nil || r.UpsertedCount != 1 {
		t.Fatalf("locked upsert: %v %v", r, err)
	}
	var got bson.M
	if err := ca.FindOneAndUpdate(inSession(sa), bson.D{{"_id", 2}}, bson.D{{"$inc", bson.D{{"qty", 5}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&got); err != nil || got["qty"] != int32(25) {
		t.Fatalf("locked findOneAndUpdate: %v %v", got, err)
	}
	// A filter that does not pin _id, all of whose matches Alice holds.
	if r, err := ca.UpdateMany(inSession(sa), bson.D{{"seen", true}}, bson.D{{"$inc", bson.D{{"qty", 100}}}}); err != nil || r.ModifiedCount != 2 {
		t.Fatalf("resolved updateMany under locks: %v %v", r, err)
	}
	// One update command whose second statement is not covered is refused
	// whole: the covered first statement is not applied either.
	_, err = ca.BulkWrite(inSession(sa), []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", 1}}).SetUpdate(bson.D{{"$inc", bson.D{{"qty", 1000}}}}),
		mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", 3}}).SetUpdate(bson.D{{"$inc", bson.D{{"qty", 1000}}}}),
	})
	lockBusy(t, err, "does not hold the lock on _id 3")
	doc := snapshot(t, coll)[0]
	if doc["qty"] != int32(111) {
		t.Fatalf("_id 1 after the refused bulk write: %v, want qty 111", doc)
	}
	if testutil.ToFloat64(st.metrics.pinned) < 1 {
		t.Fatalf("the resolved updateMany was not pinned")
	}
}

// racingResolver inserts a newly matching document right after resolving,
// as a concurrent writer would between the proxy's check and its write.
type racingResolver struct {
	Resolver
	coll *mongo.Collection
}

func (r racingResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	ids, err := r.Resolver.Candidates(ctx, ns, filter, collation, hint, limit)
	if err == nil {
		_, err = r.coll.InsertOne(ctx, bson.D{{"_id", "late"}, {"status", "open"}})
	}
	return ids, err
}

// TestDocumentThatStartsMatchingIsNotWritten: the forwarded write is pinned
// to the verified ids, so a document that matches only after resolution is
// left alone.
func TestDocumentThatStartsMatchingIsNotWritten(t *testing.T) {
	coll, pol := protected(t, 3)
	direct, err := mongo.Connect(context.Background(), options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Disconnect(context.Background())
	dc := direct.Database("shop").Collection(coll)
	if _, err := dc.UpdateMany(context.Background(), bson.D{}, bson.D{{"$set", bson.D{{"status", "open"}}}}); err != nil {
		t.Fatal(err)
	}
	st := startStackWith(t, stackOptions{policy: pol, resolver: func(r Resolver) Resolver { return racingResolver{r, dc} }})
	c := connect(t, st.uri, "racer")
	s := session(t, c)
	acquire(t, c, s, coll, 1, 2, 3)
	r, err := c.Database("shop").Collection(coll).UpdateMany(inSession(s), bson.D{{"status", "open"}}, bson.D{{"$set", bson.D{{"status", "done"}}}})
	if err != nil || r.MatchedCount != 3 {
		t.Fatalf("pinned updateMany: %v %v", r, err)
	}
	var late bson.M
	if err := dc.FindOne(context.Background(), bson.D{{"_id", "late"}}).Decode(&late); err != nil || late["status"] != "open" {
		t.Fatalf("the late document was written: %v %v", late, err)
	}
}

// TestAuditForwardsAndCounts: an audited namespace lets the unlocked write
// through and counts what enforce would have refused.
func TestAuditForwardsAndCounts(t *testing.T) {
	coll, pol := protected(t, 2)
	st := startStackWith(t, stackOptions{memStore: decisionStore(), policy: pol})
	c := connect(t, st.uri, "auditor")
	s := session(t, c)
	audited := coll + "_audit"
	if _, err := c.Database("shop").Collection(audited).UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"qty", 7}}}}); err != nil {
		t.Fatalf("audited write refused: %v", err)
	}
	if got := snapshot(t, audited)[0]["qty"]; got != int32(7) {
		t.Fatalf("audited write not applied: qty %v", got)
	}
	rule := "shop." + audited
	if n := testutil.ToFloat64(st.metrics.decisions.WithLabelValues(rule, enforce.DecisionWouldReject, enforce.ReasonNotLocked)); n != 1 {
		t.Fatalf("would_reject count = %v, want 1", n)
	}
	// Reads and unprotected namespaces pass untouched.
	if err := c.Database("shop").Collection(coll).FindOne(inSession(s), bson.D{{"_id", 1}}).Err(); err != nil {
		t.Fatalf("read of an enforced collection: %v", err)
	}
	if _, err := c.Database("shop").Collection("free").InsertOne(context.Background(), bson.D{{"x", 1}}); err != nil {
		t.Fatal(err)
	}
}

// TestLockStoreDownFailsClosed: with the lock store unreachable, enforced
// writes are refused with a clear error, reads work, audited writes pass.
func TestLockStoreDownFailsClosed(t *testing.T) {
	coll, pol := protected(t, 2)
	st := startStackWith(t, stackOptions{policy: pol, storeURI: "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"})
	c := connect(t, st.uri, "down")
	s := session(t, c)
	_, err := c.Database("shop").Collection(coll).UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"qty", 0}}}})
	lockBusy(t, err, "lock store cannot confirm")
	if err := c.Database("shop").Collection(coll).FindOne(context.Background(), bson.D{{"_id", 1}}).Err(); err != nil {
		t.Fatalf("read while the lock store is down: %v", err)
	}
	if _, err := c.Database("shop").Collection(coll+"_audit").UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"qty", 0}}}}); err != nil {
		t.Fatalf("audited write while the lock store is down: %v", err)
	}
	if got := snapshot(t, coll)[0]["qty"]; got != int32(10) {
		t.Fatalf("enforced write landed: qty %v", got)
	}
}

// TestLimitsAndUnacknowledged: over maxCandidates is refused; a refused
// unacknowledged write closes the connection and writes nothing.
func TestLimitsAndUnacknowledged(t *testing.T) {
	coll, pol := protected(t, 60)
	st := startStackWith(t, stackOptions{memStore: decisionStore(), policy: pol})
	c := connect(t, st.uri, "limits")
	s := session(t, c)
	_, err := c.Database("shop").Collection(coll).UpdateMany(inSession(s), bson.D{{"qty", bson.D{{"$gte", 0}}}}, bson.D{{"$set", bson.D{{"x", 1}}}})
	lockBusy(t, err, "more than 50 documents")

	// The refusal is decided before anything is forwarded, so once it is
	// counted the write can no longer land: wait for the count, then look.
	// (Drivers send no lsid with w:0 writes: the reason is no_session.)
	refused := st.metrics.decisions.WithLabelValues("shop."+coll, enforce.DecisionReject, refuse.ReasonNoSession)
	before := testutil.ToFloat64(refused)
	w0 := connect(t, st.uri, "fire-and-forget")
	coll0 := w0.Database("shop").Collection(coll, options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	_, _ = coll0.UpdateOne(inSession(session(t, w0)), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"qty", -1}}}})
	testkit.Eventually(t, 10*time.Second, "the unacknowledged write to be refused", func() bool { return testutil.ToFloat64(refused) > before })
	if got := snapshot(t, coll)[0]["qty"]; got != int32(10) {
		t.Fatalf("unacknowledged unlocked write landed: qty %v", got)
	}
}

// TestBindRequiresTheToken: a lock taken with bind covers only writes that
// carry the same binding in their comment, even in the holder's session.
func TestBindRequiresTheToken(t *testing.T) {
	coll, pol := protected(t, 2)
	st := startStackWith(t, stackOptions{policy: pol})
	c := connect(t, st.uri, "binder")
	s := session(t, c)
	if err := c.Database("shop").RunCommand(inSession(s), bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"bind", "unit-of-work-7f3a"}}).Err(); err != nil {
		t.Fatal(err)
	}
	col := c.Database("shop").Collection(coll)
	_, err := col.UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"x", 1}}}})
	lockBusy(t, err, "refused")
	_, err = col.UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"x", 1}}}},
		options.Update().SetComment("lockgate:wrong"))
	lockBusy(t, err, "refused")
	r, err := col.UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"x", 1}}}},
		options.Update().SetComment("lockgate:unit-of-work-7f3a"))
	if err != nil || r.ModifiedCount != 1 {
		t.Fatalf("write with the binding: %v %v", r, err)
	}
}

// TestRefusalNamesTheOtherNamespaceLock: a session that locked _id 1 in
// another namespace (acquireLock run on mongosh's default database "test")
// is refused in shop, and the refusal says where its lock is (issue 9). A
// lock another session holds elsewhere on the same _id is not mentioned:
// a refusal names only what the caller itself holds.
func TestRefusalNamesTheOtherNamespaceLock(t *testing.T) {
	coll, pol := protected(t, 2)
	st := startStackWith(t, stackOptions{policy: pol})
	c := connect(t, st.uri, "elsewhere")
	s := session(t, c)
	if err := c.Database("test").RunCommand(inSession(s), bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}}).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Database("shop").Collection(coll).UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"x", 1}}}})
	lockBusy(t, err, "it holds the lock on _id 1 in test."+coll+` instead: a lock covers only the namespace it was taken in; run {acquireLock: "`+coll+`"} on database shop`)

	other := connect(t, st.uri, "other")
	so := session(t, other)
	if err := other.Database("test").RunCommand(inSession(so), bson.D{{"acquireLock", coll}, {"ids", bson.A{2}}}).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Database("shop").Collection(coll).UpdateOne(inSession(s), bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"x", 1}}}})
	if se := lockBusy(t, err, "does not hold the lock on _id 2"); strings.Contains(se.Error(), "instead") {
		t.Errorf("the refusal points at another session's lock: %v", se)
	}
}
