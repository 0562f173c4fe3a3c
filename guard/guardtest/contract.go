package guardtest

import (
	"context"
	"slices"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// ResolverAPI is guard.Resolver, restated so that this package does not
// import guard.
type ResolverAPI interface {
	Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error)
	SimpleCollation(ctx context.Context, ns namespace.Namespace) (bool, error)
	Capped(ctx context.Context, ns namespace.Namespace) (bool, error)
}

// ResolverFixture is one resolver under test and the means to give it
// documents.
type ResolverFixture struct {
	Resolver ResolverAPI
	// DB is a database of the fixture's own: the tests use its
	// collections only.
	DB           string
	Insert       func(t *testing.T, ns string, docs ...bson.D)
	CreateCapped func(t *testing.T, ns string)
}

// RunResolverContract runs the resolver contract against the fixtures
// open returns: guard.MongoResolver on the embedded FerretDB (guard's
// TestResolverContract) and Resolver (TestResolverContract here).
func RunResolverContract(t *testing.T, open func(t *testing.T) ResolverFixture) {
	docs := []bson.D{
		{{Key: "_id", Value: 1}, {Key: "status", Value: "open"}, {Key: "n", Value: 1}, {Key: "tags", Value: bson.A{"a", "b"}}, {Key: "a", Value: bson.D{{Key: "b", Value: 5}}}},
		{{Key: "_id", Value: 2}, {Key: "status", Value: "done"}, {Key: "n", Value: int64(2)}, {Key: "tags", Value: bson.A{"b"}}},
		{{Key: "_id", Value: "three"}, {Key: "status", Value: "open"}, {Key: "n", Value: 3.5}},
		{{Key: "_id", Value: 4}, {Key: "status", Value: "open"}},
		{{Key: "_id", Value: 5}, {Key: "status", Value: "open"}},
	}
	for _, c := range []struct {
		name   string
		filter bson.D
		want   []any
	}{
		{"equality", bson.D{{Key: "status", Value: "done"}}, []any{2}},
		{"numbers of any type", bson.D{{Key: "n", Value: 2.0}}, []any{2}},
		{"$in on _id", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{1, "three", 9}}}}}, []any{1, "three"}},
		{"range", bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 1}, {Key: "$lte", Value: 3.5}}}}, []any{2, "three"}},
		{"$or", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "status", Value: "done"}}, bson.D{{Key: "_id", Value: 1}}}}}, []any{1, 2}},
		{"$and", bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "status", Value: "open"}}, bson.D{{Key: "n", Value: bson.D{{Key: "$exists", Value: true}}}}}}}, []any{1, "three"}},
		{"array contains", bson.D{{Key: "tags", Value: "a"}}, []any{1}},
		{"dotted path", bson.D{{Key: "a.b", Value: 5}}, []any{1}},
		{"no match", bson.D{{Key: "status", Value: "lost"}}, nil},
		{"everything", bson.D{}, []any{1, 2, "three", 4, 5}},
	} {
		t.Run("Candidates/"+c.name, func(t *testing.T) {
			f := open(t)
			ns := f.DB + ".orders"
			f.Insert(t, ns, docs...)
			filter, _ := bson.Marshal(c.filter)
			got, err := f.Resolver.Candidates(context.Background(), namespace.Of(ns), filter, nil, bsoncore.Value{}, 100)
			if err != nil {
				t.Fatal(err)
			}
			sameIDs(t, got, c.want)
		})
	}
	t.Run("Candidates/limit", func(t *testing.T) {
		f := open(t)
		ns := f.DB + ".orders"
		f.Insert(t, ns, docs...)
		filter, _ := bson.Marshal(bson.D{{Key: "status", Value: "open"}})
		got, err := f.Resolver.Candidates(context.Background(), namespace.Of(ns), filter, nil, bsoncore.Value{}, 2)
		if err != nil || len(got) != 2 {
			t.Fatalf("limit 2 of 4 matches: %v %v", got, err)
		}
	})
	t.Run("Candidates/missing collection", func(t *testing.T) {
		f := open(t)
		filter, _ := bson.Marshal(bson.D{})
		got, err := f.Resolver.Candidates(context.Background(), namespace.New(f.DB, "nothing"), filter, nil, bsoncore.Value{}, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("%v %v, want no candidates and no error", got, err)
		}
	})
	t.Run("SimpleCollation", func(t *testing.T) {
		f := open(t)
		ns := f.DB + ".orders"
		f.Insert(t, ns, docs[0])
		for _, n := range []string{ns, f.DB + ".nothing"} {
			if ok, err := f.Resolver.SimpleCollation(context.Background(), namespace.Of(n)); err != nil || !ok {
				t.Fatalf("%s: %v %v, want simple", n, ok, err)
			}
		}
	})
	t.Run("Capped", func(t *testing.T) {
		f := open(t)
		plain, capped := f.DB+".plain", f.DB+".capped"
		f.Insert(t, plain, docs[0])
		f.CreateCapped(t, capped)
		for n, want := range map[string]bool{plain: false, capped: true, f.DB + ".nothing": false} {
			if got, err := f.Resolver.Capped(context.Background(), namespace.Of(n)); err != nil || got != want {
				t.Fatalf("%s: capped %v (%v), want %v", n, got, err, want)
			}
		}
	})
}

func sameIDs(t *testing.T, got []docid.ID, want []any) {
	t.Helper()
	var g, w []string
	for _, id := range got {
		g = append(g, id.Key())
	}
	for _, v := range want {
		id, err := docid.Of(v)
		if err != nil {
			t.Fatal(err)
		}
		w = append(w, id.Key())
	}
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		t.Fatalf("candidates %v, want %v", got, want)
	}
}
