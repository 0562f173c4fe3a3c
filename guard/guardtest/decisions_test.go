package guardtest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// harness is a Guard over the in-memory lock store and resolver, driven
// through Intercept as the proxy drives it, without a connection.
type harness struct {
	g     *guard.Guard
	store *memstore.Store
	res   *guardtest.Resolver
	audit *observer.ObservedLogs
	conn  uint64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	h := &harness{
		store: memstore.New(memstore.Config{DefaultLease: 5 * time.Second, MaxLease: time.Minute, Clock: lockstoretest.NewClock()}),
		res:   guardtest.NewResolver(),
		audit: logs,
	}
	h.g = guard.New(guard.Options{Store: h.store, Resolver: h.res, Reserved: guard.ReservedFor("lockgate", "locks"),
		OwnerSecret: []byte("guardtest-owner-secret"), Logger: zap.New(core), OrderTimeout: time.Second})
	pol, err := policy.Compile(config.Policy{
		Default:       config.ModeOff,
		MaxCandidates: 3,
		Namespaces: []config.NamespaceRule{
			{Match: "shop.orders", Mode: config.ModeEnforce},
			{Match: "shop.capped", Mode: config.ModeEnforce},
			{Match: "shop.audited", Mode: config.ModeAudit},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.g.SetPolicy(pol)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(h.res.Insert("shop.orders",
		bson.D{{Key: "_id", Value: 1}, {Key: "status", Value: "open"}},
		bson.D{{Key: "_id", Value: 2}, {Key: "status", Value: "open"}},
		bson.D{{Key: "_id", Value: 3}, {Key: "status", Value: "closed"}},
		bson.D{{Key: "_id", Value: 5}, {Key: "status", Value: "other"}}))
	for i := 10; i < 15; i++ {
		must(h.res.Insert("shop.orders", bson.D{{Key: "_id", Value: i}, {Key: "kind", Value: "many"}}))
	}
	must(h.res.Insert("shop.audited", bson.D{{Key: "_id", Value: 3}}))
	h.res.CreateCapped("shop.capped")
	return h
}

// session is a logical session id as drivers send it.
func session(b byte) bson.D {
	id := make([]byte, 16)
	id[0] = b
	return bson.D{{Key: "id", Value: primitive.Binary{Subtype: 4, Data: id}}}
}

var sessA, sessB = session(0xa), session(0xb)

func doc(t *testing.T, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// intercept parses raw as the proxy does and lets the guard decide it. A
// write allowed through is answered ok, so that nothing stays in flight.
func (h *harness) intercept(t *testing.T, raw []byte) proxy.Decision {
	t.Helper()
	msg, err := wire.Parse(raw, wire.Limits{})
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatalf("command: %v", err)
	}
	h.conn++
	d := h.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: h.conn, Addr: "guardtest"}})
	if d.OnReply != nil {
		if d.Action == proxy.Forward || d.Action == proxy.Rewrite {
			d.OnReply.Reply(context.Background(), doc(t, bson.D{{Key: "ok", Value: 1}, {Key: "n", Value: 1}}))
		} else {
			d.OnReply.Reply(context.Background(), nil)
		}
	}
	return d
}

func msg(t *testing.T, body bson.D, seqs ...wire.Sequence) []byte {
	return wire.AppendMsg(nil, 7, 0, 0, doc(t, body), seqs...)
}

func seq(t *testing.T, id string, docs ...bson.D) wire.Sequence {
	s := wire.Sequence{Identifier: id}
	for _, d := range docs {
		s.Documents = append(s.Documents, doc(t, d))
	}
	return s
}

// frame builds a legacy message of opcode op from its parts.
func frame(op wire.OpCode, parts ...[]byte) []byte {
	b := wire.Header{RequestID: 7, OpCode: op}.Append(nil)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func i32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

func cstr(s string) []byte { return append([]byte(s), 0) }

func opQuery(t *testing.T, ns string, q bson.D) []byte {
	return frame(wire.OpCodeQuery, i32(0), cstr(ns), i32(0), i32(-1), doc(t, q))
}

func opUpdate(t *testing.T, ns string, sel, upd bson.D) []byte {
	return frame(wire.OpCodeUpdate, i32(0), cstr(ns), i32(0), doc(t, sel), doc(t, upd))
}

func opDelete(t *testing.T, ns string, sel bson.D) []byte {
	return frame(wire.OpCodeDelete, i32(0), cstr(ns), i32(0), doc(t, sel))
}

func opInsert(t *testing.T, ns string, d bson.D) []byte {
	return frame(wire.OpCodeInsert, i32(0), cstr(ns), doc(t, d))
}

func compressed(t *testing.T, raw []byte) []byte {
	t.Helper()
	b, err := wire.AppendCompressed(nil, raw, wire.CompressorZlib)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func id(v any) bson.D { return bson.D{{Key: "_id", Value: v}} }

// txn are the fields of a statement inside a multi-document transaction.
var txn = []bson.E{{Key: "txnNumber", Value: int64(1)}, {Key: "startTransaction", Value: true}, {Key: "autocommit", Value: false}}

var set = bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}

func update(q bson.D) bson.D { return bson.D{{Key: "q", Value: q}, {Key: "u", Value: set}} }

func upsert(q bson.D) bson.D { return append(update(q), bson.E{Key: "upsert", Value: true}) }

func del(q bson.D) bson.D { return bson.D{{Key: "q", Value: q}, {Key: "limit", Value: 1}} }

func cmd(name string, coll any, lsid bson.D, rest ...bson.E) bson.D {
	d := bson.D{{Key: name, Value: coll}}
	d = append(d, rest...)
	if lsid != nil {
		d = append(d, bson.E{Key: "lsid", Value: lsid})
	}
	db := "shop"
	if name == "bulkWrite" {
		db = "admin"
	}
	return append(d, bson.E{Key: "$db", Value: db})
}

// lockA takes the locks the table relies on: session A holds orders 1
// and 2, session B holds orders 5.
func (h *harness) lock(t *testing.T, lsid bson.D, ids ...any) {
	t.Helper()
	d := h.intercept(t, msg(t, cmd("acquireLock", "orders", lsid, bson.E{Key: "ids", Value: bson.A(ids)})))
	if d.Action != proxy.Reply {
		t.Fatalf("acquireLock was not answered by the guard: %v", d.Action)
	}
	if ok, _ := bsoncore.Document(d.Reply).Lookup("ok").AsInt64OK(); ok != 1 {
		t.Fatalf("acquireLock %v: %v", ids, bsoncore.Document(d.Reply))
	}
}

// outcome is what a decision comes to: "forward", "rewrite", or the
// refusal's reason.
func outcome(t *testing.T, d proxy.Decision) string {
	t.Helper()
	switch d.Action {
	case proxy.Forward:
		return "forward"
	case proxy.Rewrite:
		return "rewrite"
	case proxy.Reply:
		r := bsoncore.Document(d.Reply)
		if code, _ := r.Lookup("code").AsInt64OK(); code != 46 {
			t.Fatalf("refusal with code %d, want 46 LockBusy: %v", code, r)
		}
		if name, _ := r.Lookup("codeName").StringValueOK(); name != "LockBusy" {
			t.Fatalf("refusal codeName %q: %v", name, r)
		}
		reason, _ := r.Lookup("lockgate", "reason").StringValueOK()
		return reason
	}
	t.Fatalf("unexpected action %d", d.Action)
	return ""
}

// TestDecisions runs every write form the guard classifies, and every
// decision it makes, through Intercept with the in-memory lock store and
// resolver: milliseconds, where the same through a proxy and FerretDB
// takes seconds.
func TestDecisions(t *testing.T) {
	h := newHarness(t)
	h.lock(t, sessA, 1, 2)
	h.lock(t, sessB, 5)
	bulk := func(lsid bson.D, op bson.D) bson.D {
		return cmd("bulkWrite", 1, lsid, bson.E{Key: "ops", Value: bson.A{op}}, bson.E{Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "shop.orders"}}}})
	}
	bulkUpdate := func(filter bson.D) bson.D {
		return bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: filter}, {Key: "updateMods", Value: set}}
	}
	fam := func(name string, lsid bson.D, q bson.D) bson.D {
		return cmd(name, "orders", lsid, bson.E{Key: "query", Value: q}, bson.E{Key: "update", Value: set})
	}
	for _, c := range []struct {
		name string
		raw  func(t *testing.T) []byte
		want string
	}{
		// Allowed: the session holds every document the write can touch.
		{"update body", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(1))}}))
		}, "rewrite"}, // the lease caps its maxTimeMS
		{"update sequence", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA), seq(t, "updates", update(id(1)), update(id(2))))
		}, "rewrite"},
		{"update $in", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{1, int64(2)}}}}})}}))
		}, "rewrite"},
		{"delete body", func(t *testing.T) []byte {
			return msg(t, cmd("delete", "orders", sessA, bson.E{Key: "deletes", Value: bson.A{del(id(2))}}))
		}, "rewrite"},
		{"delete sequence", func(t *testing.T) []byte {
			return msg(t, cmd("delete", "orders", sessA), seq(t, "deletes", del(id(1.0))))
		}, "rewrite"},
		{"findAndModify", func(t *testing.T) []byte { return msg(t, fam("findAndModify", sessA, id(1))) }, "rewrite"},
		{"findandmodify", func(t *testing.T) []byte { return msg(t, fam("findandmodify", sessA, id(2))) }, "rewrite"},
		{"bulkWrite body", func(t *testing.T) []byte { return msg(t, bulk(sessA, bulkUpdate(id(1)))) }, "rewrite"},
		{"bulkWrite sequences", func(t *testing.T) []byte {
			return msg(t, cmd("bulkWrite", 1, sessA), seq(t, "ops", bulkUpdate(id(2))), seq(t, "nsInfo", bson.D{{Key: "ns", Value: "shop.orders"}}))
		}, "rewrite"},
		{"upsert of a held _id", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{upsert(id(1))}}))
		}, "rewrite"},
		{"resolved filter, pinned", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "status", Value: "open"}})}}))
		}, "rewrite"},
		{"insert of a free _id", func(t *testing.T) []byte {
			return msg(t, cmd("insert", "orders", sessA), seq(t, "documents", id(100)))
		}, "forward"},
		{"OP_QUERY $cmd update", func(t *testing.T) []byte {
			return opQuery(t, "shop.$cmd", bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{update(id(1))}}, {Key: "lsid", Value: sessA}})
		}, "rewrite"},
		{"OP_COMPRESSED update", func(t *testing.T) []byte {
			return compressed(t, msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(2))}})))
		}, "rewrite"},
		{"OP_INSERT of a free _id", func(t *testing.T) []byte { return opInsert(t, "shop.orders", id(101)) }, "forward"},
		// No lock can be held on an _id with a "$" field, and the database
		// refuses to store one.
		{"insert of a value that cannot be an _id", func(t *testing.T) []byte {
			return msg(t, cmd("insert", "orders", sessA, bson.E{Key: "documents", Value: bson.A{id(bson.D{{Key: "$x", Value: 5}})}}))
		}, "forward"},
		{"update in a transaction", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, append([]bson.E{{Key: "updates", Value: bson.A{update(id(1))}}}, txn...)...))
		}, "forward"}, // no maxTimeMS inside a transaction: the commit is checked instead
		{"unprotected namespace", func(t *testing.T) []byte {
			return msg(t, cmd("update", "other", nil, bson.E{Key: "updates", Value: bson.A{update(id(1))}}))
		}, "forward"},
		{"unknown command on an unprotected database", func(t *testing.T) []byte {
			return msg(t, bson.D{{Key: "rewriteDocuments", Value: "orders"}, {Key: "lsid", Value: sessA}, {Key: "$db", Value: "elsewhere"}})
		}, "forward"},
		{"read", func(t *testing.T) []byte {
			return msg(t, cmd("find", "orders", nil, bson.E{Key: "filter", Value: id(3)}))
		}, "forward"},

		// Refused.
		{"not locked", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(3))}}))
		}, "not_locked"},
		{"one statement not locked", func(t *testing.T) []byte {
			return msg(t, cmd("delete", "orders", sessA), seq(t, "deletes", del(id(1)), del(id(3))))
		}, "not_locked"},
		{"held by other", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(5))}}))
		}, "held_by_other"},
		{"held by other, findAndModify", func(t *testing.T) []byte { return msg(t, fam("findAndModify", sessA, id(int64(5)))) }, "held_by_other"},
		{"held by other, bulkWrite", func(t *testing.T) []byte { return msg(t, bulk(sessA, bulkUpdate(id(5)))) }, "held_by_other"},
		{"upsert of another's _id", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{upsert(id(5))}}))
		}, "held_by_other"},
		{"resolved filter reaching another's document", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "status", Value: "other"}})}}))
		}, "not_locked"},
		{"not locked, in a transaction", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, append([]bson.E{{Key: "updates", Value: bson.A{update(id(3))}}}, txn...)...))
		}, "not_locked"},
		{"no session", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", nil, bson.E{Key: "updates", Value: bson.A{update(id(1))}}))
		}, "no_session"},
		{"OP_QUERY $cmd without session", func(t *testing.T) []byte {
			return opQuery(t, "shop.$cmd", bson.D{{Key: "delete", Value: "orders"}, {Key: "deletes", Value: bson.A{del(id(1))}}})
		}, "no_session"},
		{"OP_UPDATE", func(t *testing.T) []byte { return opUpdate(t, "shop.orders", id(1), set) }, "no_session"},
		{"OP_DELETE", func(t *testing.T) []byte { return opDelete(t, "shop.orders", id(1)) }, "no_session"},
		{"OP_COMPRESSED OP_UPDATE", func(t *testing.T) []byte { return compressed(t, opUpdate(t, "shop.orders", id(1), set)) }, "no_session"},
		{"OP_COMPRESSED not locked", func(t *testing.T) []byte {
			return compressed(t, msg(t, cmd("update", "orders", sessB, bson.E{Key: "updates", Value: bson.A{update(id(1))}})))
		}, "held_by_other"},
		// No document can have an _id with a "$" field in it (but a
		// DBRef's): such a pin cannot be checked, so it is refused rather
		// than let through with nothing to check.
		{"filter pinning a value that cannot be an _id", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(bson.D{{Key: "a", Value: bson.D{{Key: "$x", Value: 1}}}}))}}))
		}, "unclassifiable"},
		{"insert of another's locked _id", func(t *testing.T) []byte {
			return msg(t, cmd("insert", "orders", sessA, bson.E{Key: "documents", Value: bson.A{id(5)}}))
		}, "insert_locked"},
		{"OP_INSERT of another's locked _id", func(t *testing.T) []byte { return opInsert(t, "shop.orders", id(5)) }, "insert_locked"},
		{"insert into a capped collection", func(t *testing.T) []byte {
			return msg(t, cmd("insert", "capped", sessA, bson.E{Key: "documents", Value: bson.A{id(1)}}))
		}, "capped_insert"},
		{"collection write: drop", func(t *testing.T) []byte { return msg(t, cmd("drop", "orders", sessA)) }, "collection_write"},
		{"collection write: $out", func(t *testing.T) []byte {
			return msg(t, cmd("aggregate", "other", sessA, bson.E{Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "orders"}}}}, bson.E{Key: "cursor", Value: bson.D{}}))
		}, "collection_write"},
		{"unclassifiable: statements in body and sequence", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(1))}}), seq(t, "updates", update(id(3))))
		}, "unclassifiable"},
		// A command or opcode lockgate does not know may write: refused
		// where it may reach an enforced namespace, relayed elsewhere.
		{"unknown command on an enforced collection", func(t *testing.T) []byte {
			return msg(t, cmd("rewriteDocuments", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(3))}}))
		}, "unclassifiable"},
		{"unknown command naming an enforced collection in a field", func(t *testing.T) []byte {
			return msg(t, cmd("rewriteDocuments", "other", sessA, bson.E{Key: "into", Value: "orders"}))
		}, "unclassifiable"},
		{"unknown command on admin", func(t *testing.T) []byte {
			return msg(t, bson.D{{Key: "rewriteDocuments", Value: 1}, {Key: "ns", Value: "shop.orders"}, {Key: "lsid", Value: sessA}, {Key: "$db", Value: "admin"}})
		}, "unclassifiable"},
		{"unknown command on an enforced database", func(t *testing.T) []byte {
			return msg(t, cmd("rewriteDocuments", 1, sessA, bson.E{Key: "ns", Value: "shop.orders"}))
		}, "unclassifiable"},
		{"write command in another case", func(t *testing.T) []byte {
			return msg(t, cmd("UPDATE", "other", sessA, bson.E{Key: "updates", Value: bson.A{update(id(3))}}))
		}, "unclassifiable"},
		{"OP_RESERVED", func(t *testing.T) []byte { return frame(wire.OpCodeReserved, i32(0), cstr("shop.orders")) }, "unclassifiable"},
		// Pins count against maxCandidates (3 here) too, and reading them
		// stops at the fourth.
		{"filter naming more _ids than maxCandidates", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(bson.D{{Key: "$in", Value: bson.A{1, 2, 3, 4}}}))}}))
		}, "too_many_candidates"},
		{"$or naming more _ids than maxCandidates", func(t *testing.T) []byte {
			return msg(t, cmd("delete", "orders", sessA, bson.E{Key: "deletes", Value: bson.A{del(bson.D{{Key: "$or", Value: bson.A{id(1), id(2), id(3), id(4)}}})}}))
		}, "too_many_candidates"},
		{"too many candidates", func(t *testing.T) []byte {
			return msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "kind", Value: "many"}})}}))
		}, "too_many_candidates"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := outcome(t, h.intercept(t, c.raw(t))); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

// TestDecisionPinsResolvedWrite: a write whose filter names no _id goes
// out restricted to the documents verified, so one that starts matching
// in between is not written.
func TestDecisionPinsResolvedWrite(t *testing.T) {
	h := newHarness(t)
	h.lock(t, sessA, 1, 2)
	d := h.intercept(t, msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "status", Value: "open"}})}})))
	if d.Action != proxy.Rewrite {
		t.Fatalf("action %v, want rewrite", d.Action)
	}
	m, err := wire.Parse(d.Message, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	writes, err := policy.Classify(m, c)
	if err != nil || len(writes) != 1 {
		t.Fatalf("rewritten message: %v %v", writes, err)
	}
	ids, _, ok := policy.PinnedIDs(writes[0].Filter)
	if !ok || len(ids) != 2 {
		t.Fatalf("the forwarded filter %v does not pin the two verified ids", writes[0].Filter)
	}
}

// TestDecisionAudit: on an audited namespace a write that enforcement
// would refuse goes through, and the decision is logged as would_reject.
func TestDecisionAudit(t *testing.T) {
	h := newHarness(t)
	d := h.intercept(t, msg(t, cmd("update", "audited", sessA, bson.E{Key: "updates", Value: bson.A{update(id(3))}})))
	if d.Action != proxy.Forward {
		t.Fatalf("audited write: %v, want forward", outcome(t, d))
	}
	lines := h.audit.FilterLoggerName("audit").FilterField(zap.String("decision", "would_reject")).All()
	if len(lines) != 1 {
		t.Fatalf("%d would_reject lines, want 1: %v", len(lines), h.audit.All())
	}
	if r, _ := lines[0].ContextMap()["reason"].(string); r != "not_locked" {
		t.Fatalf("reason %q, want not_locked", r)
	}
	// And where the session holds the lock, the line says allow.
	h.intercept(t, msg(t, cmd("acquireLock", "audited", sessA, bson.E{Key: "ids", Value: bson.A{3}})))
	h.intercept(t, msg(t, cmd("update", "audited", sessA, bson.E{Key: "updates", Value: bson.A{update(id(3))}})))
	if n := h.audit.FilterLoggerName("audit").FilterField(zap.String("decision", "allow")).Len(); n != 1 {
		t.Fatalf("%d allow lines, want 1", n)
	}
}

// TestDecisionFailClosed: with the lock store down, enforced writes are
// refused, audited ones and reads go through.
func TestDecisionFailClosed(t *testing.T) {
	h := newHarness(t)
	h.lock(t, sessA, 1)
	h.store.SetUnavailable(errors.New("network partition"))
	write := func(coll string) []byte {
		return msg(t, cmd("update", coll, sessA, bson.E{Key: "updates", Value: bson.A{update(id(1))}}))
	}
	if got := outcome(t, h.intercept(t, write("orders"))); got != "lockstore_unavailable" {
		t.Fatalf("enforced write with the store down: %s, want lockstore_unavailable", got)
	}
	if got := outcome(t, h.intercept(t, write("audited"))); got != "forward" {
		t.Fatalf("audited write with the store down: %s, want forward (audit fails open)", got)
	}
	if got := outcome(t, h.intercept(t, msg(t, cmd("find", "orders", sessA, bson.E{Key: "filter", Value: id(1)})))); got != "forward" {
		t.Fatalf("read with the store down: %s, want forward", got)
	}
	h.store.SetUnavailable(nil)
	if got := outcome(t, h.intercept(t, write("orders"))); got != "rewrite" {
		t.Fatalf("after the store is back: %s", got)
	}
	// A resolver failure fails closed as well.
	h.res.SetUnavailable(errors.New("upstream down"))
	resolved := msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(bson.D{{Key: "status", Value: "open"}})}}))
	if got := outcome(t, h.intercept(t, resolved)); got != "resolve_failed" {
		t.Fatalf("with the resolver down: %s, want resolve_failed", got)
	}
}

// TestDecisionLeaseExpiry: a lock whose lease ended by the lock store's
// clock covers no write.
func TestDecisionLeaseExpiry(t *testing.T) {
	clock := lockstoretest.NewClock()
	h := newHarness(t)
	h.store = memstore.New(memstore.Config{DefaultLease: 5 * time.Second, MaxLease: time.Minute, Clock: clock})
	pol := h.g.Policy()
	h.g = guard.New(guard.Options{Store: h.store, Resolver: h.res, OwnerSecret: []byte("guardtest-owner-secret"), OrderTimeout: time.Second})
	h.g.SetPolicy(pol)
	h.lock(t, sessA, 1)
	write := msg(t, cmd("update", "orders", sessA, bson.E{Key: "updates", Value: bson.A{update(id(1))}}))
	if got := outcome(t, h.intercept(t, write)); got != "rewrite" {
		t.Fatalf("within the lease: %s", got)
	}
	clock.Advance(6 * time.Second)
	if got := outcome(t, h.intercept(t, write)); got != "not_locked" {
		t.Fatalf("after the lease: %s, want not_locked", got)
	}
}
