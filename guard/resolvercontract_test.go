package guard

import (
	"context"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/namespace"
)

// TestResolverContract runs guardtest's resolver contract against
// MongoResolver on the embedded FerretDB: the in-memory resolver of the
// fast tests passes the same.
func TestResolverContract(t *testing.T) {
	ctx := context.Background()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Disconnect(ctx) })
	r := NewResolver(client)
	coll := func(t *testing.T, ns string) *mongo.Collection {
		db, c := namespace.Of(ns).Parts()
		return client.Database(db).Collection(c)
	}
	guardtest.RunResolverContract(t, func(t *testing.T) guardtest.ResolverFixture {
		db := fmt.Sprintf("resolver_contract_%d", seq.Add(1))
		t.Cleanup(func() { client.Database(db).Drop(ctx) })
		return guardtest.ResolverFixture{
			Resolver: r,
			DB:       db,
			Insert: func(t *testing.T, ns string, docs ...bson.D) {
				ds := make([]any, len(docs))
				for i, d := range docs {
					ds[i] = d
				}
				if _, err := coll(t, ns).InsertMany(ctx, ds); err != nil {
					t.Fatal(err)
				}
			},
			CreateCapped: func(t *testing.T, ns string) {
				d, c := namespace.Of(ns).Parts()
				if err := client.Database(d).CreateCollection(ctx, c, options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<20)); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
