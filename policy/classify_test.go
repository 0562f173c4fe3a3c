package policy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Helpers of the classification tests carry a "cl" prefix so that they
// cannot collide with the helpers of the rest of the package's tests.

func clDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return b
}

func clVal(t testing.TB, v any) bsoncore.Value {
	t.Helper()
	if v == nil {
		return bsoncore.Value{}
	}
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatalf("marshal value %v: %v", v, err)
	}
	return bsoncore.Value{Type: typ, Data: data}
}

func clSeq(t testing.TB, id string, docs ...bson.D) wire.Sequence {
	s := wire.Sequence{Identifier: id}
	for _, d := range docs {
		s.Documents = append(s.Documents, clDoc(t, d))
	}
	return s
}

// clParse parses raw, failing the test on error.
func clParse(t testing.TB, raw []byte) wire.Message {
	t.Helper()
	m, err := wire.Parse(raw, wire.Limits{})
	if err != nil {
		t.Fatalf("wire.Parse: %v", err)
	}
	return m
}

func clMsgRaw(t testing.TB, flags wire.MsgFlags, body bson.D, seqs ...wire.Sequence) []byte {
	return wire.AppendMsg(nil, 42, 0, flags, clDoc(t, body), seqs...)
}

func clMsg(t testing.TB, body bson.D, seqs ...wire.Sequence) wire.Message {
	t.Helper()
	return clParse(t, clMsgRaw(t, 0, body, seqs...))
}

// clFrame builds a legacy message of opcode op from its parts.
func clFrame(op wire.OpCode, parts ...[]byte) []byte {
	b := wire.Header{RequestID: 42, OpCode: op}.Append(nil)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func clI32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }
func clCStr(s string) []byte {
	return append([]byte(s), 0)
}

func clQueryRaw(t testing.TB, ns string, query bson.D) []byte {
	return clFrame(wire.OpCodeQuery, clI32(0), clCStr(ns), clI32(0), clI32(-1), clDoc(t, query))
}

func clUpdateRaw(t testing.TB, ns string, flags int32, sel, upd bson.D) []byte {
	return clFrame(wire.OpCodeUpdate, clI32(0), clCStr(ns), clI32(flags), clDoc(t, sel), clDoc(t, upd))
}

func clDeleteRaw(t testing.TB, ns string, flags int32, sel bson.D) []byte {
	return clFrame(wire.OpCodeDelete, clI32(0), clCStr(ns), clI32(flags), clDoc(t, sel))
}

func clInsertRaw(t testing.TB, ns string, docs ...bson.D) []byte {
	parts := [][]byte{clI32(0), clCStr(ns)}
	for _, d := range docs {
		parts = append(parts, clDoc(t, d))
	}
	return clFrame(wire.OpCodeInsert, parts...)
}

func clCompressed(t testing.TB, raw []byte, c wire.Compressor) []byte {
	t.Helper()
	out, err := wire.AppendCompressed(nil, raw, c)
	if err != nil {
		t.Fatalf("AppendCompressed: %v", err)
	}
	return out
}

// clClassify parses raw and classifies it as the engine does.
func clClassify(t testing.TB, raw []byte) ([]Write, error) {
	t.Helper()
	m := clParse(t, raw)
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatalf("wire.CommandOf: %v", err)
	}
	return Classify(m, cmd)
}

// want is an expected Write with its documents as bson values.
type want struct {
	NS        string
	Kind      Kind
	List      string
	Index     int
	FilterKey string
	Filter    any // bson.D, or nil for none
	Update    any // bson.D / bson.A, nil for none
	Multi     bool
	Upsert    bool
	Remove    bool
	Collation any
	Hint      any
	Sort      any
	Doc       any
	What      string
}

func clDocOrNil(t testing.TB, v any) bsoncore.Document {
	if v == nil {
		return nil
	}
	return clDoc(t, v)
}

// wantNS is the namespace a test names: "*" is any namespace
// (namespace.Unknown), "db.*" a whole database (DBNamespace).
func wantNS(s string) namespace.Namespace {
	if s == namespace.Any {
		return namespace.Unknown()
	}
	return namespace.Of(s)
}

func (w want) write(t testing.TB) Write {
	return Write{
		NS: wantNS(w.NS), Kind: w.Kind, List: w.List, Index: w.Index, FilterKey: w.FilterKey,
		Filter: clDocOrNil(t, w.Filter), Update: clVal(t, w.Update),
		Multi: w.Multi, Upsert: w.Upsert, Remove: w.Remove,
		Collation: clDocOrNil(t, w.Collation), Hint: clVal(t, w.Hint), Sort: clDocOrNil(t, w.Sort),
		Doc: clDocOrNil(t, w.Doc), What: w.What,
	}
}

func clDescribe(w Write) string {
	d := func(b bsoncore.Document) string {
		if b == nil {
			return "nil"
		}
		return b.String()
	}
	v := func(x bsoncore.Value) string {
		if x.Type == 0 {
			return "none"
		}
		return fmt.Sprintf("%v:%s", x.Type, x.String())
	}
	return fmt.Sprintf("{%s %v %q[%d] %s=%s u=%s multi=%v upsert=%v remove=%v coll=%s hint=%s sort=%s doc=%s what=%q}",
		w.NS, w.Kind, w.List, w.Index, w.FilterKey, d(w.Filter), v(w.Update), w.Multi, w.Upsert, w.Remove,
		d(w.Collation), v(w.Hint), d(w.Sort), d(w.Doc), w.What)
}

func clSameWrite(a, b Write) bool {
	val := func(x, y bsoncore.Value) bool { return x.Type == y.Type && bytes.Equal(x.Data, y.Data) }
	return a.NS == b.NS && a.Kind == b.Kind && a.List == b.List && a.Index == b.Index &&
		a.FilterKey == b.FilterKey && bytes.Equal(a.Filter, b.Filter) && (a.Filter == nil) == (b.Filter == nil) &&
		val(a.Update, b.Update) && a.Multi == b.Multi && a.Upsert == b.Upsert && a.Remove == b.Remove &&
		bytes.Equal(a.Collation, b.Collation) && (a.Collation == nil) == (b.Collation == nil) &&
		val(a.Hint, b.Hint) && bytes.Equal(a.Sort, b.Sort) && (a.Sort == nil) == (b.Sort == nil) &&
		bytes.Equal(a.Doc, b.Doc) && (a.Doc == nil) == (b.Doc == nil) && a.What == b.What
}

func clCheckWrites(t *testing.T, got []Write, wants []want) {
	t.Helper()
	if len(got) != len(wants) {
		for _, g := range got {
			t.Logf("got %s", clDescribe(g))
		}
		t.Fatalf("got %d writes, want %d", len(got), len(wants))
	}
	for i, w := range wants {
		exp := w.write(t)
		if !clSameWrite(got[i], exp) {
			t.Errorf("write %d:\n got  %s\n want %s", i, clDescribe(got[i]), clDescribe(exp))
		}
	}
}

type D = bson.D
type A = bson.A
type E = bson.E

var (
	setA  = D{{"$set", D{{"a", 1}}}}
	byID1 = D{{"_id", 1}}
	lsid  = D{{"id", primitive.Binary{Subtype: 4, Data: bytes.Repeat([]byte{7}, 16)}}}
)

type classifyCase struct {
	name    string
	raw     func(t testing.TB) []byte
	want    []want
	errNS   string // non-empty: a *ClassifyError on this namespace
	errText string
}

func clBody(body D, seqs ...func(t testing.TB) wire.Sequence) func(t testing.TB) []byte {
	return func(t testing.TB) []byte {
		var ss []wire.Sequence
		for _, s := range seqs {
			ss = append(ss, s(t))
		}
		return clMsgRaw(t, 0, body, ss...)
	}
}

func clSeqOf(id string, docs ...D) func(t testing.TB) wire.Sequence {
	return func(t testing.TB) wire.Sequence { return clSeq(t, id, docs...) }
}

func classifyCases() []classifyCase {
	upd0 := D{{"q", byID1}, {"u", setA}}
	upd1 := D{{"q", D{{"x", 1}}}, {"u", D{{"x", 2}}}, {"multi", true}, {"upsert", true},
		{"collation", D{{"locale", "fr"}}}, {"hint", "x_1"}, {"sort", D{{"a", -1}}}, {"arrayFilters", A{}}}
	wantUpd := []want{
		{NS: "db.c", Kind: KindUpdate, List: "updates", Index: 0, FilterKey: "q", Filter: byID1, Update: setA},
		{NS: "db.c", Kind: KindUpdate, List: "updates", Index: 1, FilterKey: "q", Filter: D{{"x", 1}}, Update: D{{"x", 2}},
			Multi: true, Upsert: true, Collation: D{{"locale", "fr"}}, Hint: "x_1", Sort: D{{"a", -1}}},
	}
	del0 := D{{"q", byID1}, {"limit", 1}}
	del1 := D{{"q", D{{"x", D{{"$gt", 1}}}}}, {"limit", int64(0)}, {"hint", D{{"x", 1}}}}
	wantDel := []want{
		{NS: "db.c", Kind: KindDelete, List: "deletes", Index: 0, FilterKey: "q", Filter: byID1},
		{NS: "db.c", Kind: KindDelete, List: "deletes", Index: 1, FilterKey: "q", Filter: D{{"x", D{{"$gt", 1}}}}, Multi: true, Hint: D{{"x", 1}}},
	}
	ins := []D{{{"_id", 1}, {"a", 1}}, {{"_id", "two"}}}
	wantIns := []want{
		{NS: "db.c", Kind: KindInsert, List: "documents", Index: 0, Doc: ins[0]},
		{NS: "db.c", Kind: KindInsert, List: "documents", Index: 1, Doc: ins[1]},
	}
	fam := D{{"findAndModify", "c"}, {"query", byID1}, {"sort", D{{"a", 1}}}, {"update", setA}, {"new", true},
		{"upsert", true}, {"collation", D{{"locale", "de"}}}, {"hint", "h"}, {"fields", D{{"a", 1}}}, {"$db", "db"}}
	wantFam := []want{{NS: "db.c", Kind: KindFindAndModify, List: "", FilterKey: "query", Filter: byID1, Update: setA,
		Upsert: true, Collation: D{{"locale", "de"}}, Hint: "h", Sort: D{{"a", 1}}}}
	bwOps := []D{
		{{"insert", 0}, {"document", D{{"_id", 5}}}},
		{{"update", 1}, {"filter", byID1}, {"updateMods", A{D{{"$set", D{{"b", 2}}}}}}, {"multi", true}, {"upsert", true}, {"sort", D{{"z", 1}}}, {"collation", D{{"locale", "en"}}}, {"hint", "i"}},
		{{"delete", 0}, {"filter", D{{"x", 1}}}, {"multi", false}},
		{{"delete", int64(1)}, {"filter", D{}}, {"multi", true}},
	}
	bwInfo := []D{{{"ns", "shop.orders"}}, {{"ns", "other.items"}}}
	wantBW := []want{
		{NS: "shop.orders", Kind: KindInsert, List: "ops", Index: 0, Doc: D{{"_id", 5}}},
		{NS: "other.items", Kind: KindUpdate, List: "ops", Index: 1, FilterKey: "filter", Filter: byID1, Update: A{D{{"$set", D{{"b", 2}}}}},
			Multi: true, Upsert: true, Sort: D{{"z", 1}}, Collation: D{{"locale", "en"}}, Hint: "i"},
		{NS: "shop.orders", Kind: KindDelete, List: "ops", Index: 2, FilterKey: "filter", Filter: D{{"x", 1}}},
		{NS: "other.items", Kind: KindDelete, List: "ops", Index: 3, FilterKey: "filter", Filter: D{}, Multi: true},
	}
	cw := func(ns, what string) want {
		return want{NS: ns, Kind: KindCollectionWrite, List: "command", What: what}
	}
	aggr := func(stages ...D) func(t testing.TB) []byte {
		p := A{}
		for _, s := range stages {
			p = append(p, s)
		}
		return clBody(D{{"aggregate", "src"}, {"pipeline", p}, {"cursor", D{}}, {"$db", "db"}})
	}
	raw := func(f func(t testing.TB) []byte) func(t testing.TB) []byte { return f }

	return []classifyCase{
		// update
		{name: "update body", raw: clBody(D{{"update", "c"}, {"updates", A{upd0, upd1}}, {"ordered", true}, {"$db", "db"}}), want: wantUpd},
		{name: "update sequence", raw: clBody(D{{"update", "c"}, {"ordered", true}, {"$db", "db"}}, clSeqOf("updates", upd0, upd1)), want: wantUpd},
		{name: "update in transaction", raw: clBody(D{{"update", "c"}, {"updates", A{upd0, upd1}}, {"lsid", lsid}, {"txnNumber", int64(3)},
			{"startTransaction", true}, {"autocommit", false}, {"$db", "db"}}), want: wantUpd},
		{name: "update pipeline", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", A{D{{"$set", D{{"a", 1}}}}}}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "updates", FilterKey: "q", Filter: D{}, Update: A{D{{"$set", D{{"a", 1}}}}}}}},
		{name: "update numeric multi/upsert", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", setA}, {"multi", 1}, {"upsert", 0.5}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "updates", FilterKey: "q", Filter: D{}, Update: setA, Multi: true, Upsert: true}}},
		// The server reads any non-zero number as true, a negative one too.
		{name: "update negative multi/upsert", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", setA}, {"multi", int32(-1)}, {"upsert", -0.5}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "updates", FilterKey: "q", Filter: D{}, Update: setA, Multi: true, Upsert: true}}},
		{name: "update empty updates", raw: clBody(D{{"update", "c"}, {"updates", A{}}, {"$db", "db"}}), want: nil},
		{name: "update multi string", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", setA}, {"multi", "yes"}}}}, {"$db", "db"}}), errNS: "db.c", errText: "multi"},
		{name: "update multi null", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", setA}, {"multi", nil}}}}, {"$db", "db"}}), errNS: "db.c", errText: "multi"},
		{name: "update q missing", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"u", setA}}}}, {"$db", "db"}}), errNS: "db.c", errText: "q is missing"},
		{name: "update q not a document", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", 1}, {"u", setA}}}}, {"$db", "db"}}), errNS: "db.c", errText: "q is a"},
		{name: "update u missing", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}}}}, {"$db", "db"}}), errNS: "db.c", errText: "u is missing"},
		{name: "update u string", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", D{}}, {"u", "x"}}}}, {"$db", "db"}}), errNS: "db.c", errText: "neither a document nor a pipeline"},
		{name: "update duplicate q", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", byID1}, {"u", setA}, {"q", D{}}}}}, {"$db", "db"}}), errNS: "db.c", errText: "twice"},
		{name: "update duplicate multi", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", byID1}, {"u", setA}, {"multi", false}, {"multi", true}}}}, {"$db", "db"}}), errNS: "db.c", errText: "twice"},
		{name: "update collation not a document", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", byID1}, {"u", setA}, {"collation", "fr"}}}}, {"$db", "db"}}), errNS: "db.c", errText: "collation"},
		{name: "update statement not a document", raw: clBody(D{{"update", "c"}, {"updates", A{upd0, 3}}, {"$db", "db"}}), errNS: "db.c", errText: "not a document"},
		{name: "update updates not an array", raw: clBody(D{{"update", "c"}, {"updates", upd0}, {"$db", "db"}}), errNS: "db.c", errText: "not an array"},
		{name: "update updates absent", raw: clBody(D{{"update", "c"}, {"$db", "db"}}), errNS: "db.c", errText: "without"},
		{name: "update body and sequence", raw: clBody(D{{"update", "c"}, {"updates", A{upd0}}, {"$db", "db"}}, clSeqOf("updates", upd1)), errNS: "db.c", errText: "both"},
		{name: "update twice in body", raw: clBody(D{{"update", "c"}, {"updates", A{upd0}}, {"updates", A{upd1}}, {"$db", "db"}}), errNS: "db.c", errText: "twice"},
		{name: "update collection not a string", raw: clBody(D{{"update", 1}, {"updates", A{upd0}}, {"$db", "db"}}), errNS: "db.*", errText: "collection"},
		{name: "update empty collection", raw: clBody(D{{"update", ""}, {"updates", A{upd0}}, {"$db", "db"}}), errNS: "db.*", errText: "collection"},
		{name: "Update case variant", raw: clBody(D{{"Update", "c"}, {"updates", A{upd0}}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "FINDANDMODIFY case variant", raw: clBody(D{{"FINDANDMODIFY", "c"}, {"$db", "db"}}), errNS: "*", errText: "case"},

		// delete
		{name: "delete body", raw: clBody(D{{"delete", "c"}, {"deletes", A{del0, del1}}, {"$db", "db"}}), want: wantDel},
		{name: "delete sequence", raw: clBody(D{{"delete", "c"}, {"$db", "db"}}, clSeqOf("deletes", del0, del1)), want: wantDel},
		{name: "delete limit double", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", 1.0}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindDelete, List: "deletes", FilterKey: "q", Filter: byID1}}},
		{name: "delete collation", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", 0}, {"collation", D{{"locale", "fr"}, {"strength", 1}}}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindDelete, List: "deletes", FilterKey: "q", Filter: byID1, Multi: true, Collation: D{{"locale", "fr"}, {"strength", 1}}}}},
		{name: "delete limit 2", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", 2}}}}, {"$db", "db"}}), errNS: "db.c", errText: "limit"},
		{name: "delete limit -1", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", -1}}}}, {"$db", "db"}}), errNS: "db.c", errText: "limit"},
		{name: "delete limit 0.5", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", 0.5}}}}, {"$db", "db"}}), errNS: "db.c", errText: "limit"},
		{name: "delete limit bool", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", true}}}}, {"$db", "db"}}), errNS: "db.c", errText: "limit"},
		{name: "delete limit missing", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}}}}, {"$db", "db"}}), errNS: "db.c", errText: "limit is missing"},
		{name: "delete q missing", raw: clBody(D{{"delete", "c"}, {"deletes", A{D{{"limit", 0}}}}, {"$db", "db"}}), errNS: "db.c", errText: "q is missing"},
		{name: "delete two sequences", raw: func(t testing.TB) []byte {
			// wire refuses duplicate sequences at parse time; the body/sequence
			// duplicate is the one that reaches Classify.
			return clMsgRaw(t, 0, D{{"delete", "c"}, {"deletes", A{del0}}, {"$db", "db"}}, clSeq(t, "deletes", del1))
		}, errNS: "db.c", errText: "both"},

		// insert
		{name: "insert body", raw: clBody(D{{"insert", "c"}, {"documents", A{ins[0], ins[1]}}, {"$db", "db"}}), want: wantIns},
		{name: "insert sequence", raw: clBody(D{{"insert", "c"}, {"$db", "db"}}, clSeqOf("documents", ins...)), want: wantIns},
		{name: "insert documents missing", raw: clBody(D{{"insert", "c"}, {"$db", "db"}}), errNS: "db.c", errText: "without"},

		// findAndModify
		{name: "findAndModify", raw: clBody(fam), want: wantFam},
		{name: "findAndModify pipeline", raw: clBody(D{{"findAndModify", "c"}, {"query", byID1}, {"update", A{D{{"$set", D{{"a", 1}}}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindFindAndModify, FilterKey: "query", Filter: byID1, Update: A{D{{"$set", D{{"a", 1}}}}}}}},
		{name: "findandmodify remove no query", raw: clBody(D{{"findandmodify", "c"}, {"remove", true}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindFindAndModify, FilterKey: "query", Filter: D{}, Remove: true}}},
		{name: "findAndModify remove and update", raw: clBody(D{{"findAndModify", "c"}, {"remove", true}, {"update", setA}, {"$db", "db"}}), errNS: "db.c", errText: "both"},
		{name: "findAndModify neither", raw: clBody(D{{"findAndModify", "c"}, {"query", byID1}, {"$db", "db"}}), errNS: "db.c", errText: "update is missing"},
		{name: "findAndModify query string", raw: clBody(D{{"findAndModify", "c"}, {"query", "x"}, {"remove", true}, {"$db", "db"}}), errNS: "db.c", errText: "query"},
		{name: "findAndModify duplicate query", raw: clBody(D{{"findAndModify", "c"}, {"query", byID1}, {"query", D{}}, {"remove", true}, {"$db", "db"}}), errNS: "db.c", errText: "twice"},
		{name: "findAndModify remove 1", raw: clBody(D{{"findAndModify", "c"}, {"query", byID1}, {"remove", int32(1)}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindFindAndModify, FilterKey: "query", Filter: byID1, Remove: true}}},

		// bulkWrite
		{name: "bulkWrite body", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{bwOps[0], bwOps[1], bwOps[2], bwOps[3]}}, {"nsInfo", A{bwInfo[0], bwInfo[1]}}, {"$db", "admin"}}), want: wantBW},
		{name: "bulkWrite sequences", raw: clBody(D{{"bulkWrite", 1}, {"errorsOnly", true}, {"$db", "admin"}}, clSeqOf("ops", bwOps...), clSeqOf("nsInfo", bwInfo...)), want: wantBW},
		{name: "bulkWrite mixed placement", raw: clBody(D{{"bulkWrite", 1}, {"nsInfo", A{bwInfo[0], bwInfo[1]}}, {"$db", "admin"}}, clSeqOf("ops", bwOps...)), want: wantBW},
		{name: "bulkWrite index double", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"delete", 1.0}, {"filter", byID1}}}}, {"nsInfo", A{bwInfo[0], bwInfo[1]}}, {"$db", "admin"}}),
			want: []want{{NS: "other.items", Kind: KindDelete, List: "ops", FilterKey: "filter", Filter: byID1}}},
		{name: "bulkWrite index out of range", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"delete", 2}, {"filter", byID1}}}}, {"nsInfo", A{bwInfo[0], bwInfo[1]}}, {"$db", "admin"}}), errNS: "*", errText: "nsInfo index"},
		{name: "bulkWrite index negative", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"delete", -1}, {"filter", byID1}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "nsInfo index"},
		{name: "bulkWrite index string", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"delete", "0"}, {"filter", byID1}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "nsInfo index"},
		{name: "bulkWrite unknown op", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"replace", 0}, {"filter", byID1}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "unknown op type"},
		{name: "bulkWrite two op types", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"insert", 0}, {"document", byID1}, {"delete", 0}, {"filter", D{}}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "in one op"},
		{name: "bulkWrite ns not a string", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{bwOps[0]}}, {"nsInfo", A{D{{"ns", 1}}}}, {"$db", "admin"}}), errNS: "*", errText: "not a string"},
		{name: "bulkWrite ns without collection", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{bwOps[0]}}, {"nsInfo", A{D{{"ns", "shop"}}}}, {"$db", "admin"}}), errNS: "*", errText: "not <db>.<collection>"},
		{name: "bulkWrite nsInfo missing", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{bwOps[0]}}, {"$db", "admin"}}), errNS: "*", errText: "nsInfo"},
		{name: "bulkWrite update without filter", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"update", 0}, {"updateMods", setA}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "filter is missing"},
		{name: "bulkWrite insert without document", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"insert", 0}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "document is missing"},
		{name: "bulkWrite delete multi string", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"delete", 0}, {"filter", D{}}, {"multi", "x"}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "multi"},
		{name: "bulkWrite empty op", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "empty"},

		// OP_QUERY commands
		{name: "OP_QUERY update", raw: func(t testing.TB) []byte {
			return clQueryRaw(t, "db.$cmd", D{{"update", "c"}, {"updates", A{upd0, upd1}}})
		}, want: wantUpd},
		{name: "OP_QUERY wrapped delete", raw: func(t testing.TB) []byte {
			return clQueryRaw(t, "db.$cmd", D{{"$query", D{{"delete", "c"}, {"deletes", A{del0, del1}}}}, {"$readPreference", D{{"mode", "primary"}}}})
		}, want: wantDel},
		{name: "OP_QUERY find is a read", raw: func(t testing.TB) []byte { return clQueryRaw(t, "db.c", D{{"_id", 1}}) }},

		// legacy opcodes
		{name: "OP_UPDATE upsert multi", raw: func(t testing.TB) []byte { return clUpdateRaw(t, "db.c", 3, byID1, setA) },
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "legacy", Filter: byID1, Update: setA, Multi: true, Upsert: true}}},
		{name: "OP_UPDATE plain", raw: func(t testing.TB) []byte { return clUpdateRaw(t, "db.c", 0, D{}, D{{"a", 1}}) },
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "legacy", Filter: D{}, Update: D{{"a", 1}}}}},
		{name: "OP_UPDATE on $cmd", raw: func(t testing.TB) []byte { return clUpdateRaw(t, "db.$cmd", 0, D{}, setA) }, errNS: "db.*", errText: "command namespace"},
		{name: "OP_UPDATE bad namespace", raw: func(t testing.TB) []byte { return clUpdateRaw(t, "nodot", 0, D{}, setA) }, errNS: "*", errText: "not <db>.<collection>"},
		{name: "OP_DELETE single", raw: func(t testing.TB) []byte { return clDeleteRaw(t, "db.c", 1, byID1) },
			want: []want{{NS: "db.c", Kind: KindDelete, List: "legacy", Filter: byID1}}},
		{name: "OP_DELETE multi", raw: func(t testing.TB) []byte { return clDeleteRaw(t, "db.c", 0, D{{"x", 1}}) },
			want: []want{{NS: "db.c", Kind: KindDelete, List: "legacy", Filter: D{{"x", 1}}, Multi: true}}},
		{name: "OP_DELETE on $cmd", raw: func(t testing.TB) []byte { return clDeleteRaw(t, "db.$cmd", 0, D{}) }, errNS: "db.*", errText: "command namespace"},
		{name: "OP_INSERT", raw: func(t testing.TB) []byte { return clInsertRaw(t, "db.c", ins...) }, want: []want{
			{NS: "db.c", Kind: KindInsert, List: "legacy", Index: 0, Doc: ins[0]},
			{NS: "db.c", Kind: KindInsert, List: "legacy", Index: 1, Doc: ins[1]},
		}},
		{name: "OP_INSERT system.indexes", raw: func(t testing.TB) []byte {
			return clInsertRaw(t, "db.system.indexes", D{{"ns", "db.c"}, {"key", D{{"t", 1}}}, {"expireAfterSeconds", 0}})
		}, want: []want{
			{NS: "db.system.indexes", Kind: KindInsert, List: "legacy", Doc: D{{"ns", "db.c"}, {"key", D{{"t", 1}}}, {"expireAfterSeconds", 0}}},
			cw("db.*", "createIndexes"),
		}},
		{name: "insert system.indexes", raw: clBody(D{{"insert", "system.indexes"}, {"documents", A{D{{"ns", "db.c"}}}}, {"$db", "db"}}), want: []want{
			{NS: "db.system.indexes", Kind: KindInsert, List: "documents", Doc: D{{"ns", "db.c"}}},
			cw("db.*", "createIndexes"),
		}},
		{name: "OP_INSERT on $cmd", raw: func(t testing.TB) []byte { return clInsertRaw(t, "db.$cmd", ins[0]) }, errNS: "db.*", errText: "command namespace"},

		// OP_COMPRESSED
		{name: "compressed OP_MSG update sequence", raw: func(t testing.TB) []byte {
			return clCompressed(t, clMsgRaw(t, 0, D{{"update", "c"}, {"$db", "db"}}, clSeq(t, "updates", upd0, upd1)), wire.CompressorZstd)
		}, want: wantUpd},
		{name: "compressed OP_QUERY delete", raw: func(t testing.TB) []byte {
			return clCompressed(t, clQueryRaw(t, "db.$cmd", D{{"delete", "c"}, {"deletes", A{del0, del1}}}), wire.CompressorSnappy)
		}, want: wantDel},
		{name: "compressed OP_UPDATE", raw: func(t testing.TB) []byte {
			return clCompressed(t, clUpdateRaw(t, "db.c", 2, byID1, setA), wire.CompressorZlib)
		}, want: []want{{NS: "db.c", Kind: KindUpdate, List: "legacy", Filter: byID1, Update: setA, Multi: true}}},
		{name: "compressed OP_DELETE on $cmd", raw: func(t testing.TB) []byte {
			return clCompressed(t, clDeleteRaw(t, "db.$cmd", 0, D{}), wire.CompressorNoop)
		}, errNS: "db.*", errText: "command namespace"},
		{name: "compressed bulkWrite", raw: func(t testing.TB) []byte {
			return clCompressed(t, clMsgRaw(t, 0, D{{"bulkWrite", 1}, {"$db", "admin"}}, clSeq(t, "ops", bwOps...), clSeq(t, "nsInfo", bwInfo...)), wire.CompressorZstd)
		}, want: wantBW},

		// collection writes
		{name: "drop", raw: clBody(D{{"drop", "c"}, {"$db", "db"}}), want: []want{cw("db.c", "drop")}},
		{name: "drop non-string", raw: clBody(D{{"drop", 1}, {"$db", "db"}}), errNS: "db.*", errText: "collection"},
		{name: "dropDatabase", raw: clBody(D{{"dropDatabase", 1}, {"$db", "shop"}}), want: []want{cw("shop.*", "dropDatabase")}},
		{name: "renameCollection", raw: clBody(D{{"renameCollection", "shop.a"}, {"to", "other.b"}, {"dropTarget", true}, {"$db", "admin"}}),
			want: []want{cw("shop.a", "renameCollection"), cw("other.b", "renameCollection")}},
		{name: "renameCollection no to", raw: clBody(D{{"renameCollection", "shop.a"}, {"$db", "admin"}}), errNS: "*", errText: "to is not"},
		{name: "renameCollection from not a namespace", raw: clBody(D{{"renameCollection", "a"}, {"to", "shop.b"}, {"$db", "admin"}}), errNS: "*", errText: "renameCollection is not"},
		{name: "internalRename", raw: clBody(D{{"internalRenameIfOptionsAndIndexesMatch", 1}, {"from", "db.tmp"}, {"to", "db.c"}, {"$db", "admin"}}),
			want: []want{cw("db.tmp", "renameCollection"), cw("db.c", "renameCollection")}},
		{name: "aggregate $out string", raw: aggr(D{{"$match", D{}}}, D{{"$out", "dst"}}), want: []want{cw("db.dst", "$out")}},
		{name: "aggregate $out db coll", raw: aggr(D{{"$out", D{{"db", "x"}, {"coll", "y"}}}}), want: []want{cw("x.y", "$out")}},
		{name: "aggregate $out coll only", raw: aggr(D{{"$out", D{{"coll", "y"}}}}), want: []want{cw("db.y", "$out")}},
		{name: "aggregate $out number", raw: aggr(D{{"$out", 1}}), errNS: "*", errText: "$out"},
		{name: "aggregate $out db not a string", raw: aggr(D{{"$out", D{{"db", 1}, {"coll", "y"}}}}), errNS: "*", errText: "db is not"},
		{name: "aggregate $out no coll", raw: aggr(D{{"$out", D{{"db", "x"}}}}), errNS: "*", errText: "coll is not"},
		{name: "aggregate $merge string", raw: aggr(D{{"$merge", "dst"}}), want: []want{cw("db.dst", "$merge")}},
		{name: "aggregate $merge into string", raw: aggr(D{{"$merge", D{{"into", "dst"}, {"whenMatched", "replace"}}}}), want: []want{cw("db.dst", "$merge")}},
		{name: "aggregate $merge into db coll", raw: aggr(D{{"$merge", D{{"into", D{{"db", "x"}, {"coll", "y"}}}, {"on", "_id"}}}}), want: []want{cw("x.y", "$merge")}},
		{name: "aggregate $merge no into", raw: aggr(D{{"$merge", D{{"on", "_id"}}}}), errNS: "*", errText: "no into"},
		{name: "aggregate $out not last", raw: aggr(D{{"$out", "a"}}, D{{"$match", D{}}}), want: []want{cw("db.a", "$out")}},
		{name: "aggregate $out in $facet and $lookup", raw: aggr(
			D{{"$lookup", D{{"from", "o"}, {"pipeline", A{D{{"$merge", "m"}}}}, {"as", "x"}}}},
			D{{"$facet", D{{"f", A{D{{"$out", "fo"}}}}}}}),
			want: []want{cw("db.m", "$merge"), cw("db.fo", "$out")}},
		{name: "aggregate read", raw: aggr(D{{"$match", D{{"a", 1}}}}, D{{"$group", D{{"_id", "$a"}}}})},
		{name: "aggregate pipeline not array", raw: clBody(D{{"aggregate", "src"}, {"pipeline", D{}}, {"$db", "db"}}), errNS: "db.src", errText: "not an array"},
		{name: "aggregate pipeline as a sequence", raw: clBody(D{{"aggregate", "src"}, {"cursor", D{}}, {"$db", "db"}}, clSeqOf("pipeline", D{{"$match", D{}}}, D{{"$merge", "m"}})),
			want: []want{cw("db.m", "$merge")}},
		{name: "aggregate stage not a document", raw: clBody(D{{"aggregate", "src"}, {"pipeline", A{"$out"}}, {"$db", "db"}}), errNS: "db.src", errText: "not a document"},
		{name: "aggregate two pipelines", raw: clBody(D{{"aggregate", "src"}, {"pipeline", A{}}, {"pipeline", A{D{{"$out", "x"}}}}, {"$db", "db"}}), errNS: "db.src", errText: "twice"},
		{name: "aggregate db-level $documents $out", raw: clBody(D{{"aggregate", 1}, {"pipeline", A{D{{"$documents", A{D{{"a", 1}}}}}, D{{"$out", "z"}}}}, {"$db", "db"}}), want: []want{cw("db.z", "$out")}},
		{name: "explain of update", raw: clBody(D{{"explain", D{{"update", "c"}, {"updates", A{upd0}}}}, {"verbosity", "executionStats"}, {"$db", "db"}})},
		{name: "explain of aggregate $out", raw: clBody(D{{"explain", D{{"aggregate", "c"}, {"pipeline", A{D{{"$out", "x"}}}}}}, {"verbosity", "executionStats"}, {"$db", "db"}}),
			want: []want{cw("db.x", "$out")}},
		{name: "explain of mapReduce", raw: clBody(D{{"explain", D{{"mapReduce", "c"}, {"out", "x"}}}, {"$db", "db"}}), want: []want{cw("db.x", "mapReduce")}},
		{name: "explain of aggregate read", raw: clBody(D{{"explain", D{{"aggregate", "c"}, {"pipeline", A{}}}}, {"$db", "db"}})},
		{name: "explain of delete", raw: clBody(D{{"explain", D{{"delete", "c"}, {"deletes", A{del0}}}}, {"$db", "db"}})},
		{name: "explain of findAndModify", raw: clBody(D{{"explain", D{{"findAndModify", "c"}, {"remove", true}}}, {"$db", "db"}})},
		{name: "explain of AGGREGATE", raw: clBody(D{{"explain", D{{"AGGREGATE", "c"}, {"pipeline", A{}}}}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "update upsertSupplied", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", byID1}, {"u", setA}, {"upsert", true}, {"upsertSupplied", true}, {"c", D{{"new", D{{"_id", 2}}}}}}}}, {"$db", "db"}}), errNS: "db.c", errText: "upsertSupplied"},
		{name: "update upsertSupplied false", raw: clBody(D{{"update", "c"}, {"updates", A{D{{"q", byID1}, {"u", setA}, {"upsertSupplied", false}}}}, {"$db", "db"}}),
			want: []want{{NS: "db.c", Kind: KindUpdate, List: "updates", FilterKey: "q", Filter: byID1, Update: setA}}},
		{name: "findAndModify upsertSupplied", raw: clBody(D{{"findAndModify", "c"}, {"query", byID1}, {"update", setA}, {"upsert", true}, {"upsertSupplied", 1}, {"$db", "db"}}), errNS: "db.c", errText: "upsertSupplied"},
		{name: "bulkWrite upsertSupplied", raw: clBody(D{{"bulkWrite", 1}, {"ops", A{D{{"update", 0}, {"filter", byID1}, {"updateMods", setA}, {"upsert", true}, {"upsertSupplied", true}}}}, {"nsInfo", A{bwInfo[0]}}, {"$db", "admin"}}), errNS: "*", errText: "upsertSupplied"},
		{name: "mapReduce out string", raw: clBody(D{{"mapReduce", "src"}, {"map", "f"}, {"reduce", "g"}, {"out", "dst"}, {"$db", "db"}}), want: []want{cw("db.dst", "mapReduce")}},
		{name: "mapreduce out replace db", raw: clBody(D{{"mapreduce", "src"}, {"out", D{{"replace", "dst"}, {"db", "x"}}}, {"$db", "db"}}), want: []want{cw("x.dst", "mapReduce")}},
		{name: "mapReduce out merge", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"merge", "dst"}}}, {"$db", "db"}}), want: []want{cw("db.dst", "mapReduce")}},
		{name: "mapReduce out reduce", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"reduce", "dst"}, {"nonAtomic", true}}}, {"$db", "db"}}), want: []want{cw("db.dst", "mapReduce")}},
		{name: "mapReduce inline", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"inline", 1}}}, {"$db", "db"}})},
		{name: "mapReduce inline and replace", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"inline", 1}, {"replace", "d"}}}, {"$db", "db"}}), want: []want{cw("db.d", "mapReduce")}},
		{name: "mapReduce out unknown", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"into", "d"}}}, {"$db", "db"}}), errNS: "db.*", errText: "no output mode"},
		{name: "mapReduce out number", raw: clBody(D{{"mapReduce", "src"}, {"out", 1}, {"$db", "db"}}), errNS: "db.src", errText: "out is a"},
		{name: "mapReduce out db not a string", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"replace", "d"}, {"db", 1}}}, {"$db", "db"}}), errNS: "*", errText: "out.db"},
		{name: "mapReduce out replace not a string", raw: clBody(D{{"mapReduce", "src"}, {"out", D{{"merge", 1}, {"db", "x"}}}, {"$db", "db"}}), errNS: "x.*", errText: "out.merge"},
		{name: "mapReduce no out", raw: clBody(D{{"mapReduce", "src"}, {"$db", "db"}}), errNS: "db.src", errText: "without out"},
		{name: "applyOps", raw: clBody(D{{"applyOps", A{
			D{{"op", "i"}, {"ns", "shop.orders"}, {"o", byID1}},
			D{{"op", "u"}, {"ns", "shop.orders"}, {"o", setA}, {"o2", byID1}},
			D{{"op", "d"}, {"ns", "other.c"}, {"o", byID1}},
			D{{"op", "n"}, {"ns", ""}, {"o", D{{"msg", "noop"}}}},
		}}, {"$db", "admin"}}), want: []want{cw("shop.orders", "applyOps"), cw("other.c", "applyOps")}},
		{name: "applyOps command op", raw: clBody(D{{"applyOps", A{D{{"op", "c"}, {"ns", "shop.$cmd"}, {"o", D{{"drop", "orders"}}}}}}, {"$db", "admin"}}), want: []want{cw("*", "applyOps")}},
		{name: "applyOps with ui", raw: clBody(D{{"applyOps", A{D{{"op", "i"}, {"ns", "a.b"}, {"ui", primitive.Binary{Subtype: 4, Data: make([]byte, 16)}}, {"o", byID1}}}}, {"$db", "admin"}}), want: []want{cw("*", "applyOps")}},
		{name: "doTxn", raw: clBody(D{{"doTxn", A{D{{"op", "u"}, {"ns", "shop.orders"}, {"o", setA}, {"o2", byID1}}}}, {"txnNumber", int64(1)}, {"$db", "admin"}}), want: []want{cw("shop.orders", "applyOps")}},
		{name: "applyOps not an array", raw: clBody(D{{"applyOps", 1}, {"$db", "admin"}}), errNS: "*", errText: "applyOps"},
		{name: "applyOps op not a document", raw: clBody(D{{"applyOps", A{1}}, {"$db", "admin"}}), errNS: "*", errText: "not a document"},
		{name: "convertToCapped", raw: clBody(D{{"convertToCapped", "c"}, {"size", 1000}, {"$db", "db"}}), want: []want{cw("db.c", "convertToCapped")}},
		{name: "cloneCollectionAsCapped", raw: clBody(D{{"cloneCollectionAsCapped", "c"}, {"toCollection", "d"}, {"size", 1000}, {"$db", "db"}}), want: []want{cw("db.d", "cloneCollectionAsCapped")}},
		{name: "cloneCollectionAsCapped no target", raw: clBody(D{{"cloneCollectionAsCapped", "c"}, {"$db", "db"}}), errNS: "db.*", errText: "toCollection"},
		{name: "emptycapped", raw: clBody(D{{"emptycapped", "c"}, {"$db", "db"}}), want: []want{cw("db.c", "emptycapped")}},
		// The source of cloneCollectionAsCapped is only read: its
		// documents stay where they are.
		{name: "cloneCollectionAsCapped writes only its target", raw: clBody(D{{"cloneCollectionAsCapped", "c"}, {"toCollection", "c"}, {"size", 1000}, {"$db", "db"}}), want: []want{cw("db.c", "cloneCollectionAsCapped")}},
		{name: "ConvertToCapped case variant", raw: clBody(D{{"ConvertToCapped", "c"}, {"size", 1000}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "clonecollectionascapped case variant", raw: clBody(D{{"clonecollectionascapped", "c"}, {"toCollection", "d"}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "COLLMOD case variant", raw: clBody(D{{"COLLMOD", "c"}, {"cappedSize", 1}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "collMod capped size", raw: clBody(D{{"collMod", "c"}, {"cappedSize", 4096}, {"$db", "db"}}), want: []want{cw("db.c", "collMod")}},
		// A collection made to evict or expire documents (issue 16).
		{name: "create capped", raw: clBody(D{{"create", "c"}, {"capped", true}, {"size", 4096}, {"$db", "db"}}), want: []want{cw("db.c", "create")}},
		{name: "create capped as a number", raw: clBody(D{{"create", "c"}, {"capped", 1}, {"size", 4096}, {"$db", "db"}}), want: []want{cw("db.c", "create")}},
		{name: "create capped of the wrong type", raw: clBody(D{{"create", "c"}, {"capped", "yes"}, {"$db", "db"}}), want: []want{cw("db.c", "create")}},
		{name: "create with a TTL", raw: clBody(D{{"create", "c"}, {"clusteredIndex", D{{"key", D{{"_id", 1}}}, {"unique", true}}}, {"expireAfterSeconds", 60}, {"$db", "db"}}), want: []want{cw("db.c", "create")}},
		{name: "create plain", raw: clBody(D{{"create", "c"}, {"capped", false}, {"$db", "db"}})},
		{name: "create view", raw: clBody(D{{"create", "v"}, {"viewOn", "c"}, {"pipeline", A{}}, {"$db", "db"}})},
		{name: "CREATE case variant", raw: clBody(D{{"CREATE", "c"}, {"capped", true}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "godinsert", raw: clBody(D{{"godinsert", "c"}, {"obj", D{{"_id", 1}}}, {"$db", "db"}}), want: []want{cw("db.c", "godinsert")}},
		{name: "captrunc", raw: clBody(D{{"captrunc", "c"}, {"n", 1}, {"$db", "db"}}), want: []want{cw("db.c", "captrunc")}},
		{name: "repairDatabase", raw: clBody(D{{"repairDatabase", 1}, {"$db", "db"}}), want: []want{cw("db.*", "repairDatabase")}},
		// Commands that rewrite a collection in place and may lose
		// documents (issue 16): compact trims a capped collection.
		{name: "compact", raw: clBody(D{{"compact", "c"}, {"$db", "db"}}), want: []want{cw("db.c", "compact")}},
		{name: "compact with force", raw: clBody(D{{"compact", "c"}, {"force", true}, {"$db", "db"}}), want: []want{cw("db.c", "compact")}},
		{name: "Compact case variant", raw: clBody(D{{"Compact", "c"}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "reIndex", raw: clBody(D{{"reIndex", "c"}, {"$db", "db"}}), want: []want{cw("db.c", "reIndex")}},
		{name: "REINDEX case variant", raw: clBody(D{{"REINDEX", "c"}, {"$db", "db"}}), errNS: "*", errText: "case"},
		{name: "cleanupOrphaned", raw: clBody(D{{"cleanupOrphaned", "db.c"}, {"$db", "admin"}}), want: []want{cw("db.c", "cleanupOrphaned")}},
		{name: "validate repair", raw: clBody(D{{"validate", "c"}, {"repair", true}, {"$db", "db"}}), want: []want{cw("db.c", "validate")}},
		{name: "validate repair as a number", raw: clBody(D{{"validate", "c"}, {"repair", 1}, {"$db", "db"}}), want: []want{cw("db.c", "validate")}},
		{name: "validate repair of the wrong type", raw: clBody(D{{"validate", "c"}, {"repair", "yes"}, {"$db", "db"}}), errNS: "db.c", errText: "repair"},
		{name: "validate without repair reads", raw: clBody(D{{"validate", "c"}, {"full", true}, {"$db", "db"}})},
		{name: "collMod TTL index", raw: clBody(D{{"collMod", "c"}, {"index", D{{"keyPattern", D{{"t", 1}}}, {"expireAfterSeconds", 1}}}, {"$db", "db"}}), want: []want{cw("db.c", "collMod")}},
		{name: "collMod capped shrink", raw: clBody(D{{"collMod", "c"}, {"cappedMax", 1}, {"$db", "db"}}), want: []want{cw("db.c", "collMod")}},
		{name: "collMod validator", raw: clBody(D{{"collMod", "c"}, {"validator", D{{"a", D{{"$exists", true}}}}}, {"$db", "db"}})},
		{name: "createIndexes TTL", raw: clBody(D{{"createIndexes", "c"}, {"indexes", A{D{{"key", D{{"a", 1}}}, {"name", "a"}}, D{{"key", D{{"t", 1}}}, {"name", "t"}, {"expireAfterSeconds", 0}}}}, {"$db", "db"}}), want: []want{cw("db.c", "createIndexes")}},
		{name: "createIndexes plain", raw: clBody(D{{"createIndexes", "c"}, {"indexes", A{D{{"key", D{{"a", 1}}}, {"name", "a"}, {"unique", true}}}}, {"$db", "db"}})},
		{name: "create view is not a write", raw: clBody(D{{"create", "v"}, {"viewOn", "c"}, {"pipeline", A{}}, {"$db", "db"}})},
		{name: "eval", raw: clBody(D{{"eval", "function(){}"}, {"$db", "db"}}), want: []want{cw("*", "eval")}},
		{name: "copydb", raw: clBody(D{{"copydb", 1}, {"fromdb", "a"}, {"todb", "b"}, {"$db", "admin"}}), want: []want{cw("b.*", "copydb")}},
		{name: "clone", raw: clBody(D{{"clone", "host:1"}, {"$db", "db"}}), want: []want{cw("db.*", "clone")}},
		{name: "cloneCollection", raw: clBody(D{{"cloneCollection", "db.c"}, {"from", "host:1"}, {"$db", "db"}}), want: []want{cw("db.c", "cloneCollection")}},

		// reads and unrelated commands
		{name: "find", raw: clBody(D{{"find", "c"}, {"filter", byID1}, {"$db", "db"}})},
		{name: "hello", raw: clBody(D{{"hello", 1}, {"$db", "admin"}})},
		{name: "count", raw: clBody(D{{"count", "c"}, {"query", D{}}, {"$db", "db"}})},
		{name: "getMore", raw: clBody(D{{"getMore", int64(5)}, {"collection", "c"}, {"$db", "db"}})},
		{name: "acquireLock", raw: clBody(D{{"acquireLock", "c"}, {"ids", A{1}}, {"$db", "db"}})},
		{name: "OP_QUERY hello", raw: func(t testing.TB) []byte { return clQueryRaw(t, "admin.$cmd", D{{"isMaster", 1}}) }},
		{name: "OP_GET_MORE", raw: raw(func(t testing.TB) []byte {
			return clFrame(wire.OpCodeGetMore, clI32(0), clCStr("db.c"), clI32(0), make([]byte, 8))
		})},
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range classifyCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := clClassify(t, tc.raw(t))
			if tc.errNS != "" {
				var ce *ClassifyError
				if !errors.As(err, &ce) {
					t.Fatalf("got writes %d, err %v; want a *ClassifyError", len(got), err)
				}
				if ce.NS != wantNS(tc.errNS) || !strings.Contains(ce.Reason, tc.errText) {
					t.Fatalf("got ClassifyError{NS: %#v, Reason: %q}, want NS %q and a reason containing %q", ce.NS, ce.Reason, tc.errNS, tc.errText)
				}
				if got != nil {
					t.Fatalf("an error came with %d writes", len(got))
				}
				return
			}
			if err != nil {
				t.Fatalf("Classify: %v", err)
			}
			clCheckWrites(t, got, tc.want)
		})
	}
}

// TestClassifyComputesCommand: a nil cmd for a command message is
// computed, not taken for a read.
func TestClassifyComputesCommand(t *testing.T) {
	m := clMsg(t, D{{"delete", "c"}, {"deletes", A{D{{"q", byID1}, {"limit", 0}}}}, {"$db", "db"}})
	got, err := Classify(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	clCheckWrites(t, got, []want{{NS: "db.c", Kind: KindDelete, List: "deletes", FilterKey: "q", Filter: byID1, Multi: true}})

	q := clParse(t, clQueryRaw(t, "db.$cmd", D{{"drop", "c"}}))
	got, err = Classify(q, nil)
	if err != nil {
		t.Fatal(err)
	}
	clCheckWrites(t, got, []want{{NS: "db.c", Kind: KindCollectionWrite, List: "command", What: "drop"}})
}

// TestClassifyViewsIntoMessage: filters are views of the message bytes,
// not copies.
func TestClassifyViewsIntoMessage(t *testing.T) {
	raw := clMsgRaw(t, 0, D{{"update", "c"}, {"$db", "db"}}, clSeq(t, "updates", D{{"q", byID1}, {"u", setA}}))
	m := clParse(t, raw)
	got, err := Classify(m, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("got %v, %v", got, err)
	}
	at := bytes.Index(raw, got[0].Filter)
	if at < 0 || &raw[at] != &got[0].Filter[0] {
		t.Fatal("filter is not a view into the message")
	}
}

func TestKindString(t *testing.T) {
	for k, s := range map[Kind]string{KindInsert: "insert", KindUpdate: "update", KindDelete: "delete",
		KindFindAndModify: "findAndModify", KindCollectionWrite: "collectionWrite", 0: "unknown"} {
		if k.String() != s {
			t.Errorf("%d.String() = %q, want %q", int(k), k.String(), s)
		}
	}
}

func TestClassifyErrorMessage(t *testing.T) {
	err := error(&ClassifyError{NS: namespace.New("db", "c"), Reason: "r"})
	if got := err.Error(); got != "cannot classify write on db.c: r" {
		t.Fatalf("Error() = %q", got)
	}
}

// FuzzClassify feeds whole wire messages through Classify, PinnedIDs,
// UpsertID and PinStatements: nothing may panic, an error is always a
// *ClassifyError, and a classified message's filtered statements can always
// be pinned into a message that re-parses, classifies the same way and
// pins the pinned statements.
func FuzzClassify(f *testing.F) {
	for _, tc := range classifyCases() {
		f.Add(tc.raw(f))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := wire.Parse(raw, wire.Limits{})
		if err != nil {
			return
		}
		cmd, err := wire.CommandOf(m)
		if err != nil {
			return
		}
		ws, err := Classify(m, cmd)
		if err != nil {
			var ce *ClassifyError
			if !errors.As(err, &ce) || ws != nil {
				t.Fatalf("Classify: %v (%T) with %d writes", err, err, len(ws))
			}
			return
		}
		one := bsoncore.Value{Type: 0x10, Data: []byte{1, 0, 0, 0}}
		var pins []Pin
		for _, w := range ws {
			_ = w.Kind.String()
			UpsertID(w)
			InsertID(w)
			if w.Filter == nil {
				continue
			}
			ids, _, ok := PinnedIDs(w.Filter)
			if !ok {
				ids = []bsoncore.Value{one}
			}
			if w.List != ListLegacy {
				pins = append(pins, Pin{List: w.List, Index: w.Index, IDs: ids})
			}
		}
		if len(pins) == 0 {
			return
		}
		out, err := clPin(m, cmd, pins)
		if err != nil {
			t.Fatalf("PinStatements of a classified message: %v", err)
		}
		m2, err := wire.Parse(out, wire.Limits{})
		if err != nil {
			t.Fatalf("pinned message does not parse: %v", err)
		}
		cmd2, err := wire.CommandOf(m2)
		if err != nil || cmd2 == nil {
			t.Fatalf("pinned message has no command: %v", err)
		}
		ws2, err := Classify(m2, cmd2)
		if err != nil || len(ws2) != len(ws) {
			t.Fatalf("pinned message classifies as %d writes, %v; want %d", len(ws2), err, len(ws))
		}
		for i, p := range pins {
			var w Write
			for _, x := range ws2 {
				if x.List == p.List && x.Index == p.Index {
					w = x
				}
			}
			ids, _, ok := PinnedIDs(w.Filter)
			if !ok || len(ids) > len(p.IDs) {
				t.Fatalf("pin %d: rewritten filter %v pins %v, %v", i, w.Filter, ids, ok)
			}
		}
	})
}

func BenchmarkClassifyPinnedUpdate(b *testing.B) {
	raw := clMsgRaw(b, 0, D{{"update", "orders"}, {"ordered", true}, {"lsid", lsid}, {"$db", "shop"}},
		clSeq(b, "updates", D{{"q", D{{"_id", 42}}}, {"u", setA}}))
	m := clParse(b, raw)
	cmd, _ := wire.CommandOf(m)
	b.ReportAllocs()
	for b.Loop() {
		ws, err := Classify(m, cmd)
		if err != nil || len(ws) != 1 {
			b.Fatal(err)
		}
		if _, _, ok := PinnedIDs(ws[0].Filter); !ok {
			b.Fatal("not pinned")
		}
	}
}

func BenchmarkClassifyRead(b *testing.B) {
	m := clMsg(b, D{{"find", "orders"}, {"filter", D{{"_id", 42}}}, {"lsid", lsid}, {"$db", "shop"}})
	cmd, _ := wire.CommandOf(m)
	b.ReportAllocs()
	for b.Loop() {
		if ws, err := Classify(m, cmd); err != nil || ws != nil {
			b.Fatal(err)
		}
	}
}
