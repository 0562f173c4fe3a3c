package policy

import (
	"reflect"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

func refsOf(t *testing.T, body bson.D, seqs ...wire.Sequence) []string {
	t.Helper()
	cmd, err := wire.CommandOf(clMsg(t, body, seqs...))
	if err != nil || cmd == nil {
		t.Fatalf("CommandOf: %v %v", cmd, err)
	}
	var got []string
	for _, r := range NewPlan(clMsg(t, body, seqs...), cmd).Refs() {
		if r.Access&Named != 0 {
			got = append(got, r.NS.DB()+"|"+r.NS.Collection())
		}
	}
	return got
}

// TestPlanReferences lists, for each form a client can name a namespace
// in, the references the plan must hold as named (in order). Every row is a way to
// reach the lock store's collections that the proxy must see.
func TestPlanReferences(t *testing.T) {
	lookupDBColl := bson.D{{"$lookup", bson.D{{"from", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}, {"as", "x"},
		{"pipeline", bson.A{bson.D{{"$unionWith", bson.D{{"coll", "locks_claims"}}}}}}}}}
	tests := []struct {
		name string
		body bson.D
		seqs []wire.Sequence
		want []string
	}{
		{"find", bson.D{{"find", "locks"}, {"$db", "lockgate"}}, nil, []string{"lockgate|locks"}},
		{"db-level", bson.D{{"dropDatabase", 1}, {"$db", "lockgate"}}, nil, []string{"lockgate|"}},
		{"full namespace first value", bson.D{{"dataSize", "lockgate.locks"}, {"$db", "admin"}}, nil,
			[]string{"admin|lockgate.locks", "lockgate|locks"}},
		{"rename to", bson.D{{"renameCollection", "shop.x"}, {"to", "lockgate.locks"}, {"$db", "admin"}}, nil,
			[]string{"admin|shop.x", "shop|x", "lockgate|locks"}},
		{"view on", bson.D{{"create", "v"}, {"viewOn", "locks"}, {"pipeline", bson.A{}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|v", "lockgate|locks"}},
		{"getMore collection", bson.D{{"getMore", int64(5)}, {"collection", "locks"}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|", "lockgate|locks"}},
		{"lookup from another db, nested unionWith", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{lookupDBColl}}, {"cursor", bson.D{}}, {"$db", "shop"}}, nil,
			[]string{"shop|orders", "lockgate|locks", "lockgate|locks_claims"}},
		{"graphLookup and facet", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{
			bson.D{{"$facet", bson.D{{"a", bson.A{bson.D{{"$graphLookup", bson.D{{"from", "locks"}}}}}}}}},
		}}, {"$db", "lockgate"}}, nil, []string{"lockgate|orders", "lockgate|locks"}},
		{"unionWith string", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$unionWith", "locks"}}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|orders", "lockgate|locks"}},
		{"out and merge", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{
			bson.D{{"$out", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}},
			bson.D{{"$merge", bson.D{{"into", bson.D{{"db", "lockgate"}, {"coll", "locks_claims"}}}}}},
			bson.D{{"$merge", "m"}},
		}}, {"$db", "shop"}}, nil, []string{"shop|orders", "lockgate|locks", "lockgate|locks_claims", "shop|m"}},
		{"mapReduce out", bson.D{{"mapReduce", "orders"}, {"out", bson.D{{"replace", "locks"}, {"db", "lockgate"}}}, {"$db", "shop"}}, nil,
			[]string{"shop|orders", "lockgate|locks"}},
		{"explain", bson.D{{"explain", bson.D{{"find", "locks"}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|", "lockgate|locks"}},
		{"applyOps by ns, by command, by uuid", bson.D{{"applyOps", bson.A{
			bson.D{{"op", "d"}, {"ns", "lockgate.locks"}, {"o", bson.D{{"_id", 1}}}},
			bson.D{{"op", "c"}, {"ns", "lockgate.$cmd"}, {"o", bson.D{{"drop", "locks_claims"}}}},
			bson.D{{"op", "d"}, {"ui", "uuid"}, {"o", bson.D{}}},
		}}, {"$db", "admin"}}, nil, []string{"admin|", "lockgate|locks", "lockgate|locks_claims", "*|*"}},
		{"copydb", bson.D{{"copydb", 1}, {"fromdb", "shop"}, {"todb", "lockgate"}, {"$db", "admin"}}, nil,
			[]string{"admin|", "shop|", "lockgate|"}},
		{"bulkWrite nsInfo in the body and in a sequence", bson.D{{"bulkWrite", 1}, {"ops", bson.A{}}, {"nsInfo", bson.A{bson.D{{"ns", "lockgate.locks"}}}}, {"$db", "admin"}},
			[]wire.Sequence{clSeq(t, "nsInfo", bson.D{{"ns", "lockgate.locks_claims"}})},
			[]string{"admin|", "lockgate|locks", "lockgate|locks_claims"}},
		{"change stream over the whole deployment", bson.D{{"aggregate", 1}, {"pipeline", bson.A{bson.D{{"$changeStream", bson.D{{"allChangesForCluster", true}}}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "*|*"}},
		{"change stream flag of another type", bson.D{{"aggregate", 1}, {"pipeline", bson.A{bson.D{{"$changeStream", bson.D{{"allChangesForCluster", "yes"}}}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "*|*"}},
		{"change stream on one database or collection", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$changeStream", bson.D{{"allChangesForCluster", false}}}}}}, {"$db", "shop"}}, nil,
			[]string{"shop|orders"}},
		{"applyOps preCondition", bson.D{{"applyOps", bson.A{}}, {"preCondition", bson.A{bson.D{{"ns", "lockgate.locks"}, {"q", bson.D{}}, {"res", bson.D{}}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "lockgate|locks"}},
		{"doTxn", bson.D{{"doTxn", bson.A{bson.D{{"op", "d"}, {"ns", "lockgate.locks"}, {"o", bson.D{}}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "lockgate|locks"}},
		{"eval", bson.D{{"eval", "db.getSiblingDB('lockgate').locks.findOne()"}, {"$db", "shop"}}, nil,
			[]string{"shop|db.getSiblingDB('lockgate').locks.findOne()", "db|getSiblingDB('lockgate').locks.findOne()", "*|*"}},
		// A field given twice: the server's stage parsers read the last,
		// Lookup the first.
		{"lookup with from twice", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$lookup", bson.D{{"from", "orders"}, {"from", "locks"}, {"as", "x"}}}}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|orders", "*|*"}},
		{"lookup with pipeline twice", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$lookup", bson.D{{"from", "orders"}, {"as", "x"},
			{"pipeline", bson.A{}}, {"pipeline", bson.A{bson.D{{"$unionWith", "locks"}}}}}}}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|orders", "*|*"}},
		{"unionWith with coll twice", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$unionWith", bson.D{{"coll", "orders"}, {"coll", "locks"}}}}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|orders", "*|*"}},
		{"merge into twice", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$merge", bson.D{{"into", "m"}, {"into", "locks"}}}}}}, {"$db", "lockgate"}}, nil,
			[]string{"lockgate|orders", "*|*"}},
		{"applyOps op with ns twice", bson.D{{"applyOps", bson.A{bson.D{{"op", "d"}, {"ns", "shop.x"}, {"ns", "lockgate.locks"}, {"o", bson.D{}}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "*|*"}},
		{"nsInfo with ns twice", bson.D{{"bulkWrite", 1}, {"ops", bson.A{}}, {"nsInfo", bson.A{bson.D{{"ns", "shop.x"}, {"ns", "lockgate.locks"}}}}, {"$db", "admin"}}, nil,
			[]string{"admin|", "*|*"}},
		{"mapReduce out db twice", bson.D{{"mapReduce", "orders"}, {"out", bson.D{{"replace", "locks"}, {"db", "shop"}, {"db", "lockgate"}}}, {"$db", "shop"}}, nil,
			[]string{"shop|orders", "*|*"}},
		{"pipeline in a document sequence", bson.D{{"aggregate", "orders"}, {"cursor", bson.D{}}, {"$db", "shop"}},
			[]wire.Sequence{clSeq(t, "pipeline", bson.D{{"$lookup", bson.D{{"from", bson.D{{"db", "lockgate"}, {"coll", "locks"}}}, {"as", "x"}}}})},
			[]string{"shop|orders", "lockgate|locks"}},
		{"data is not a namespace", bson.D{{"insert", "orders"}, {"documents", bson.A{bson.D{{"from", "locks"}, {"db", "lockgate"}}}}, {"$db", "shop"}},
			[]wire.Sequence{clSeq(t, "documents", bson.D{{"coll", "locks"}})}, []string{"shop|orders"}},
		{"match on a field called from", bson.D{{"aggregate", "orders"}, {"pipeline", bson.A{bson.D{{"$match", bson.D{{"from", "locks"}}}}}}, {"$db", "shop"}}, nil,
			[]string{"shop|orders"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := refsOf(t, tt.body, tt.seqs...); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("references = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSessionIntrospectionSwitch(t *testing.T) {
	for _, tt := range []struct {
		name  string
		c     config.Policy
		allow bool
	}{
		{"nothing enforced", config.Policy{Default: config.ModeAudit}, true},
		{"a namespace enforced", config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}}, false},
		{"default enforce", config.Policy{Default: config.ModeEnforce}, false},
		{"enforced, operator allows", config.Policy{Default: config.ModeEnforce, AllowSessionIntrospection: true}, true},
	} {
		p, err := Compile(tt.c)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.SessionIntrospection(); got != tt.allow {
			t.Errorf("%s: SessionIntrospection() = %v, want %v", tt.name, got, tt.allow)
		}
	}
}
