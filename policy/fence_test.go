package policy

import (
	"errors"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func fenceMsg(t *testing.T, body bson.D, seq string, docs ...bson.D) (wire.Message, *wire.Command) {
	t.Helper()
	b, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []wire.Sequence
	if seq != "" {
		s := wire.Sequence{Identifier: seq}
		for _, d := range docs {
			db, _ := bson.Marshal(d)
			s.Documents = append(s.Documents, db)
		}
		seqs = append(seqs, s)
	}
	m, err := wire.Parse(wire.AppendMsg(nil, 7, 0, 0, b, seqs...), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return m, cmd
}

func fenceOf(list string, i int, ids []any, tokens ...int64) Fence {
	f := Fence{List: list, Index: i, Field: "_f", Tokens: tokens}
	for _, id := range ids {
		t, v, _ := bson.MarshalValue(id)
		f.IDs = append(f.IDs, bsoncore.Value{Type: t, Data: v})
	}
	return f
}

// statementsOf re-parses a rewritten message and returns its statements
// as extended JSON-ish bson.Raw strings.
func statementsOf(t *testing.T, b []byte, list string) []bson.Raw {
	t.Helper()
	m, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if list == "" {
		return []bson.Raw{bson.Raw(cmd.Body)}
	}
	docs, err := cmd.Documents(list)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]bson.Raw, len(docs))
	for i, d := range docs {
		out[i] = bson.Raw(d)
	}
	return out
}

func wantJSON(t *testing.T, what string, got bson.Raw, want bson.D) {
	t.Helper()
	w, _ := bson.Marshal(want)
	if got.String() != bson.Raw(w).String() {
		t.Errorf("%s:\n got %s\nwant %s", what, got, bson.Raw(w))
	}
}

func TestFenceStatements(t *testing.T) {
	in := func(tok int64) bson.D {
		return bson.D{{Key: "$in", Value: bson.A{tok, nil}}, {Key: "$not", Value: bson.D{{Key: "$type", Value: "array"}}}}
	}
	// An update in a document sequence: operators get $set of the token,
	// the client's own $set of the field is dropped.
	msg, cmd := fenceMsg(t, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "d"}}, "updates",
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}, {Key: "_f", Value: 9}}}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 2}}}, {Key: "u", Value: bson.D{{Key: "b", Value: 1}, {Key: "_f", Value: 9}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 3}}}, {Key: "u", Value: bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: "c", Value: 1}}}}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}, {Key: "multi", Value: true}},
	)
	b, err := clFence(msg, cmd, []Pin{{List: "updates", Index: 3, IDs: fenceOf("", 0, []any{4, 5}).IDs}}, []Fence{
		fenceOf("updates", 0, []any{1}, 11),
		fenceOf("updates", 1, []any{2}, 12),
		fenceOf("updates", 2, []any{3}, 13),
		fenceOf("updates", 3, []any{4, 5}, 14, 15),
	})
	if err != nil {
		t.Fatal(err)
	}
	st := statementsOf(t, b, "updates")
	wantJSON(t, "operators", st[0], bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 1}, {Key: "$and", Value: bson.A{bson.D{{Key: "_f", Value: in(11)}}}}}},
		{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}, {Key: "_f", Value: int64(11)}}}}}})
	wantJSON(t, "replacement", st[1], bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 2}, {Key: "$and", Value: bson.A{bson.D{{Key: "_f", Value: in(12)}}}}}},
		{Key: "u", Value: bson.D{{Key: "b", Value: 1}, {Key: "_f", Value: int64(12)}}}})
	wantJSON(t, "pipeline", st[2], bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 3}, {Key: "$and", Value: bson.A{bson.D{{Key: "_f", Value: in(13)}}}}}},
		{Key: "u", Value: bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: "c", Value: 1}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "_f", Value: bson.D{{Key: "$literal", Value: int64(13)}}}}}}}}})
	// Two documents under different tokens: each is fenced by its own,
	// and no single token is written.
	wantJSON(t, "multi, two tokens", st[3], bson.D{
		{Key: "q", Value: bson.D{{Key: "x", Value: 1}, {Key: "$and", Value: bson.A{
			bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "_id", Value: 4}, {Key: "_f", Value: in(14)}},
				bson.D{{Key: "_id", Value: 5}, {Key: "_f", Value: in(15)}}}}},
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{4, 5}}}}},
		}}}},
		{Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}, {Key: "multi", Value: true}})

	// The field is the proxy's: other operators on it are refused.
	for _, u := range []bson.D{
		{{Key: "$inc", Value: bson.D{{Key: "_f", Value: 1}}}},
		{{Key: "$unset", Value: bson.D{{Key: "_f", Value: ""}}}},
		{{Key: "$set", Value: bson.D{{Key: "_f.x", Value: 1}}}},
		{{Key: "$rename", Value: bson.D{{Key: "a", Value: "_f"}}}},
	} {
		msg, cmd := fenceMsg(t, bson.D{{Key: "update", Value: "c"}, {Key: "updates", Value: bson.A{
			bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "u", Value: u}}}}, {Key: "$db", Value: "d"}}, "")
		if _, err := clFence(msg, cmd, nil, []Fence{fenceOf("updates", 0, []any{1}, 11)}); !errors.Is(err, ErrFenceField) {
			t.Errorf("%v: err = %v, want ErrFenceField", u, err)
		}
	}

	// findAndModify without a query gains one; delete gains the clause.
	msg, cmd = fenceMsg(t, bson.D{{Key: "findAndModify", Value: "c"}, {Key: "remove", Value: true}, {Key: "$db", Value: "d"}}, "")
	b, err = clFence(msg, cmd, []Pin{{List: "", IDs: fenceOf("", 0, []any{1}).IDs}}, []Fence{fenceOf("", 0, []any{1}, 11)})
	if err != nil {
		t.Fatal(err)
	}
	got := statementsOf(t, b, "")[0]
	wantJSON(t, "findAndModify remove", got, bson.D{{Key: "findAndModify", Value: "c"}, {Key: "remove", Value: true}, {Key: "$db", Value: "d"},
		{Key: "query", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{1}}}}, {Key: "$and", Value: bson.A{bson.D{{Key: "_f", Value: in(11)}}}}}}})
	// Inserts: the field is set to the token, or dropped without one.
	msg, cmd = fenceMsg(t, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{
		bson.D{{Key: "_id", Value: 1}, {Key: "_f", Value: 99}, {Key: "a", Value: 1}},
		bson.D{{Key: "_id", Value: 2}, {Key: "_f", Value: 99}}}}, {Key: "$db", Value: "d"}}, "")
	b, err = clFence(msg, cmd, nil, []Fence{fenceOf("documents", 0, []any{1}, 11), fenceOf("documents", 1, nil)})
	if err != nil {
		t.Fatal(err)
	}
	st = statementsOf(t, b, "documents")
	wantJSON(t, "insert with a token", st[0], bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: 1}, {Key: "_f", Value: int64(11)}})
	wantJSON(t, "insert without", st[1], bson.D{{Key: "_id", Value: 2}})
}

// TestFenceBulkWrite: bulkWrite's ops are fenced by the keys the command
// table gives each op kind (filter, updateMods, document), as the update,
// delete and insert commands are. The guard still refuses bulkWrite on a
// fenced namespace (its reply hook cannot yet read bulkWrite's per-op
// cursor), so this is the editor's half.
func TestFenceBulkWrite(t *testing.T) {
	in := func(tok int64) bson.D {
		return bson.D{{Key: "$in", Value: bson.A{tok, nil}}, {Key: "$not", Value: bson.D{{Key: "$type", Value: "array"}}}}
	}
	msg, cmd := fenceMsg(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "d.c"}}}}, {Key: "$db", Value: "admin"}}, "ops",
		bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "updateMods", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}}},
		bson.D{{Key: "delete", Value: 0}, {Key: "filter", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "multi", Value: false}},
		bson.D{{Key: "insert", Value: 0}, {Key: "document", Value: bson.D{{Key: "_id", Value: 3}, {Key: "_f", Value: 99}}}},
		bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: bson.D{{Key: "_id", Value: 4}}}, {Key: "updateMods", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: 1}}}}}},
	)
	b, err := clFence(msg, cmd, []Pin{{List: "ops", Index: 1, IDs: fenceOf("", 0, []any{2}).IDs}}, []Fence{
		fenceOf("ops", 0, []any{1}, 11),
		fenceOf("ops", 1, []any{2}, 12),
		fenceOf("ops", 2, []any{3}, 13),
	})
	if err != nil {
		t.Fatal(err)
	}
	st := statementsOf(t, b, "ops")
	wantJSON(t, "update op", st[0], bson.D{{Key: "update", Value: 0},
		{Key: "filter", Value: bson.D{{Key: "_id", Value: 1}, {Key: "$and", Value: bson.A{bson.D{{Key: "_f", Value: in(11)}}}}}},
		{Key: "updateMods", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}, {Key: "_f", Value: int64(11)}}}}}})
	wantJSON(t, "pinned delete op", st[1], bson.D{{Key: "delete", Value: 0},
		{Key: "filter", Value: bson.D{{Key: "x", Value: 1}, {Key: "$and", Value: bson.A{
			bson.D{{Key: "_f", Value: in(12)}},
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{2}}}}}}}}},
		{Key: "multi", Value: false}})
	wantJSON(t, "insert op", st[2], bson.D{{Key: "insert", Value: 0}, {Key: "document", Value: bson.D{{Key: "_id", Value: 3}, {Key: "_f", Value: int64(13)}}}})
	wantJSON(t, "op not named", st[3], bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: bson.D{{Key: "_id", Value: 4}}}, {Key: "updateMods", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: 1}}}}}})

	// The fence field is the proxy's in bulkWrite too.
	msg, cmd = fenceMsg(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "d.c"}}}}, {Key: "$db", Value: "admin"}}, "ops",
		bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "updateMods", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "_f", Value: 1}}}}}})
	if _, err := clFence(msg, cmd, nil, []Fence{fenceOf("ops", 0, []any{1}, 11)}); !errors.Is(err, ErrFenceField) {
		t.Errorf("$inc of the fence field in a bulkWrite op: err = %v, want ErrFenceField", err)
	}
}
