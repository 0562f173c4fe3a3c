package guardtest

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
)

// TestResolverContract runs the resolver contract against the in-memory
// Resolver; guard's TestResolverContract runs it against MongoResolver.
func TestResolverContract(t *testing.T) {
	RunResolverContract(t, func(t *testing.T) ResolverFixture {
		r := NewResolver()
		return ResolverFixture{
			Resolver: r,
			DB:       "shop",
			Insert: func(t *testing.T, ns string, docs ...bson.D) {
				for _, d := range docs {
					if err := r.Insert(ns, d); err != nil {
						t.Fatal(err)
					}
				}
			},
			CreateCapped: func(_ *testing.T, ns string) { r.CreateCapped(ns) },
		}
	})
}
