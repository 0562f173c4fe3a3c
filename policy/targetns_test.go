package policy

import (
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
)

// TestTargetsKeepTheirParts: a write whose database and collection come
// from two fields ($out's and $merge's {db, coll}, mapReduce's out, a
// clone's toCollection) is on the namespace of those two parts, as the
// reference walk reads the same fields, not on "db.coll" read again at
// its first dot: a database named with a dot (which the server refuses,
// but lockgate does not rely on that) stays one database, and the plan
// holds one reference, named and written, not two that differ in where
// the database ends.
func TestTargetsKeepTheirParts(t *testing.T) {
	want := namespace.New("a.b", "c")
	for name, body := range map[string]D{
		"$out":                    {{"aggregate", "src"}, {"pipeline", A{D{{"$out", D{{"db", "a.b"}, {"coll", "c"}}}}}}, {"cursor", D{}}, {"$db", "shop"}},
		"$merge":                  {{"aggregate", "src"}, {"pipeline", A{D{{"$merge", D{{"into", D{{"db", "a.b"}, {"coll", "c"}}}}}}}}, {"cursor", D{}}, {"$db", "shop"}},
		"mapReduce":               {{"mapReduce", "src"}, {"map", "f"}, {"reduce", "g"}, {"out", D{{"replace", "c"}, {"db", "a.b"}}}, {"$db", "shop"}},
		"$out on a dotted $db":    {{"aggregate", "src"}, {"pipeline", A{D{{"$out", "c"}}}}, {"cursor", D{}}, {"$db", "a.b"}},
		"cloneCollectionAsCapped": {{"cloneCollectionAsCapped", "src"}, {"toCollection", "c"}, {"size", 1}, {"$db", "a.b"}},
	} {
		m := clParse(t, clMsgRaw(t, 0, body))
		cmd, err := wire.CommandOf(m)
		if err != nil {
			t.Fatal(err)
		}
		p := NewPlan(m, cmd)
		ws, err := p.Writes()
		if err != nil || len(ws) != 1 || ws[0].NS != want {
			t.Errorf("%s: writes %v, %v; want one on %#v", name, ws, err, want)
			continue
		}
		n := 0
		for _, r := range p.Refs() {
			if r.NS.String() == want.String() {
				n++
				if r.NS != want || r.Access != Named|Written {
					t.Errorf("%s: reference %#v %v, want %#v named and written", name, r.NS, r.Access, want)
				}
			}
		}
		if n != 1 {
			t.Errorf("%s: %d references read as %q, want 1: %v", name, n, want, p.Refs())
		}
	}
}
