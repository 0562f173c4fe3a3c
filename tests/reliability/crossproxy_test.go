package reliability

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestReleaseThroughAnotherLockgate is issue 27 item 1: session S locks
// _id X through lockgate P1 and writes; S releases through P2; session B
// takes the lock through P2 and writes; S's next write through P1 must be
// refused. Drivers spread one session's operations over every host of a
// connection string, so S reaching two lockgates is ordinary. Here S's
// operations reach P2 through a second client given S's session id.
// Before the fix P1 answered from a cache it trusted for a second and
// forwarded S's write over B's in every round (5 of 5).
func TestReleaseThroughAnotherLockgate(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	lockColl, collName := uniq("locks"), uniq("xproxy")
	ns := relDB + "." + collName
	const secret = "reliability-shared-owner-secret-0123456789"
	start := func() *gw {
		cfg := gatewayConfig(upstream.URI(), lockColl, ns)
		cfg.Lockstore.OwnerSecret = secret // every lockgate of one lock store shares it
		return startGateway(t, cfg)
	}
	p1, p2 := start(), start()
	noRetry := options.Client().SetRetryWrites(false) // two clients count txnNumbers apart
	viaP1 := connect(t, p1.URI, "s-via-p1", noRetry)
	viaP2 := connect(t, p2.URI, "s-via-p2", noRetry)
	other := connect(t, p2.URI, "b-via-p2", noRetry)
	direct := connect(t, upstream.URI(), "direct").Database(relDB).Collection(collName)

	lock := func(sctx context.Context, db *mongo.Database, id int) error {
		return db.RunCommand(sctx, bson.D{{Key: "acquireLock", Value: collName}, {Key: "ids", Value: bson.A{id}}, {Key: "leaseMS", Value: 30000}}).Err()
	}
	set := func(sctx context.Context, c *mongo.Client, id int, by string) error {
		_, err := c.Database(relDB).Collection(collName).UpdateOne(sctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "by", Value: by}}}})
		return err
	}
	const rounds = 5
	landed := 0
	for i := range rounds {
		id := 1000 + i
		if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "by", Value: "nobody"}}); err != nil {
			t.Fatal(err)
		}
		s, err := viaP1.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		sOnP2, err := viaP2.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		// The same logical session on the second client: what a driver
		// with both lockgates in its connection string does by itself.
		sOnP2.(mongo.XSession).ClientSession().Server.SessionID = bsoncore.Document(s.ID())
		b, err := other.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		sP1 := mongo.NewSessionContext(ctx, s)
		sP2 := mongo.NewSessionContext(ctx, sOnP2)
		bP2 := mongo.NewSessionContext(ctx, b)

		if err := lock(sP1, viaP1.Database(relDB), id); err != nil {
			t.Fatalf("round %d: S acquires through P1: %v", i, err)
		}
		if err := set(sP1, viaP1, id, "S"); err != nil {
			t.Fatalf("round %d: S writes under its lock through P1: %v", i, err)
		}
		var rel struct {
			Released int `bson:"released"`
		}
		if err := viaP2.Database(relDB).RunCommand(sP2, bson.D{{Key: "releaseLock", Value: collName}, {Key: "ids", Value: bson.A{id}}}).Decode(&rel); err != nil || rel.Released != 1 {
			t.Fatalf("round %d: S releases through P2: %+v %v", i, rel, err)
		}
		if err := lock(bP2, other.Database(relDB), id); err != nil {
			t.Fatalf("round %d: B acquires through P2 after S released: %v", i, err)
		}
		if err := set(bP2, other, id, "B"); err != nil {
			t.Fatalf("round %d: B writes under its lock: %v", i, err)
		}
		err = set(sP1, viaP1, id, "S-stale")
		var doc struct {
			By string `bson:"by"`
		}
		if derr := direct.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc); derr != nil {
			t.Fatal(derr)
		}
		switch {
		case err == nil || doc.By != "B":
			landed++
			t.Errorf("round %d: S's write through P1 after its release through P2 was accepted (%v); the document says %q, B wrote %q", i, err, doc.By, "B")
		case commandCode(err) != 46:
			t.Errorf("round %d: S's stale write was refused with %v, want LockBusy (46)", i, err)
		}
		if err := other.Database(relDB).RunCommand(bP2, bson.D{{Key: "releaseLock", Value: collName}}).Err(); err != nil {
			t.Fatalf("round %d: B releases: %v", i, err)
		}
		b.EndSession(ctx)
		s.EndSession(ctx)
		// sOnP2 shares s's id: ending it would end s's session twice.
	}
	t.Logf("%d of %d stale writes landed", landed, rounds)
	if landed > 0 {
		t.Fatalf("%d of %d stale writes through P1 landed on B's document", landed, rounds)
	}
}
