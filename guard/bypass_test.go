package guard

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// attacker speaks the wire protocol by hand through the proxy.
type attacker struct {
	t    *testing.T
	addr string
	lsid bson.D
	id   int32
}

// outcome is what came back for one crafted message.
type outcome struct {
	closed bool   // the proxy closed the connection without a reply
	body   bson.M // the reply body otherwise
}

func (a *attacker) send(msg []byte) outcome {
	a.t.Helper()
	c, err := net.DialTimeout("tcp", a.addr, 5*time.Second)
	if err != nil {
		a.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		return outcome{closed: true}
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := wire.ReadMessage(bufio.NewReader(c), wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			a.t.Fatalf("no reply and no close within 10s")
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "reset") {
			return outcome{closed: true}
		}
		a.t.Fatalf("reading the reply: %v", err)
	}
	defer raw.Release()
	m, err := wire.Parse(raw.Bytes, wire.Limits{})
	if err != nil {
		a.t.Fatal(err)
	}
	var doc bsoncore.Document
	switch r := m.(type) {
	case *wire.OpMsg:
		doc = r.Body
	case *wire.OpReply:
		doc = r.Documents[0]
	}
	var out bson.M
	if err := bson.Unmarshal(doc, &out); err != nil {
		a.t.Fatal(err)
	}
	return outcome{body: out}
}

func (a *attacker) doc(v any) []byte {
	a.t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		a.t.Fatal(err)
	}
	return b
}

func (a *attacker) msg(flags wire.MsgFlags, body bson.D, seqs ...wire.Sequence) []byte {
	a.id++
	return wire.AppendMsg(nil, a.id, 0, flags, a.doc(body), seqs...)
}

func (a *attacker) query(ns string, q any) []byte {
	a.id++
	b := wire.Header{RequestID: a.id, OpCode: wire.OpCodeQuery}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(append(b, ns...), 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF)
	b = append(b, a.doc(q)...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// legacy builds OP_UPDATE (2001) or OP_DELETE (2006).
func (a *attacker) legacy(op wire.OpCode, ns string, flags uint32, docs ...any) []byte {
	a.id++
	b := wire.Header{RequestID: a.id, OpCode: op}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // ZERO
	b = append(append(b, ns...), 0)
	b = binary.LittleEndian.AppendUint32(b, flags)
	for _, d := range docs {
		b = append(b, a.doc(d)...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func (a *attacker) compressed(inner []byte, c wire.Compressor) []byte {
	b, err := wire.AppendCompressed(nil, inner, c)
	if err != nil {
		a.t.Fatal(err)
	}
	return b
}

func docSeq(t *testing.T, id string, docs ...any) wire.Sequence {
	s := wire.Sequence{Identifier: id}
	for _, d := range docs {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		s.Documents = append(s.Documents, b)
	}
	return s
}

// TestNoBypass sends, without holding the lock, every write form a client
// can produce against an enforced collection, including the ones no driver
// sends. Each must be refused (LockBusy, or the connection closed for
// messages that cannot carry a reply or cannot be read), and the protected
// collection must stay exactly as it was.
func TestNoBypass(t *testing.T) {
	coll, pol := protected(t, 3)
	pol.Namespaces = append(pol.Namespaces, config.NamespaceRule{Match: "shop." + coll + "_strict", Mode: config.ModeEnforce, Inserts: config.InsertsRequireUnlocked})
	st := startStackWith(t, stackOptions{memStore: decisionStore(), policy: pol})
	ns := "shop." + coll

	// Another session holds _id 1, so type variants of 1 meet a real lock.
	other := connect(t, st.uri, "holder")
	hs := session(t, other)
	acquire(t, other, hs, coll, 1)
	acquire(t, other, hs, coll+"_strict", "taken")
	before := snapshot(t, coll)

	lsid := bson.D{{"id", primitive.Binary{Subtype: 4, Data: []byte("attacker-session")}}}
	a := &attacker{t: t, addr: st.addr, lsid: lsid}
	upd := func(q any) bson.D { return bson.D{{"q", q}, {"u", bson.D{{"$set", bson.D{{"pwned", true}}}}}} }
	del := func(q any, limit int) bson.D { return bson.D{{"q", q}, {"limit", limit}} }
	withSession := func(d bson.D) bson.D { return append(d, bson.E{"lsid", lsid}, bson.E{"$db", "shop"}) }

	cases := []struct {
		name string
		msg  []byte
	}{
		{"update in the body", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}}))},
		{"update in a document sequence", a.msg(0, withSession(bson.D{{"update", coll}}), docSeq(t, "updates", upd(bson.D{{"_id", 2}})))},
		{"delete in a document sequence", a.msg(0, withSession(bson.D{{"delete", coll}}), docSeq(t, "deletes", del(bson.D{}, 0)))},
		{"update, _id 1 as double", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 1.0}})}}}))},
		{"update, _id 1 as long", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", int64(1)}})}}}))},
		{"update, _id $eq", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", bson.D{{"$eq", 1}}}})}}}))},
		{"update, _id $in", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", bson.D{{"$in", bson.A{3, 1.0}}}}})}}}))},
		{"update, _id range", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", bson.D{{"$gt", 0}}}})}}}))},
		{"update, $or of ids", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"$or", bson.A{bson.D{{"_id", 2}}, bson.D{{"qty", 30}}}}})}}}))},
		{"update, $expr", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"$expr", bson.D{{"$gt", bson.A{"$qty", 0}}}}})}}}))},
		{"one unlocked statement of three", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 3}}), upd(bson.D{{"_id", 2}}), upd(bson.D{{"_id", 3}})}}}))},
		{"findandmodify alias", a.msg(0, withSession(bson.D{{"findandmodify", coll}, {"query", bson.D{{"_id", 2}}}, {"update", bson.D{{"$set", bson.D{{"pwned", true}}}}}}))},
		{"findAndModify without query", a.msg(0, withSession(bson.D{{"findAndModify", coll}, {"remove", true}}))},
		{"findAndModify upsert naming a locked _id", a.msg(0, withSession(bson.D{{"findAndModify", coll}, {"query", bson.D{{"qty", -1}}}, {"update", bson.D{{"$setOnInsert", bson.D{{"_id", 1}}}}}, {"upsert", true}}))},
		{"upsert of a new _id", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", 99}}}, {"u", bson.D{{"$set", bson.D{{"x", 1}}}}}, {"upsert", true}}}}}))},
		{"pipeline upsert", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{bson.D{{"q", bson.D{{"qty", -5}}}, {"u", bson.A{bson.D{{"$set", bson.D{{"_id", 1}}}}}}, {"upsert", true}}}}}))},
		{"no lsid", a.msg(0, bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"$db", "shop"}})},
		{"inside a transaction", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"txnNumber", int64(1)}, {"startTransaction", true}, {"autocommit", false}}))},
		{"OP_QUERY $cmd", a.query("shop.$cmd", withSession(bson.D{{"delete", coll}, {"deletes", bson.A{del(bson.D{{"_id", 2}}, 1)}}}))},
		{"OP_QUERY $query wrapper", a.query("shop.$cmd", bson.D{{"$query", withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}})}})},
		{"OP_COMPRESSED zlib OP_MSG", a.compressed(a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}})), wire.CompressorZlib)},
		{"OP_COMPRESSED snappy OP_QUERY", a.compressed(a.query("shop.$cmd", withSession(bson.D{{"delete", coll}, {"deletes", bson.A{del(bson.D{}, 0)}}})), wire.CompressorSnappy)},
		{"OP_COMPRESSED zstd sequence", a.compressed(a.msg(0, withSession(bson.D{{"delete", coll}}), docSeq(t, "deletes", del(bson.D{{"_id", 3}}, 1))), wire.CompressorZstd)},
		{"legacy OP_UPDATE", a.legacy(wire.OpCodeUpdate, ns, 2, bson.D{{"qty", bson.D{{"$gt", 0}}}}, bson.D{{"$set", bson.D{{"pwned", true}}}})},
		{"legacy OP_UPDATE pinned", a.legacy(wire.OpCodeUpdate, ns, 0, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"pwned", true}}}})},
		{"legacy OP_DELETE", a.legacy(wire.OpCodeDelete, ns, 0, bson.D{})},
		{"unacknowledged update", a.msg(wire.MoreToCome, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"writeConcern", bson.D{{"w", 0}}}}))},
		{"bulkWrite admin command", a.msg(0, bson.D{{"bulkWrite", 1}, {"ops", bson.A{bson.D{{"delete", 0}, {"filter", bson.D{}}, {"multi", true}}}}, {"nsInfo", bson.A{bson.D{{"ns", ns}}}}, {"lsid", lsid}, {"$db", "admin"}})},
		{"bulkWrite ops in a sequence", a.msg(0, bson.D{{"bulkWrite", 1}, {"lsid", lsid}, {"$db", "admin"}}, docSeq(t, "ops", bson.D{{"update", 0}, {"filter", bson.D{{"_id", 2}}}, {"updateMods", bson.D{{"$set", bson.D{{"pwned", true}}}}}}), docSeq(t, "nsInfo", bson.D{{"ns", ns}}))},
		{"aggregate $out", a.msg(0, withSession(bson.D{{"aggregate", "free"}, {"pipeline", bson.A{bson.D{{"$out", coll}}}}, {"cursor", bson.D{}}}))},
		{"aggregate $merge", a.msg(0, withSession(bson.D{{"aggregate", "free"}, {"pipeline", bson.A{bson.D{{"$merge", bson.D{{"into", bson.D{{"db", "shop"}, {"coll", coll}}}}}}}}, {"cursor", bson.D{}}}))},
		{"mapReduce replace", a.msg(0, withSession(bson.D{{"mapReduce", "free"}, {"map", "function(){}"}, {"reduce", "function(){}"}, {"out", bson.D{{"replace", coll}}}}))},
		{"renameCollection onto it", a.msg(0, bson.D{{"renameCollection", "shop.free"}, {"to", ns}, {"dropTarget", true}, {"lsid", lsid}, {"$db", "admin"}})},
		{"drop", a.msg(0, withSession(bson.D{{"drop", coll}}))},
		{"dropDatabase", a.msg(0, withSession(bson.D{{"dropDatabase", 1}}))},
		{"applyOps", a.msg(0, bson.D{{"applyOps", bson.A{bson.D{{"op", "d"}, {"ns", ns}, {"o", bson.D{{"_id", 2}}}}}}, {"lsid", lsid}, {"$db", "admin"}})},
		{"duplicate $db", a.msg(0, bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"lsid", lsid}, {"$db", "free"}, {"$db", "shop"}})},
		{"duplicate command key", a.msg(0, withSession(bson.D{{"update", "free"}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"update", coll}}))},
		{"duplicate lsid", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 2}})}}, {"lsid", hs.ID()}}))},
		{"updates in body and sequence", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{}}}), docSeq(t, "updates", upd(bson.D{{"_id", 2}})))},
		{"statement that is not a document", a.msg(0, withSession(bson.D{{"update", coll}, {"updates", bson.A{"q"}}}))},
		{"lock held, bind in comment does not match", a.msg(0, append(bson.D{{"update", coll}, {"updates", bson.A{upd(bson.D{{"_id", 1}})}}, {"comment", bson.D{{"lockgate", "guess"}}}}, bson.E{"lsid", hs.ID()}, bson.E{"$db", "shop"}))},
		{"insert of a locked _id under requireUnlocked", a.msg(0, bson.D{{"insert", coll + "_strict"}, {"documents", bson.A{bson.D{{"_id", "taken"}}}}, {"lsid", lsid}, {"$db", "shop"}})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			got := a.send(tc.msg)
			if !got.closed {
				code, _ := got.body["code"].(int32)
				if got.body["ok"] != 0.0 || code != 46 {
					t.Fatalf("not refused by lockgate: %v", got.body)
				}
				if code == 46 && !strings.HasPrefix(got.body["errmsg"].(string), "lockgate: ") {
					t.Fatalf("a LockBusy that lockgate did not write: %v", got.body)
				}
			}
			if after := snapshot(t, coll); !reflect.DeepEqual(before, after) {
				t.Fatalf("the protected collection changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
	// The holder's own session, with the lock, still writes: the refusals
	// above are about the lock, not a broken path.
	if _, err := other.Database("shop").Collection(coll).UpdateOne(inSession(hs), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"ok", true}}}}); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
}
