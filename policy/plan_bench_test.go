package policy

import (
	"testing"

	"github.com/lockgate/lockgate/wire"
)

// The plan of the requests the proxy sees most: a pinned update (the
// enforced write), a read, a batch insert and an aggregation that looks
// up and writes elsewhere, each by NewPlan's one walk and by the two walks
// it replaced (twoPassPlan, the fuzz oracle), and read again into a
// connection's plan (read), side by side in one run.
// Run: go test ./policy -run XXX -bench Plan -benchmem
func BenchmarkPlan(b *testing.B) {
	lookup := D{{"$lookup", D{{"from", "customers"}, {"localField", "c"}, {"foreignField", "_id"}, {"as", "cust"},
		{"pipeline", A{D{{"$match", D{{"x", 1}}}}}}}}}
	cases := []struct {
		name string
		raw  []byte
	}{
		{"update", clMsgRaw(b, 0, D{{"update", "orders"}, {"ordered", true}, {"lsid", lsid}, {"$db", "shop"}},
			clSeq(b, "updates", D{{"q", D{{"_id", 42}}}, {"u", setA}}))},
		{"find", clMsgRaw(b, 0, D{{"find", "orders"}, {"filter", D{{"_id", 42}}}, {"lsid", lsid}, {"$db", "shop"}})},
		{"insert10", clMsgRaw(b, 0, D{{"insert", "orders"}, {"ordered", true}, {"lsid", lsid}, {"$db", "shop"}},
			clSeq(b, "documents", D{{"_id", 1}}, D{{"_id", 2}}, D{{"_id", 3}}, D{{"_id", 4}}, D{{"_id", 5}},
				D{{"_id", 6}}, D{{"_id", 7}}, D{{"_id", 8}}, D{{"_id", 9}}, D{{"_id", 10}}))},
		{"aggregate", clMsgRaw(b, 0, D{{"aggregate", "orders"}, {"pipeline", A{D{{"$match", D{{"a", 1}}}}, lookup,
			D{{"$group", D{{"_id", "$c"}, {"n", D{{"$sum", 1}}}}}}, D{{"$merge", D{{"into", "totals"}}}}}}, {"cursor", D{}}, {"$db", "shop"}})},
	}
	for _, tc := range cases {
		m := clParse(b, tc.raw)
		cmd, err := wire.CommandOf(m)
		if err != nil {
			b.Fatal(err)
		}
		// A connection's plan, read again for each request (Plan.Read).
		var kept Plan
		read := func(m wire.Message, cmd *wire.Command) *Plan {
			kept.Read(m, cmd)
			return &kept
		}
		for _, way := range []struct {
			name string
			plan func(wire.Message, *wire.Command) *Plan
		}{{"onepass", NewPlan}, {"twopass", twoPassPlan}, {"read", read}} {
			b.Run(tc.name+"/"+way.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := way.plan(m, cmd).Writes(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
