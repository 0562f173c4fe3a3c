package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestManyConcurrentClients runs 64 independent driver clients (each with
// its own connection pool, so its own proxy connections) doing 100
// operations each at the same time, and checks every result: each client reads back its own
// writes, and the final contents are exactly what the 64 clients wrote. A
// proxy that crossed replies between connections, or lost or reordered
// messages on one, would fail here.
func TestManyConcurrentClients(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, 5*time.Minute)
	// The same sizes under the race detector: its upstream runs outside
	// the detector (scripts/test.sh), so this package runs once, under
	// it, at full size (docs/TESTING.md, tenth round).
	clients, ops := 64, 100 // ops: 25 rounds of insert, find, update, find

	// One database per client: FerretDB keeps each database in one SQLite
	// file and answers concurrent writers to the same file with
	// "database is locked (SQLITE_BUSY)" errors, a limitation of the
	// upstream that would hide what this test is about.
	admin := connect(t, g.URI)
	dbOf := func(i int) string { return fmt.Sprintf("%s_%02d", dbName(t), i) }
	for i := 0; i < clients; i++ {
		if err := admin.Database(dbOf(i)).Drop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := 0; i < clients; i++ {
			admin.Database(dbOf(i)).Drop(context.Background())
		}
	})
	clientsList := make([]*mongo.Client, clients)
	for i := range clientsList {
		clientsList[i] = connect(t, g.URI, options.Client().SetMaxPoolSize(2))
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range clientsList {
		wg.Go(func() {
			if err := clientWorkload(ctx, c.Database(dbOf(i)).Collection("c"), i, ops/4); err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every document as its writer left it, checked through a fresh client.
	fresh := connect(t, g.URI)
	for i := 0; i < clients; i++ {
		cur, err := fresh.Database(dbOf(i)).Collection("c").Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		var all []struct {
			ID     string `bson:"_id"`
			Client int    `bson:"client"`
			Seq    int    `bson:"seq"`
			V      int    `bson:"v"`
		}
		if err := cur.All(ctx, &all); err != nil {
			t.Fatal(err)
		}
		if len(all) != ops/4 {
			t.Errorf("client %d: %d documents, want %d", i, len(all), ops/4)
		}
		seen := map[string]bool{}
		for _, d := range all {
			if d.Client != i || d.ID != fmt.Sprintf("c%02d-%03d", d.Client, d.Seq) || d.V != d.Client*1000+d.Seq+1 || seen[d.ID] {
				t.Errorf("client %d: unexpected document %+v", i, d)
			}
			seen[d.ID] = true
		}
	}
}

// clientWorkload does rounds of insert, read back, update, read back, each
// on a document only this client touches, and checks every answer.
func clientWorkload(ctx context.Context, c *mongo.Collection, client, rounds int) error {
	for seq := 0; seq < rounds; seq++ {
		id := fmt.Sprintf("c%02d-%03d", client, seq)
		v := client*1000 + seq
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "client", Value: client}, {Key: "seq", Value: seq}, {Key: "v", Value: v}}); err != nil {
			return fmt.Errorf("insert %s: %w", id, err)
		}
		var d struct {
			ID string `bson:"_id"`
			V  int    `bson:"v"`
		}
		if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil || d.ID != id || d.V != v {
			return fmt.Errorf("read %s after insert: got %+v, err %v", id, d, err)
		}
		r, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}})
		if err != nil || r.MatchedCount != 1 || r.ModifiedCount != 1 {
			return fmt.Errorf("update %s: %+v, err %v", id, r, err)
		}
		if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil || d.ID != id || d.V != v+1 {
			return fmt.Errorf("read %s after update: got %+v, err %v", id, d, err)
		}
	}
	return nil
}
