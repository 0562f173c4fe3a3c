package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// TestUpstreamRestart stops the upstream under a running proxy: writes
// through the proxy must fail with errors (never hang, never report
// success), and once the upstream is back on the same address and data
// directory, the same proxy and the same driver client must serve again
// without being restarted, with the data written before still there.
//
// Parallel: its upstream is its own, and most of its time is the writes
// waiting out their 3 s deadlines while the upstream is down.
func TestUpstreamRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	t.Cleanup(func() {
		if srv != nil {
			srv.Close()
		}
	})

	g := startGateway(t, srv.URI())
	ctx := testCtx(t, 3*time.Minute)
	coll := connect(t, g.URI).Database(dbName(t)).Collection("c")
	for _, id := range []string{"a", "b", "c"} {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
			t.Fatalf("insert %s before the restart: %v", id, err)
		}
	}

	srv.Close()
	for i := 0; i < 2; i++ {
		opCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := coll.InsertOne(opCtx, bson.D{{Key: "_id", Value: "during"}})
		cancel()
		if err == nil {
			t.Fatalf("insert %d while the upstream is down succeeded", i)
		}
		t.Logf("insert while the upstream is down: %v", err)
	}

	srv, err = embedded.Start(embedded.Options{Addr: addr, Dir: dir})
	if err != nil {
		t.Fatalf("restarting the upstream on %s: %v", addr, err)
	}

	// The driver may need a few attempts to rediscover the server behind
	// the proxy; the proxy itself must need nothing.
	var lastErr error
	testkit.Eventually(t, 60*time.Second, "a write through the proxy to succeed after the upstream restarted (last error in the log)", func() bool {
		opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, lastErr = coll.InsertOne(opCtx, bson.D{{Key: "_id", Value: "after"}})
		var we mongo.WriteException
		if errors.As(lastErr, &we) && we.HasErrorCode(11000) {
			// An earlier attempt was applied but its reply was lost.
			lastErr = nil
		}
		if lastErr != nil {
			t.Logf("insert after the restart: %v", lastErr)
		}
		return lastErr == nil
	})

	var ids []string
	cur, err := coll.Find(ctx, bson.D{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		ids = append(ids, d.ID)
	}
	want := map[string]bool{"a": true, "b": true, "c": true, "after": true}
	if len(ids) != len(want) {
		t.Fatalf("documents after the restart: %v, want a, b, c and after (the writes while down must not have happened)", ids)
	}
	for _, id := range ids {
		if !want[id] {
			t.Fatalf("documents after the restart: %v, want a, b, c and after", ids)
		}
	}
}
