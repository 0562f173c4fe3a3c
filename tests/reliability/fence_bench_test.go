package reliability

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/config"
)

// BenchmarkFence measures what the document fence costs, in one run and
// one gateway: the same operations on an enforced namespace without the
// fence and on one with it, both seeded with 1000 documents with string
// _ids (FerretDB reads string _ids through its index).
//
//	go test -run '^$' -bench BenchmarkFence -benchtime 2s ./tests/reliability
//
// acquire-release: acquireLock + releaseLock of one existing document
// (the fence adds the stamp, one update). write: updateOne({_id}, {$inc})
// under a lock held for the whole benchmark (the fence adds the rewrite
// and a filter on the stamp, which FerretDB cannot answer from the _id
// index alone).
func BenchmarkFence(b *testing.B) {
	plain, fenced := uniq("plain"), uniq("fenced")
	cfg := gatewayConfig(upstream.URI(), uniq("locks"), "bench."+plain)
	cfg.Policy.Namespaces = append(cfg.Policy.Namespaces, config.NamespaceRule{Match: "bench." + fenced, Mode: config.ModeEnforce, Fence: config.FenceDocument})
	g := startGateway(b, cfg)
	ctx := testCtx(b, 10*time.Minute)
	direct := connect(b, upstream.URI(), "seed").Database("bench")
	for _, coll := range []string{plain, fenced} {
		docs := make([]any, 1000)
		for i := range docs {
			docs[i] = bson.D{{Key: "_id", Value: fmt.Sprintf("doc-%04d", i)}, {Key: "n", Value: 0}, {Key: "pad", Value: "0123456789abcdef0123456789abcdef"}}
		}
		if _, err := direct.Collection(coll).InsertMany(ctx, docs); err != nil {
			b.Fatal(err)
		}
	}
	p := connect(b, g.URI, "fence-bench")
	s, err := p.StartSession()
	if err != nil {
		b.Fatal(err)
	}
	defer s.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, s)
	db := p.Database("bench")
	for _, coll := range []string{plain, fenced} {
		name := "plain"
		if coll == fenced {
			name = "fenced"
		}
		b.Run("acquire-release/"+name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				ids := bson.A{fmt.Sprintf("doc-%04d", 500+i%100)}
				if err := db.RunCommand(sctx, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: ids}}).Err(); err != nil {
					b.Fatal(err)
				}
				if err := db.RunCommand(sctx, bson.D{{Key: "releaseLock", Value: coll}, {Key: "ids", Value: ids}}).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("write/"+name, func(b *testing.B) {
			id := "doc-0007"
			if err := db.RunCommand(sctx, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: bson.A{id}}, {Key: "leaseMS", Value: 600000}}).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := db.Collection(coll).UpdateOne(sctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
				if err != nil || r.ModifiedCount != 1 {
					b.Fatalf("write: %v %+v", err, r)
				}
			}
			b.StopTimer()
			if err := db.RunCommand(sctx, bson.D{{Key: "releaseLock", Value: coll}}).Err(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
