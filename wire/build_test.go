package wire

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/mongoerr"
	"go.mongodb.org/mongo-driver/bson"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func TestAppendMsgRoundTrip(t *testing.T) {
	body := cmdDoc("insert", "items", "app")
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	seqs := []Sequence{{Identifier: "documents", Documents: []bsoncore.Document{a, a}}, {Identifier: "empty"}}
	for _, flags := range []MsgFlags{0, ChecksumPresent, MoreToCome | ChecksumPresent, ExhaustAllowed | 1<<30} {
		raw := AppendMsg([]byte("junk"), 11, 22, flags, body, seqs...)[4:]
		m := mustParse(t, raw).(*OpMsg)
		h := m.Header()
		if h.RequestID != 11 || h.ResponseTo != 22 || h.OpCode != OpCodeMsg || int(h.MessageLength) != len(raw) {
			t.Errorf("flags %#x: header %+v", flags, h)
		}
		if m.Flags != flags || !bytes.Equal(m.Body, body) || len(m.Sequences) != 2 ||
			m.Sequences[0].Identifier != "documents" || len(m.Sequences[0].Documents) != 2 || len(m.Sequences[1].Documents) != 0 {
			t.Errorf("flags %#x: %+v", flags, m)
		}
		// Same body: same bytes, checksum included.
		again, err := WithBody(m, m.Body)
		if err != nil || !bytes.Equal(again, raw) {
			t.Errorf("flags %#x: re-encoding differs: %v", flags, err)
		}
	}
}

func TestWithBody(t *testing.T) {
	body := cmdDoc("insert", "items", "app")
	other := doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("ok", 1).AppendString("msg", "isdbgrid") })
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })

	// OP_MSG: sections keep their order, checksum recomputed.
	raw := frameOf(OpCodeMsg, i32(int32(ChecksumPresent|ExhaustAllowed)), seqSection("documents", a), bodySection(body))
	raw = withChecksum(raw)
	m := mustParse(t, raw).(*OpMsg)
	same, err := WithBody(m, body)
	if err != nil || !bytes.Equal(same, raw) {
		t.Fatalf("section order not kept: %v", err)
	}
	nb, err := WithBody(m, other)
	if err != nil {
		t.Fatal(err)
	}
	nm := mustParse(t, nb).(*OpMsg)
	if !bytes.Equal(nm.Body, other) || nm.Flags != m.Flags || len(nm.Sequences) != 1 || nm.Header().RequestID != 7 {
		t.Errorf("rewritten OP_MSG %+v", nm)
	}

	// OP_REPLY with one document.
	rep := AppendReply(nil, 3, 7, 8, 0, 0, body)
	rm := mustParse(t, rep).(*OpReply)
	nb, err = WithBody(rm, other)
	if err != nil {
		t.Fatal(err)
	}
	nr := mustParse(t, nb).(*OpReply)
	if len(nr.Documents) != 1 || !bytes.Equal(nr.Documents[0], other) || nr.Flags != 8 || nr.Header().ResponseTo != 7 || nr.Header().RequestID != 3 {
		t.Errorf("rewritten OP_REPLY %+v", nr)
	}
	_, err = WithBody(mustParse(t, AppendReply(nil, 3, 7, 0, 0, 0, body, body)), other)
	wantErr(t, err, ErrMalformed, "exactly one document")

	// OP_QUERY keeps its selector.
	q := mustParse(t, frameOf(OpCodeQuery, i32(4), cstr("admin.$cmd"), i32(0), i32(-1), body, a)).(*OpQuery)
	nb, err = WithBody(q, other)
	if err != nil {
		t.Fatal(err)
	}
	nq := mustParse(t, nb).(*OpQuery)
	if !bytes.Equal(nq.Query, other) || !bytes.Equal(nq.ReturnFieldsSelector, a) || nq.Flags != 4 || nq.FullCollectionName != "admin.$cmd" {
		t.Errorf("rewritten OP_QUERY %+v", nq)
	}

	// Opcodes without a command document.
	if _, err := WithBody(mustParse(t, frameOf(OpCodeKillCursors, i32(0), i32(0))), other); err == nil {
		t.Error("WithBody on OP_KILL_CURSORS succeeded")
	}
}

func TestReplyTo(t *testing.T) {
	body := cmdDoc("find", "items", "app")
	reply := doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("ok", 1) })
	msg := AppendMsg(nil, 100, 0, 0, body)
	query := frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), body)
	query[4] = 100 // request id 100
	cmsg, _ := AppendCompressed(nil, msg, CompressorSnappy)
	cquery, _ := AppendCompressed(nil, query, CompressorZstd)

	for name, tt := range map[string]struct {
		raw []byte
		op  OpCode
	}{
		"OP_MSG": {msg, OpCodeMsg}, "OP_QUERY": {query, OpCodeReply},
		"compressed OP_MSG": {cmsg, OpCodeMsg}, "compressed OP_QUERY": {cquery, OpCodeReply},
		"OP_GET_MORE": {frameOf(OpCodeGetMore, i32(0), cstr("db.c"), i32(0), i64(1)), OpCodeReply},
	} {
		req := mustParse(t, tt.raw)
		out, ok := ReplyTo(req, 555, reply)
		if !ok {
			t.Errorf("%s: no reply", name)
			continue
		}
		rm := mustParse(t, out)
		h := rm.Header()
		if h.OpCode != tt.op || h.RequestID != 555 || h.ResponseTo != req.Header().RequestID {
			t.Errorf("%s: reply header %+v", name, h)
		}
		switch r := rm.(type) {
		case *OpMsg:
			if r.Flags != 0 || !bytes.Equal(r.Body, reply) {
				t.Errorf("%s: %+v", name, r)
			}
		case *OpReply:
			if len(r.Documents) != 1 || !bytes.Equal(r.Documents[0], reply) || r.Flags != 0 {
				t.Errorf("%s: %+v", name, r)
			}
		}
	}
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	for name, raw := range map[string][]byte{
		"moreToCome": AppendMsg(nil, 1, 0, MoreToCome, body),
		"OP_INSERT":  frameOf(OpCodeInsert, i32(0), cstr("db.c"), a),
		"OP_UPDATE":  frameOf(OpCodeUpdate, i32(0), cstr("db.c"), i32(0), a, a),
		"OP_DELETE":  frameOf(OpCodeDelete, i32(0), cstr("db.c"), i32(0), a),
		"OP_KILL":    frameOf(OpCodeKillCursors, i32(0), i32(1), i64(3)),
		"OP_REPLY":   AppendReply(nil, 1, 2, 0, 0, 0, a),
		"unknown":    frameOf(999),
		"compressed w0": func() []byte {
			b, _ := AppendCompressed(nil, AppendMsg(nil, 1, 0, MoreToCome, body), CompressorZlib)
			return b
		}(),
	} {
		req := mustParse(t, raw)
		if out, ok := ReplyTo(req, 1, reply); ok || out != nil {
			t.Errorf("%s: replied", name)
		}
		if out, ok := ErrorReplyTo(req, 1, &mongoerr.Error{Code: mongoerr.BadValue, Msg: "no"}); ok || out != nil {
			t.Errorf("%s: error reply", name)
		}
	}
}

func TestErrorDocument(t *testing.T) {
	extra := bsoncore.AppendDocumentElement(nil, "lockgate", doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("holder", "s1") }))
	d := (&mongoerr.Error{Code: mongoerr.MaxTimeMSExpired, Msg: "document is locked"}).Document(extra)
	if err := validateDocument(d); err != nil {
		t.Fatal(err)
	}
	els, _ := d.Elements()
	var keys []string
	for _, e := range els {
		keys = append(keys, e.Key())
	}
	if got := strings.Join(keys, ","); got != "ok,errmsg,code,codeName,lockgate" {
		t.Errorf("keys %s", got)
	}
	if v := d.Lookup("ok"); v.Type != bson.TypeDouble || v.Double() != 0 {
		t.Errorf("ok %v", v)
	}
	if d.Lookup("code").Int32() != 50 || d.Lookup("codeName").StringValue() != "MaxTimeMSExpired" ||
		d.Lookup("errmsg").StringValue() != "document is locked" || d.Lookup("lockgate", "holder").StringValue() != "s1" {
		t.Errorf("error document %v", d)
	}
}

func TestErrorReplyTo(t *testing.T) {
	body := cmdDoc("update", "items", "app")
	// Command over OP_MSG: {ok:0, errmsg, code, codeName}.
	out, ok := ErrorReplyTo(mustParse(t, AppendMsg(nil, 9, 0, 0, body)), 10, &mongoerr.Error{Code: mongoerr.DuplicateKey, Msg: "boom"})
	if !ok {
		t.Fatal("no reply")
	}
	r := mustParse(t, out).(*OpMsg)
	if r.Header().ResponseTo != 9 || r.Body.Lookup("ok").Double() != 0 || r.Body.Lookup("code").Int32() != 11000 {
		t.Errorf("OP_MSG error reply %v", r.Body)
	}
	// Command over OP_QUERY: an OP_REPLY without QueryFailure.
	q := frameOf(OpCodeQuery, i32(0), cstr("app.$cmd"), i32(0), i32(-1), body)
	out, _ = ErrorReplyTo(mustParse(t, q), 10, &mongoerr.Error{Code: mongoerr.BadValue, Msg: "boom"})
	rr := mustParse(t, out).(*OpReply)
	if rr.Flags != 0 || rr.Documents[0].Lookup("codeName").StringValue() != "BadValue" || rr.Header().ResponseTo != 7 {
		t.Errorf("OP_QUERY command error reply %+v", rr)
	}
	// Plain OP_QUERY: QueryFailure with $err.
	extra := bsoncore.AppendStringElement(nil, "detail", "x")
	q = frameOf(OpCodeQuery, i32(0), cstr("app.items"), i32(0), i32(-1), body)
	out, _ = ErrorReplyTo(mustParse(t, q), 10, &mongoerr.Error{Code: mongoerr.BadValue, Msg: "boom"}, extra)
	rr = mustParse(t, out).(*OpReply)
	d := rr.Documents[0]
	if rr.Flags != QueryFailure || d.Lookup("$err").StringValue() != "boom" || d.Lookup("code").Int32() != 2 ||
		d.Lookup("codeName").StringValue() != "BadValue" || d.Lookup("detail").StringValue() != "x" {
		t.Errorf("OP_QUERY failure %+v %v", rr, d)
	}
	if _, err := d.LookupErr("ok"); err == nil {
		t.Error("legacy failure carries ok")
	}
}

func TestNilMessage(t *testing.T) {
	if _, ok := ReplyTo(nil, 1, nil); ok {
		t.Error("ReplyTo(nil)")
	}
	if _, ok := ErrorReplyTo(nil, 1, &mongoerr.Error{Code: mongoerr.BadValue, Msg: "x"}); ok {
		t.Error("ErrorReplyTo(nil)")
	}
	if _, err := WithBody(nil, nil); err == nil {
		t.Error("WithBody(nil)")
	}
	if c, err := CommandOf(nil); c != nil || err != nil {
		t.Error("CommandOf(nil)")
	}
}

func TestWithSequences(t *testing.T) {
	body := cmdDoc("update", "items", "app")
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	bb := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 2) })
	raw := withChecksum(frameOf(OpCodeMsg, i32(int32(ChecksumPresent)), seqSection("updates", a), bodySection(body)))
	m := mustParse(t, raw).(*OpMsg)
	if got := WithSequences(m, m.Body, m.Sequences); !bytes.Equal(got, raw) {
		t.Fatal("same sections do not give the same bytes")
	}
	out := WithSequences(m, body, []Sequence{{Identifier: "updates", Documents: []bsoncore.Document{bb}}, {Identifier: "x"}})
	nm := mustParse(t, out).(*OpMsg)
	if nm.Flags != ChecksumPresent || nm.bodyIndex != 1 || len(nm.Sequences) != 2 || !bytes.Equal(nm.Sequences[0].Documents[0], bb) || nm.Header().RequestID != 7 {
		t.Errorf("rebuilt %+v", nm)
	}
	nm = mustParse(t, WithSequences(m, body, nil)).(*OpMsg)
	if len(nm.Sequences) != 0 || !bytes.Equal(nm.Body, body) {
		t.Errorf("without sequences %+v", nm)
	}
}
