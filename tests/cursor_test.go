package tests

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestCursorGetMoreAndKillCursors reads a collection through the proxy with
// a small batchSize, so the driver must issue getMore, and closes a second
// cursor before it is exhausted, so the driver must issue killCursors. The
// documents and their order must be exactly those inserted, the proxy must
// have seen the getMore and killCursors commands (its per-command counters),
// and a killed cursor must really be gone upstream.
func TestCursorGetMoreAndKillCursors(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, 2*time.Minute)
	db := connect(t, g.URI).Database(dbName(t))
	coll := db.Collection("c")
	if err := db.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	const total, batch = 100, 7
	var docs []any
	for i := 0; i < total; i++ {
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "s", Value: fmt.Sprintf("value-%03d", i)}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}

	getMores0 := g.metricValue(t, "lockgate_commands_total", map[string]string{"command": "getMore"})
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(batch).SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for cur.Next(ctx) {
		var d struct {
			ID int    `bson:"_id"`
			S  string `bson:"s"`
		}
		if err := cur.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if d.ID != i || d.S != fmt.Sprintf("value-%03d", i) {
			t.Fatalf("document %d: got %+v", i, d)
		}
		i++
	}
	if err := cur.Err(); err != nil {
		t.Fatalf("cursor: %v", err)
	}
	cur.Close(ctx)
	if i != total {
		t.Fatalf("read %d documents, want %d", i, total)
	}
	// 100 documents in batches of 7: the find returns 7, then 14 getMores
	// return the other 93 (the last one with cursor id 0).
	wantGetMores := float64((total - batch + batch - 1) / batch)
	if got := g.metricValue(t, "lockgate_commands_total", map[string]string{"command": "getMore"}) - getMores0; got < wantGetMores {
		t.Errorf("proxy counted %v getMore commands, want at least %v", got, wantGetMores)
	}

	// A cursor closed before exhaustion: the driver sends killCursors.
	kills0 := g.metricValue(t, "lockgate_commands_total", map[string]string{"command": "killCursors"})
	cur, err = coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(5).SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 3; j++ {
		if !cur.Next(ctx) {
			t.Fatalf("cursor ended early: %v", cur.Err())
		}
	}
	if cur.ID() == 0 {
		t.Fatal("cursor is already exhausted after 3 of 100 documents; batchSize was not honoured")
	}
	if err := cur.Close(ctx); err != nil {
		t.Fatalf("closing cursor: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, "the proxy to count a killCursors command", func() bool {
		return g.metricValue(t, "lockgate_commands_total", map[string]string{"command": "killCursors"})-kills0 >= 1
	})

	// The same protocol by hand, to see the upstream's answers: find with a
	// cursor left open, killCursors naming it, then getMore on it must fail
	// with CursorNotFound.
	var found struct {
		Cursor struct {
			ID         int64      `bson:"id"`
			FirstBatch []bson.Raw `bson:"firstBatch"`
		} `bson:"cursor"`
	}
	if err := db.RunCommand(ctx, bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 2}, {Key: "sort", Value: bson.D{{Key: "_id", Value: 1}}}}).Decode(&found); err != nil {
		t.Fatalf("find: %v", err)
	}
	if found.Cursor.ID == 0 || len(found.Cursor.FirstBatch) != 2 {
		t.Fatalf("find with batchSize 2: got cursor id %d and %d documents", found.Cursor.ID, len(found.Cursor.FirstBatch))
	}
	var killed struct {
		CursorsKilled []int64 `bson:"cursorsKilled"`
	}
	if err := db.RunCommand(ctx, bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{found.Cursor.ID}}}).Decode(&killed); err != nil {
		t.Fatalf("killCursors: %v", err)
	}
	if len(killed.CursorsKilled) != 1 || killed.CursorsKilled[0] != found.Cursor.ID {
		t.Fatalf("killCursors of %d: cursorsKilled = %v", found.Cursor.ID, killed.CursorsKilled)
	}
	err = db.RunCommand(ctx, bson.D{{Key: "getMore", Value: found.Cursor.ID}, {Key: "collection", Value: "c"}}).Err()
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 43 {
		t.Fatalf("getMore on a killed cursor: got %v, want CommandError code 43 (CursorNotFound)", err)
	}
}
