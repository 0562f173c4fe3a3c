package policy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// clWithout returns d without its key elements.
func clWithout(t testing.TB, d bsoncore.Document, key string) []byte {
	t.Helper()
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, err := d.Elements()
	if err != nil {
		t.Fatalf("elements: %v", err)
	}
	for _, e := range elems {
		if e.Key() != key {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// clStatements returns the statement documents of list in cmd.
func clStatements(t testing.TB, cmd *wire.Command, list string) []bsoncore.Document {
	t.Helper()
	if list == "" {
		return []bsoncore.Document{cmd.Body}
	}
	docs, err := cmd.Documents(list)
	if err != nil {
		t.Fatalf("Documents(%q): %v", list, err)
	}
	return docs
}

type pinCase struct {
	name    string
	raw     func(t testing.TB) []byte
	list    string
	pins    map[int]A // statement index -> ids
	filters map[int]D // expected rewritten filters
	errText string    // non-empty: PinStatements fails
}

func TestPinStatements(t *testing.T) {
	in := func(ids ...any) D { return D{{"_id", D{{"$in", append(A{}, ids...)}}}} }
	// The filter's own fields stay top-level; the pin joins a new $and.
	and := func(pin, orig D) D { return append(append(D{}, orig...), E{Key: "$and", Value: A{pin}}) }
	upds := []D{
		{{"q", byID1}, {"u", setA}, {"upsert", true}},
		{{"q", D{{"x", 1}}}, {"u", D{{"x", 2}}}, {"multi", true}, {"collation", D{{"locale", "fr"}}}},
		{{"q", D{}}, {"u", A{D{{"$set", D{{"a", 1}}}}}}, {"multi", true}},
	}
	dels := []D{{{"q", D{{"x", 1}}}, {"limit", 0}}, {{"q", D{}}, {"limit", 0}, {"hint", "h"}}}
	ops := []D{
		{{"insert", 0}, {"document", byID1}},
		{{"update", 0}, {"filter", D{{"x", 1}}}, {"updateMods", setA}, {"multi", true}},
		{{"delete", 1}, {"filter", D{}}, {"multi", true}},
	}
	info := []D{{{"ns", "db.c"}}, {{"ns", "db.d"}}}
	updBody := D{{"update", "c"}, {"updates", A{upds[0], upds[1], upds[2]}}, {"ordered", false}, {"lsid", lsid}, {"$db", "db"}}
	cases := []pinCase{
		{name: "update body", raw: clBody(updBody), list: "updates",
			pins: map[int]A{1: {3, 4}, 2: {"k"}}, filters: map[int]D{1: and(in(3, 4), D{{"x", 1}}), 2: in("k")}},
		{name: "update sequence", raw: clBody(D{{"update", "c"}, {"$db", "db"}}, clSeqOf("updates", upds...)), list: "updates",
			pins: map[int]A{0: {1}}, filters: map[int]D{0: and(in(1), byID1)}},
		{name: "update sequence before body, checksum", raw: func(t testing.TB) []byte {
			seq := clSeq(t, "updates", upds...)
			sec := []byte{1}
			payload := clCStr(seq.Identifier)
			for _, d := range seq.Documents {
				payload = append(payload, d...)
			}
			sec = append(append(sec, clI32(int32(4+len(payload)))...), payload...)
			raw := clFrame(wire.OpCodeMsg, clI32(0), sec, append([]byte{0}, clDoc(t, D{{"update", "c"}, {"$db", "db"}})...))
			// Re-encode through wire to add a checksum while keeping the order.
			m := clParse(t, raw).(*wire.OpMsg)
			cp := *m
			cp.Flags |= wire.ChecksumPresent
			out, err := wire.WithBody(&cp, m.Body)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}, list: "updates", pins: map[int]A{2: {5}}, filters: map[int]D{2: in(5)}},
		{name: "delete body moreToCome", raw: func(t testing.TB) []byte {
			return clMsgRaw(t, wire.MoreToCome, D{{"delete", "c"}, {"deletes", A{dels[0], dels[1]}}, {"writeConcern", D{{"w", 0}}}, {"$db", "db"}})
		}, list: "deletes", pins: map[int]A{0: {1, 2}, 1: {}}, filters: map[int]D{0: and(in(1, 2), D{{"x", 1}}), 1: in()}},
		{name: "findAndModify", raw: clBody(D{{"findAndModify", "c"}, {"query", D{{"x", 1}}}, {"update", setA}, {"new", true}, {"$db", "db"}}),
			list: "", pins: map[int]A{0: {7}}, filters: map[int]D{0: and(in(7), D{{"x", 1}})}},
		{name: "findandmodify without query", raw: clBody(D{{"findandmodify", "c"}, {"remove", true}, {"sort", D{{"a", 1}}}, {"$db", "db"}}),
			list: "", pins: map[int]A{0: {7, 8}}, filters: map[int]D{0: in(7, 8)}},
		{name: "bulkWrite sequences", raw: clBody(D{{"bulkWrite", 1}, {"ordered", true}, {"$db", "admin"}}, clSeqOf("ops", ops...), clSeqOf("nsInfo", info...)),
			list: "ops", pins: map[int]A{1: {"a"}, 2: {"b", "c"}}, filters: map[int]D{1: and(in("a"), D{{"x", 1}}), 2: in("b", "c")}},
		{name: "bulkWrite body", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{ops[0], ops[1], ops[2]}}, {"nsInfo", A{info[0], info[1]}}, {"$db", "admin"}}),
			list: "ops", pins: map[int]A{2: {1}}, filters: map[int]D{2: in(1)}},
		{name: "OP_QUERY", raw: func(t testing.TB) []byte {
			return clQueryRaw(t, "db.$cmd", D{{"update", "c"}, {"updates", A{upds[0], upds[1]}}})
		},
			list: "updates", pins: map[int]A{1: {2}}, filters: map[int]D{1: and(in(2), D{{"x", 1}})}},
		{name: "OP_QUERY wrapped", raw: func(t testing.TB) []byte {
			return clQueryRaw(t, "db.$cmd", D{{"$query", D{{"delete", "c"}, {"deletes", A{dels[0]}}}}, {"$readPreference", D{{"mode", "primary"}}}})
		}, list: "deletes", pins: map[int]A{0: {2}}, filters: map[int]D{0: and(in(2), D{{"x", 1}})}},
		{name: "OP_COMPRESSED OP_MSG", raw: func(t testing.TB) []byte {
			return clCompressed(t, clMsgRaw(t, 0, D{{"update", "c"}, {"$db", "db"}}, clSeq(t, "updates", upds...)), wire.CompressorZstd)
		}, list: "updates", pins: map[int]A{0: {1}}, filters: map[int]D{0: and(in(1), byID1)}},
		{name: "OP_COMPRESSED OP_QUERY", raw: func(t testing.TB) []byte {
			return clCompressed(t, clQueryRaw(t, "db.$cmd", D{{"findAndModify", "c"}, {"query", byID1}, {"remove", true}}), wire.CompressorSnappy)
		}, list: "", pins: map[int]A{0: {1}}, filters: map[int]D{0: and(in(1), byID1)}},
		{name: "no pins", raw: clBody(updBody), list: "updates", pins: map[int]A{}, filters: map[int]D{}},

		{name: "legacy OP_UPDATE", raw: func(t testing.TB) []byte { return clUpdateRaw(t, "db.c", 0, byID1, setA) }, list: "legacy", pins: map[int]A{0: {1}}, errText: "cannot be pinned"},
		{name: "legacy OP_DELETE", raw: func(t testing.TB) []byte { return clDeleteRaw(t, "db.c", 0, byID1) }, list: "legacy", pins: map[int]A{0: {1}}, errText: "cannot be pinned"},
		{name: "index out of range", raw: clBody(updBody), list: "updates", pins: map[int]A{3: {1}}, errText: "no statement"},
		{name: "wrong list", raw: clBody(updBody), list: "deletes", pins: map[int]A{0: {1}}, errText: "no statement list"},
		{name: "bulkWrite insert op", raw: clBody(D{{"bulkWrite", 1}, {"$db", "admin"}}, clSeqOf("ops", ops...), clSeqOf("nsInfo", info...)), list: "ops", pins: map[int]A{0: {1}}, errText: "no filter"},
		{name: "insert", raw: clBody(D{{"insert", "c"}, {"documents", A{byID1}}, {"$db", "db"}}), list: "documents", pins: map[int]A{0: {1}}, errText: "no statements"},
		{name: "findAndModify index 1", raw: clBody(D{{"findAndModify", "c"}, {"remove", true}, {"$db", "db"}}), list: "", pins: map[int]A{1: {1}}, errText: "no statement"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw(t)
			m := clParse(t, raw)
			cmd, err := wire.CommandOf(m)
			if err != nil {
				t.Fatal(err)
			}
			var pins []Pin
			for i, ids := range tc.pins {
				pins = append(pins, Pin{List: tc.list, Index: i, IDs: clValues(t, ids)})
			}
			out, err := clPin(m, cmd, pins)
			if tc.errText != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err %v, want one containing %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("PinStatements: %v", err)
			}
			if len(pins) == 0 {
				if out != nil {
					t.Fatalf("nothing to pin, yet the message was re-encoded")
				}
				out = raw // forwarded as it came
			}
			clCheckPinned(t, m, cmd, out, tc)
		})
	}
}

// clCheckPinned re-parses out and checks it against the original message:
// the pinned filters are the expected ones and everything else is the same.
func clCheckPinned(t *testing.T, orig wire.Message, origCmd *wire.Command, out []byte, tc pinCase) {
	t.Helper()
	got := clParse(t, out)
	gotCmd, err := wire.CommandOf(got)
	if err != nil {
		t.Fatalf("CommandOf(result): %v", err)
	}
	inner := orig
	if c, ok := orig.(*wire.OpCompressed); ok {
		inner = c.Inner
	}
	if got.Header().OpCode != inner.Header().OpCode || got.Header().RequestID != orig.Header().RequestID ||
		got.Header().ResponseTo != orig.Header().ResponseTo {
		t.Fatalf("header %+v, want the ids and opcode of %+v", got.Header(), inner.Header())
	}
	switch o := inner.(type) {
	case *wire.OpMsg:
		g := got.(*wire.OpMsg)
		if g.Flags != o.Flags {
			t.Fatalf("flags %v, want %v", g.Flags, o.Flags)
		}
		if len(g.Sequences) != len(o.Sequences) {
			t.Fatalf("%d sequences, want %d", len(g.Sequences), len(o.Sequences))
		}
		for i := range o.Sequences {
			if g.Sequences[i].Identifier != o.Sequences[i].Identifier || len(g.Sequences[i].Documents) != len(o.Sequences[i].Documents) {
				t.Fatalf("sequence %d is %q with %d documents, want %q with %d", i, g.Sequences[i].Identifier,
					len(g.Sequences[i].Documents), o.Sequences[i].Identifier, len(o.Sequences[i].Documents))
			}
		}
		// The body keeps its place among the sections: compare the first
		// section kind byte.
		if out[wire.HeaderSize+4] != inner.Raw()[wire.HeaderSize+4] {
			t.Fatal("section order changed")
		}
	case *wire.OpQuery:
		g := got.(*wire.OpQuery)
		if g.FullCollectionName != o.FullCollectionName || g.Flags != o.Flags || g.NumberToReturn != o.NumberToReturn {
			t.Fatalf("OP_QUERY fields changed: %+v", g)
		}
		if _, err := o.Query.LookupErr("$readPreference"); err == nil {
			rp := o.Query.Lookup("$readPreference")
			if !rp.Equal(g.Query.Lookup("$readPreference")) {
				t.Fatal("$readPreference lost")
			}
		}
	}
	if gotCmd.Name != origCmd.Name || gotCmd.DB != origCmd.DB {
		t.Fatalf("command %s on %s, want %s on %s", gotCmd.Name, gotCmd.DB, origCmd.Name, origCmd.DB)
	}
	// The body without the statement list is unchanged.
	list, key := tc.list, ""
	switch origCmd.Name {
	case "update", "delete":
		key = "q"
	case "bulkWrite":
		key = "filter"
	default:
		key = "query"
	}
	bodyKey := list
	if list == "" {
		bodyKey = "query"
	}
	if !bytes.Equal(clWithout(t, gotCmd.Body, bodyKey), clWithout(t, origCmd.Body, bodyKey)) {
		t.Fatalf("body changed:\n got  %v\n want %v", gotCmd.Body, origCmd.Body)
	}
	before := clStatements(t, origCmd, list)
	after := clStatements(t, gotCmd, list)
	if len(before) != len(after) {
		t.Fatalf("%d statements, want %d", len(after), len(before))
	}
	for i := range before {
		want, pinned := tc.filters[i]
		if !pinned {
			if !bytes.Equal(before[i], after[i]) {
				t.Fatalf("statement %d changed: %v -> %v", i, before[i], after[i])
			}
			continue
		}
		if !bytes.Equal(clWithout(t, after[i], key), clWithout(t, before[i], key)) {
			t.Fatalf("statement %d changed beside its filter: %v -> %v", i, before[i], after[i])
		}
		f, err := after[i].LookupErr(key)
		if err != nil {
			t.Fatalf("statement %d lost its filter %q", i, key)
		}
		if w := clDoc(t, want); !bytes.Equal(f.Document(), w) {
			t.Fatalf("statement %d filter %v, want %v", i, f.Document(), bsoncore.Document(w))
		}
	}
	// The result classifies like the original, filters aside.
	w0, err0 := Classify(orig, origCmd)
	w1, err1 := Classify(got, gotCmd)
	if err0 != nil || err1 != nil || len(w0) != len(w1) {
		t.Fatalf("classification changed: %v %v / %d %d", err0, err1, len(w0), len(w1))
	}
	for i := range w0 {
		a, b := w0[i], w1[i]
		a.Filter, b.Filter = nil, nil
		if !clSameWrite(a, b) {
			t.Fatalf("write %d changed: %s -> %s", i, clDescribe(w0[i]), clDescribe(w1[i]))
		}
	}
}

func TestPinStatementsDuplicatePin(t *testing.T) {
	m := clMsg(t, D{{"delete", "c"}, {"deletes", A{D{{"q", D{}}, {"limit", 0}}}}, {"$db", "db"}})
	_, err := clPin(m, nil, []Pin{{List: "deletes", IDs: clValues(t, A{1})}, {List: "deletes", IDs: clValues(t, A{2})}})
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("err %v, want pinned twice", err)
	}
}

func TestPinStatementsRefusesWideningIDs(t *testing.T) {
	m := clMsg(t, D{{"delete", "c"}, {"deletes", A{D{{"q", D{}}, {"limit", 0}}}}, {"$db", "db"}})
	for _, id := range []any{primitiveRegex, A{1}} {
		_, err := clPin(m, nil, []Pin{{List: "deletes", IDs: clValues(t, A{1, id})}})
		if err == nil || !strings.Contains(err.Error(), "cannot be a pinned _id") {
			t.Fatalf("id %v: err %v, want a refusal", id, err)
		}
	}
	_, err := clPin(m, nil, []Pin{{List: "deletes", IDs: []bsoncore.Value{{}}}})
	if err == nil {
		t.Fatal("a zero Value was pinned")
	}
}

func TestPinStatementsDuplicateFindAndModify(t *testing.T) {
	m := clMsg(t, D{{"findAndModify", "c"}, {"remove", true}, {"$db", "db"}})
	_, err := clPin(m, nil, []Pin{{IDs: clValues(t, A{1})}, {IDs: clValues(t, A{2})}})
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("err %v, want pinned twice", err)
	}
}

var primitiveRegex = primitive.Regex{Pattern: "x"}

func TestPinnedFilterKeepsTopLevelFields(t *testing.T) {
	ids := []bsoncore.Value{bsoncore.Value{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 7)}}
	cases := []struct {
		name string
		orig D
		want D
	}{
		{"fields stay, pin in a new $and", D{{"sku", "zz"}, {"a.b", 5}},
			D{{"sku", "zz"}, {"a.b", 5}, {"$and", A{D{{"_id", D{{"$in", A{int32(7)}}}}}}}}},
		{"pin joins an existing $and, first", D{{"x", 1}, {"$and", A{D{{"y", 2}}, D{{"z", 3}}}}, {"w", 4}},
			D{{"x", 1}, {"$and", A{D{{"_id", D{{"$in", A{int32(7)}}}}}, D{{"y", 2}}, D{{"z", 3}}}}, {"w", 4}}},
		{"an $and that is not an array is wrapped whole", D{{"$and", 5}},
			D{{"$and", A{D{{"_id", D{{"$in", A{int32(7)}}}}}, D{{"$and", 5}}}}}},
		{"empty filter", D{}, D{{"_id", D{{"$in", A{int32(7)}}}}}},
	}
	for _, tc := range cases {
		orig, err := bson.Marshal(tc.orig)
		if err != nil {
			t.Fatal(err)
		}
		want, err := bson.Marshal(tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if got := pinnedFilter(orig, ids); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got  %v\n want %v", tc.name, bsoncore.Document(got), bsoncore.Document(want))
		}
	}
}
