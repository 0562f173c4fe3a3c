package lockstore

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// TestUpstreamOperations checks, against the real upstream, the operations
// the store relies on: an insert of an existing _id fails with a duplicate
// key (the store's only compare-and-swap), a sorted find returns the
// highest generation of a key, $in finds, and deletes by _id.
func TestUpstreamOperations(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	for _, seq := range []int64{1, 2, 3} {
		g := &gen{ID: genID("db.c/01", seq), Key: "db.c/01", Seq: seq, Owner: sessionBinary([]byte("a"))}
		if ok, err := s.insert(ctx, opAcquire, g); !ok || err != nil {
			t.Fatalf("insert claim %d: %v %v", seq, ok, err)
		}
		if err := s.writeHead(ctx, opAcquire, g); err != nil {
			t.Fatalf("write head %d: %v", seq, err)
		}
	}
	if _, err := s.claims.InsertOne(ctx, &gen{ID: genID("db.c/01", 2), Key: "db.c/01", Seq: 2}); !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("second insert of one claim: %v, want a duplicate key error", err)
	}
	if ok, err := s.insert(ctx, opAcquire, &gen{ID: genID("db.c/01", 2), Key: "db.c/01", Seq: 2}); ok || err != nil {
		t.Fatalf("insert helper on a duplicate: %v %v, want false, nil", ok, err)
	}
	h, err := s.head(ctx, "db.c/01")
	if err != nil || h == nil || h.Seq != 3 || !h.Head || h.Owner == nil || string(h.Owner.Data) != "a" {
		t.Fatalf("head: %+v %v, want seq 3", h, err)
	}
	if c, err := s.claim(ctx, "db.c/01", 2); err != nil || c == nil || c.Seq != 2 || c.Head {
		t.Fatalf("claim 2: %+v %v", c, err)
	}
	g := &gen{ID: genID("db.c/0102", 9), Key: "db.c/0102", Seq: 9}
	if _, err := s.insert(ctx, opAcquire, g); err != nil {
		t.Fatal(err)
	}
	if err := s.writeHead(ctx, opAcquire, g); err != nil {
		t.Fatal(err)
	}
	hs, err := s.heads(ctx, []string{"db.c/01", "db.c/0102", "db.c/none"})
	if err != nil || len(hs) != 2 || hs["db.c/01"].Seq != 3 || hs["db.c/0102"].Seq != 9 {
		t.Fatalf("heads: %v %v", hs, err)
	}
	res, err := s.claims.DeleteMany(ctx, bson.D{})
	if err != nil || res.DeletedCount != 4 {
		t.Fatalf("delete claims: %v %v", res, err)
	}
	if h, _ := s.head(ctx, "db.c/none"); h != nil {
		t.Fatalf("head of an unknown key: %+v", h)
	}
}
