package policy

import (
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// TestPlanSeals: for every form by which a request reaches a namespace
// other than its own collection, the plan holds that namespace (the
// boundary refuses the lock store's only by finding it there; a namespace
// missed is a way past it). The rows are the forms the two walks the plan
// replaced disagreed on or were found missing, and every nesting.
func TestPlanSeals(t *testing.T) {
	locks := namespace.New("lockgate", "locks")
	whole := namespace.Database("lockgate")
	lookup := func(from any) bson.D { return bson.D{{"$lookup", bson.D{{"from", from}, {"as", "x"}}}} }
	for _, tc := range []struct {
		name string
		body bson.D
		seqs func(t testing.TB) []wire.Sequence
		want namespace.Namespace
	}{
		{"clone writes the whole database", bson.D{{"clone", "elsewhere:27017"}, {"$db", "lockgate"}}, nil, whole},
		{"insert into system.indexes", bson.D{{"insert", "system.indexes"}, {"documents", bson.A{bson.D{{"ns", "lockgate.locks"}, {"key", bson.D{{"ts", 1}}}, {"name", "ttl"}, {"expireAfterSeconds", 0}}}}, {"$db", "lockgate"}}, nil, whole},
		{"internalRenameIfOptionsAndIndexesMatch from", bson.D{{"internalRenameIfOptionsAndIndexesMatch", 1}, {"from", "lockgate.locks"}, {"to", "shop.x"}, {"$db", "admin"}}, nil, locks},
		{"internalRenameIfOptionsAndIndexesMatch to", bson.D{{"internalRenameIfOptionsAndIndexesMatch", 1}, {"from", "shop.x"}, {"to", "lockgate.locks"}, {"$db", "admin"}}, nil, locks},
		{"renameCollection to", bson.D{{"renameCollection", "shop.x"}, {"to", "lockgate.locks"}, {"$db", "admin"}}, nil, locks},
		{"renameCollection from", bson.D{{"renameCollection", "lockgate.locks"}, {"to", "shop.x"}, {"$db", "admin"}}, nil, locks},
		{"$out in a nested pipeline", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$lookup", bson.D{{"from", "o"}, {"as", "x"}, {"pipeline", bson.A{
			bson.D{{"$unionWith", bson.D{{"coll", "o"}, {"pipeline", bson.A{bson.D{{"$out", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}}}}}}}}}}}}}}, {"$db", "shop"}}, nil, locks},
		{"$merge into another db", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$merge", bson.D{{"into", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}}}}}}, {"$db", "shop"}}, nil, locks},
		{"$lookup from another db", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{lookup(bson.D{{"db", "lockgate"}, {"coll", "locks"}})}}, {"$db", "shop"}}, nil, locks},
		{"$unionWith in a $facet", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$facet", bson.D{{"a", bson.A{bson.D{{"$unionWith", "locks"}}}}}}}}}, {"$db", "lockgate"}}, nil, locks},
		{"$graphLookup in a $lookup pipeline", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$lookup", bson.D{{"from", "o"}, {"as", "x"}, {"pipeline", bson.A{
			bson.D{{"$graphLookup", bson.D{{"from", "locks"}}}}}}}}}}}, {"$db", "lockgate"}}, nil, locks},
		{"pipeline in a document sequence", bson.D{{"aggregate", "orders"}, {"cursor", bson.D{}}, {"$db", "shop"}},
			func(t testing.TB) []wire.Sequence {
				return []wire.Sequence{clSeq(t, "pipeline", lookup(bson.D{{"db", "lockgate"}, {"coll", "locks"}}))}
			}, locks},
		{"bulkWrite nsInfo", bson.D{{"bulkWrite", 1}, {"ops", bson.A{bson.D{{"insert", 0}, {"document", bson.D{{"_id", 1}}}}}}, {"nsInfo", bson.A{bson.D{{"ns", "lockgate.locks"}}}}, {"$db", "admin"}}, nil, locks},
		{"bulkWrite nsInfo in a sequence", bson.D{{"bulkWrite", 1}, {"ops", bson.A{}}, {"$db", "admin"}},
			func(t testing.TB) []wire.Sequence {
				return []wire.Sequence{clSeq(t, "nsInfo", bson.D{{"ns", "lockgate.locks"}})}
			}, locks},
		{"applyOps op", bson.D{{"applyOps", bson.A{bson.D{{"op", "d"}, {"ns", "lockgate.locks"}, {"o", bson.D{{"_id", 1}}}}}}, {"$db", "admin"}}, nil, locks},
		{"applyOps command op", bson.D{{"applyOps", bson.A{bson.D{{"op", "c"}, {"ns", "lockgate.$cmd"}, {"o", bson.D{{"drop", "locks"}}}}}}, {"$db", "admin"}}, nil, locks},
		{"applyOps by uuid", bson.D{{"applyOps", bson.A{bson.D{{"op", "d"}, {"ui", "u"}, {"o", bson.D{}}}}}, {"$db", "admin"}}, nil, namespace.Unknown()},
		{"mapReduce out to another db", bson.D{{"mapReduce", "orders"}, {"map", "f"}, {"reduce", "g"}, {"out", bson.D{{"merge", "locks"}, {"db", "lockgate"}}}, {"$db", "shop"}}, nil, locks},
		{"create a view on", bson.D{{"create", "v"}, {"viewOn", "locks"}, {"pipeline", bson.A{}}, {"$db", "lockgate"}}, nil, locks},
		{"create a view whose pipeline looks up", bson.D{{"create", "v"}, {"viewOn", "orders"}, {"pipeline", bson.A{lookup(bson.D{{"db", "lockgate"}, {"coll", "locks"}})}}, {"$db", "shop"}}, nil, locks},
		{"explained aggregate", bson.D{{"explain", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$out", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}}}}}}, {"$db", "shop"}}, nil, locks},
		{"dropDatabase", bson.D{{"dropDatabase", 1}, {"$db", "lockgate"}}, nil, whole},
		{"copydb todb", bson.D{{"copydb", 1}, {"fromdb", "shop"}, {"todb", "lockgate"}, {"$db", "admin"}}, nil, whole},
		{"a system namespace keeps its dots", bson.D{{"find", "system.buckets.locks"}, {"$db", "lockgate"}}, nil, namespace.New("lockgate", "system.buckets.locks")},
	} {
		var seqs []wire.Sequence
		if tc.seqs != nil {
			seqs = tc.seqs(t)
		}
		m := clMsg(t, tc.body, seqs...)
		cmd, err := wire.CommandOf(m)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p := NewPlan(m, cmd)
		found := false
		for _, r := range p.Refs() {
			found = found || r.NS == tc.want
		}
		if !found {
			t.Errorf("%s: the plan misses %s: %v", tc.name, tc.want, p.Refs())
		}
	}
}

// TestPlanOfLegacyOpcodes: a legacy opcode's namespace is its
// fullCollectionName, read leniently (at the first dot) as its server
// reads it.
func TestPlanOfLegacyOpcodes(t *testing.T) {
	for _, raw := range [][]byte{
		clFrame(wire.OpCodeGetMore, clI32(0), clCStr("lockgate.locks"), clI32(0), make([]byte, 8)),
	} {
		p := NewPlan(clParse(t, raw), nil)
		if refs := p.Refs(); len(refs) != 1 || refs[0].NS != namespace.New("lockgate", "locks") {
			t.Errorf("legacy refs %v", refs)
		}
	}
}
