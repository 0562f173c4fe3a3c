package policy

import (
	"math/rand"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// editCase is a generated command with the edits the engine could ask for:
// the input of the editor's property tests.
type editCase struct {
	raw  []byte
	edit Edit
}

// genEditCase builds, from r, one write command (update, delete, insert,
// findAndModify or bulkWrite; statements in the body or in a kind-1
// section; as OP_MSG, OP_QUERY with or without its $query wrapper, or
// compressed) with or without its own maxTimeMS, and edits that name its
// statements: pins, fences, a cap, any of them or none. bulk says whether
// bulkWrite may be generated with fences.
func genEditCase(t testing.TB, r *rand.Rand, fenceBulk bool) editCase {
	t.Helper()
	id := func() any {
		switch r.Intn(3) {
		case 0:
			return int32(r.Intn(5))
		case 1:
			return string(rune('a' + r.Intn(5)))
		}
		return int64(r.Intn(5))
	}
	filter := func() bson.D {
		switch r.Intn(4) {
		case 0:
			return bson.D{}
		case 1:
			return bson.D{{Key: "_id", Value: id()}}
		case 2:
			return bson.D{{Key: "x", Value: r.Intn(3)}, {Key: "$and", Value: bson.A{bson.D{{Key: "y", Value: 1}}}}}
		}
		return bson.D{{Key: "x", Value: bson.D{{Key: "$gt", Value: r.Intn(3)}}}}
	}
	update := func() any {
		switch r.Intn(4) {
		case 0:
			return bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}
		case 1:
			return bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$set", Value: bson.D{{Key: "_f", Value: 3}}}}
		case 2:
			return bson.D{{Key: "a", Value: 2}}
		}
		return bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: 1}}}}}
	}
	ids := func() []bsoncore.Value {
		n := r.Intn(3)
		out := make([]bsoncore.Value, 0, n)
		for range n {
			typ, data, _ := bson.MarshalValue(id())
			out = append(out, bsoncore.Value{Type: typ, Data: data})
		}
		return out
	}
	tokens := func(n int) []int64 {
		out := make([]int64, n)
		shared := int64(r.Intn(3) + 1)
		for i := range out {
			out[i] = shared
			if r.Intn(4) == 0 {
				out[i] = int64(r.Intn(3) + 1)
			}
		}
		return out
	}

	var body bson.D
	var list string
	var stmts []bson.D
	kinds := []string{"update", "delete", "insert", "findAndModify", "bulkWrite"}
	kind := kinds[r.Intn(len(kinds))]
	n := r.Intn(3) + 1
	switch kind {
	case "update":
		list = "updates"
		for range n {
			s := bson.D{{Key: "q", Value: filter()}, {Key: "u", Value: update()}}
			if r.Intn(2) == 0 {
				s = append(s, bson.E{Key: "upsert", Value: r.Intn(2) == 0})
			}
			stmts = append(stmts, s)
		}
		body = bson.D{{Key: "update", Value: "c"}}
	case "delete":
		list = "deletes"
		for range n {
			stmts = append(stmts, bson.D{{Key: "q", Value: filter()}, {Key: "limit", Value: r.Intn(2)}})
		}
		body = bson.D{{Key: "delete", Value: "c"}}
	case "insert":
		list = "documents"
		for range n {
			d := bson.D{{Key: "_id", Value: id()}, {Key: "a", Value: 1}}
			if r.Intn(3) == 0 {
				d = append(d, bson.E{Key: "_f", Value: 9})
			}
			stmts = append(stmts, d)
		}
		body = bson.D{{Key: "insert", Value: "c"}}
	case "findAndModify":
		n = 1
		body = bson.D{{Key: "findAndModify", Value: "c"}}
		if r.Intn(3) > 0 {
			body = append(body, bson.E{Key: "query", Value: filter()})
		}
		if r.Intn(2) == 0 {
			body = append(body, bson.E{Key: "update", Value: update()})
		} else {
			body = append(body, bson.E{Key: "remove", Value: true})
		}
	case "bulkWrite":
		list = "ops"
		for range n {
			switch r.Intn(3) {
			case 0:
				stmts = append(stmts, bson.D{{Key: "insert", Value: 0}, {Key: "document", Value: bson.D{{Key: "_id", Value: id()}}}})
			case 1:
				stmts = append(stmts, bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: filter()}, {Key: "updateMods", Value: update()}})
			default:
				stmts = append(stmts, bson.D{{Key: "delete", Value: 0}, {Key: "filter", Value: filter()}, {Key: "multi", Value: false}})
			}
		}
		body = bson.D{{Key: "bulkWrite", Value: 1}, {Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "db.c"}}}}}
	}
	seq := list != "" && r.Intn(2) == 0
	if list != "" && !seq {
		a := bson.A{}
		for _, s := range stmts {
			a = append(a, s)
		}
		body = append(body, bson.E{Key: list, Value: a})
	}
	if r.Intn(2) == 0 {
		body = append(body, bson.E{Key: "ordered", Value: true})
	}
	switch r.Intn(4) {
	case 0:
		body = append(body, bson.E{Key: "maxTimeMS", Value: int64(r.Intn(2000))})
	case 1:
		body = append(body, bson.E{Key: "maxTimeMS", Value: int32(r.Intn(2000))})
	}
	db := "db"
	if kind == "bulkWrite" {
		db = "admin"
	}

	var raw []byte
	switch opcode := r.Intn(4); {
	case opcode == 0 && !seq:
		q := append(body[:len(body):len(body)], bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: 1}}})
		raw = clQueryRaw(t, db+".$cmd", q)
	case opcode == 1 && !seq:
		raw = clQueryRaw(t, db+".$cmd", bson.D{{Key: "$query", Value: body}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}}})
	default:
		var seqs []wire.Sequence
		if seq {
			seqs = append(seqs, clSeq(t, list, stmts...))
		}
		raw = clMsgRaw(t, 0, append(body, bson.E{Key: "$db", Value: db}), seqs...)
		if opcode == 2 {
			raw = clCompressed(t, raw, wire.CompressorZlib)
		}
	}

	var e Edit
	for i := range n {
		pinnable := kind == "update" || kind == "delete" || kind == "findAndModify" ||
			(kind == "bulkWrite" && stmts[i][0].Key != "insert")
		if pinnable && r.Intn(2) == 0 {
			e.Pins = append(e.Pins, Pin{List: list, Index: i, IDs: ids()})
		}
		if (kind != "bulkWrite" || fenceBulk) && r.Intn(3) == 0 {
			f := Fence{List: list, Index: i, Field: "_f", IDs: ids()}
			if kind == "insert" && r.Intn(2) == 0 {
				f.IDs = nil
			}
			f.Tokens = tokens(len(f.IDs))
			e.Fences = append(e.Fences, f)
		}
	}
	if r.Intn(3) > 0 {
		e.MaxTimeMS = int64(r.Intn(1500) + 1)
	}
	return editCase{raw: raw, edit: e}
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }
