package wire

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func withChecksum(b []byte) []byte {
	b = append(b, 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func TestParseMalformed(t *testing.T) {
	body := cmdDoc("insert", "c", "test")
	item := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	good := frameOf(OpCodeMsg, i32(0), bodySection(body))
	badCRC := withChecksum(frameOf(OpCodeMsg, i32(int32(ChecksumPresent)), bodySection(body)))
	badCRC[len(badCRC)-1] ^= 0xff
	longerHeader := bytes.Clone(good)
	binary.LittleEndian.PutUint32(longerHeader, uint32(len(good)+1))
	shorterHeader := bytes.Clone(good)
	binary.LittleEndian.PutUint32(shorterHeader, uint32(len(good)-1))
	negative := bytes.Clone(good)
	binary.LittleEndian.PutUint32(negative, 0xffffffff)
	zero := bytes.Clone(good)
	binary.LittleEndian.PutUint32(zero, 0)
	lyingDoc := bytes.Clone(body)
	binary.LittleEndian.PutUint32(lyingDoc, uint32(len(body)+10))
	noNul := bytes.Clone(body)
	noNul[len(noNul)-1] = 1
	badType := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("x", 1) })
	badType = bytes.Clone(badType)
	badType[4] = 0x42
	badString := doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("x", "abc") })
	badString = bytes.Clone(badString)
	binary.LittleEndian.PutUint32(badString[7:], 1000)
	nested := doc(func(b *bsoncore.DocumentBuilder) { b.AppendDocument("x", item) })
	nested = bytes.Clone(nested)
	binary.LittleEndian.PutUint32(nested[7:], 3) // inner length below 5
	badBool := doc(func(b *bsoncore.DocumentBuilder) { b.AppendBoolean("x", true) })
	badBool = bytes.Clone(badBool)
	badBool[7] = 2

	tests := []struct {
		name     string
		raw      []byte
		sentinel error
		reason   string
	}{
		{"truncated header", good[:15], ErrMalformed, "header needs 16 bytes"},
		{"empty", nil, ErrMalformed, "header needs 16 bytes"},
		{"length longer than data", longerHeader, ErrMalformed, "message has"},
		{"length shorter than data", shorterHeader, ErrMalformed, "message has"},
		{"negative length", negative, ErrMalformed, "negative"},
		{"zero length", zero, ErrMalformed, "below the minimum"},
		{"length below 16", func() []byte { b := bytes.Clone(good); binary.LittleEndian.PutUint32(b, 12); return b }(), ErrMalformed, "below the minimum"},
		{"over message limit", frameOf(OpCodeMsg, i32(0), bodySection(body), make([]byte, 100)), ErrTooLarge, "exceeds the limit"},
		{"unknown required flag", frameOf(OpCodeMsg, i32(1<<3), bodySection(body)), ErrMalformed, "unknown required flag bits 0x0008"},
		{"bad checksum", badCRC, ErrMalformed, "checksum"},
		{"checksum flag without room", frameOf(OpCodeMsg, i32(1), bodySection(body)[:6], []byte{0, 0, 0, 0, 0}), ErrMalformed, "checksum"},
		{"unknown section kind", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{7}), ErrMalformed, "section kind 7 at offset"},
		{"section kind 2", frameOf(OpCodeMsg, i32(0), []byte{2}, body), ErrMalformed, "section kind 2 at offset 20 is unknown"},
		{"two kind-0 sections", frameOf(OpCodeMsg, i32(0), bodySection(body), bodySection(body)), ErrMalformed, "second kind-0 section"},
		{"no kind-0 section", frameOf(OpCodeMsg, i32(0), seqSection("documents", item)), ErrMalformed, "no kind-0 section"},
		{"body lies about its length", frameOf(OpCodeMsg, i32(0), bodySection(lyingDoc)), ErrMalformed, "only"},
		{"body not nul terminated", frameOf(OpCodeMsg, i32(0), bodySection(noNul)), ErrMalformed, "invalid BSON"},
		{"body with unknown type", frameOf(OpCodeMsg, i32(0), bodySection(badType)), ErrMalformed, "unknown BSON type 0x42"},
		{"body with lying string", frameOf(OpCodeMsg, i32(0), bodySection(badString)), ErrMalformed, "string length"},
		{"body with short nested doc", frameOf(OpCodeMsg, i32(0), bodySection(nested)), ErrMalformed, "document length 3"},
		{"body with bool 2", frameOf(OpCodeMsg, i32(0), bodySection(badBool)), ErrMalformed, "boolean"},
		{"body length below 5", frameOf(OpCodeMsg, i32(0), []byte{0, 4, 0, 0, 0, 0}), ErrMalformed, "below the BSON minimum"},
		{"trailing byte after body", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}), ErrMalformed, "document sequence size at offset"},
		{"trailing zero after body", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{0}), ErrMalformed, "second kind-0 section"},
		{"sequence size past end", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}, i32(100), cstr("documents")), ErrMalformed, "kind-1 section at offset"},
		{"sequence size too small", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}, i32(3), cstr("x")), ErrMalformed, "declares 3 bytes"},
		{"sequence identifier unterminated", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}, i32(8), []byte("docs")), ErrMalformed, "not terminated"},
		{"sequence empty identifier", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}, i32(6), []byte{0, 0}), ErrMalformed, "empty identifier"},
		{"sequence document overruns section", frameOf(OpCodeMsg, i32(0), bodySection(body), []byte{1}, i32(int32(4+10+len(item)-1)), cstr("documents"), item), ErrMalformed, "kind-1 section document at offset"},
		{"duplicate sequences", frameOf(OpCodeMsg, i32(0), bodySection(body), seqSection("documents", item), seqSection("documents", item)), ErrMalformed, "duplicate document sequence"},

		{"query truncated name", frameOf(OpCodeQuery, i32(0), []byte("admin.$cmd"), make([]byte, 13)), ErrMalformed, ""},
		{"query trailing bytes", frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), body, item, []byte{9}), ErrMalformed, ""},
		{"query missing doc", frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), []byte{5, 0, 0}), ErrMalformed, "truncated"},
		{"query invalid doc", frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), noNul), ErrMalformed, "invalid BSON"},

		{"reply count mismatch", frameOf(OpCodeReply, i32(0), i64(0), i32(0), i32(2), body), ErrMalformed, "numberReturned is 2 but 1"},
		{"reply negative count", frameOf(OpCodeReply, i32(0), i64(0), i32(0), i32(-1), body), ErrMalformed, "negative"},
		{"reply huge count", frameOf(OpCodeReply, i32(0), i64(0), i32(0), i32(1<<30), body), ErrMalformed, "cannot fit"},
		{"reply truncated doc", frameOf(OpCodeReply, i32(0), i64(0), i32(0), i32(1), body[:len(body)-1]), ErrMalformed, ""},

		{"update trailing", frameOf(OpCodeUpdate, i32(0), cstr("db.c"), i32(0), item, item, []byte{1}), ErrMalformed, "trailing"},
		{"update missing update doc", frameOf(OpCodeUpdate, i32(0), cstr("db.c"), i32(0), item, []byte{0, 0, 0, 0, 0}), ErrMalformed, ""},
		{"insert no documents", frameOf(OpCodeInsert, i32(0), cstr("db.c"), []byte{0, 0, 0, 0, 0}), ErrMalformed, ""},
		{"delete trailing", frameOf(OpCodeDelete, i32(0), cstr("db.c"), i32(0), item, []byte{1}), ErrMalformed, "trailing"},
		{"getmore trailing", frameOf(OpCodeGetMore, i32(0), cstr("db.c"), i32(0), i64(5), []byte{1}), ErrMalformed, "trailing"},
		{"getmore unterminated ns", frameOf(OpCodeGetMore, i32(0), []byte("db.c...........")), ErrMalformed, "not terminated"},
		{"killcursors count mismatch", frameOf(OpCodeKillCursors, i32(0), i32(2), i64(1)), ErrMalformed, "does not match"},
		{"killcursors negative count", frameOf(OpCodeKillCursors, i32(0), i32(-1), i64(1)), ErrMalformed, "does not match"},
		{"killcursors ragged", frameOf(OpCodeKillCursors, i32(0), i32(1), i64(1), []byte{1}), ErrMalformed, "does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := Limits{}
			if tt.sentinel == ErrTooLarge {
				lim.MaxMessageSize = len(tt.raw) - 1
			}
			m, err := Parse(tt.raw, lim)
			wantErr(t, err, tt.sentinel, tt.reason)
			if m != nil {
				t.Fatalf("got message %T with error", m)
			}
		})
	}
}

func TestParseBodyLimits(t *testing.T) {
	big := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("insert", "c").AppendString("$db", "d").AppendBinary("pad", 0, make([]byte, 20000))
	})
	raw := frameOf(OpCodeMsg, i32(0), bodySection(big))
	// The body may exceed maxBsonObjectSize by the 16 KiB command allowance.
	if _, err := Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead}); err != nil {
		t.Fatalf("body within the command allowance refused: %v", err)
	}
	_, err := Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead - 1})
	wantErr(t, err, ErrTooLarge, "over the limit")
	// A sequence document gets the same allowance, as on the server: an
	// upsert statement carries a replacement of up to maxBsonObjectSize
	// plus its q and flags (pymongo's test_upsert_large).
	raw = frameOf(OpCodeMsg, i32(0), bodySection(cmdDoc("insert", "c", "d")), seqSection("documents", big))
	if _, err := Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead}); err != nil {
		t.Fatalf("sequence document within the allowance refused: %v", err)
	}
	_, err = Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead - 1})
	wantErr(t, err, ErrTooLarge, "kind-1 section document")
	// And so does every document of the legacy opcodes.
	raw = frameOf(OpCodeInsert, i32(0), cstr("d.c"), big)
	if _, err := Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead}); err != nil {
		t.Fatalf("OP_INSERT document within the allowance refused: %v", err)
	}
	_, err = Parse(raw, Limits{MaxBSONSize: len(big) - commandOverhead - 1})
	wantErr(t, err, ErrTooLarge, "document")
}

func TestParseOpMsg(t *testing.T) {
	body := cmdDoc("insert", "c", "test")
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	bb := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 2) })
	raw := frameOf(OpCodeMsg, i32(int32(MoreToCome|ExhaustAllowed|1<<20)), seqSection("documents", a, bb), bodySection(body), seqSection("other"))
	m, ok := mustParse(t, raw).(*OpMsg)
	if !ok {
		t.Fatal("not an *OpMsg")
	}
	if m.Flags != MoreToCome|ExhaustAllowed|1<<20 {
		t.Errorf("flags %#x", m.Flags)
	}
	if !bytes.Equal(m.Body, body) {
		t.Errorf("body %v", m.Body)
	}
	if len(m.Sequences) != 2 || m.Sequences[0].Identifier != "documents" || len(m.Sequences[0].Documents) != 2 ||
		!bytes.Equal(m.Sequences[0].Documents[1], bb) || m.Sequences[1].Identifier != "other" || len(m.Sequences[1].Documents) != 0 {
		t.Errorf("sequences %+v", m.Sequences)
	}
	if &m.Raw()[0] != &raw[0] || m.Header().RequestID != 7 || m.Header().OpCode != OpCodeMsg {
		t.Error("header or raw not kept")
	}
	// Parse must not copy: the body is a view into raw.
	if &m.Body[0] != &raw[HeaderSize+4+len(seqSection("documents", a, bb))+1] {
		t.Error("body is a copy, not a view")
	}
	// Appending to a view must not overwrite the bytes that follow it.
	_ = append(m.Sequences[0].Documents[0], 0xEE)
	if !bytes.Equal(m.Sequences[0].Documents[1], bb) {
		t.Error("a view's capacity reaches into the next document")
	}
	// Checksummed message verifies.
	sum := withChecksum(frameOf(OpCodeMsg, i32(int32(ChecksumPresent)), bodySection(body)))
	cm := mustParse(t, sum).(*OpMsg)
	if cm.Checksum != binary.LittleEndian.Uint32(sum[len(sum)-4:]) {
		t.Error("checksum not recorded")
	}
	if f, ok := PeekMsgFlags(raw); !ok || f != m.Flags {
		t.Errorf("PeekMsgFlags = %#x, %v", f, ok)
	}
	if _, ok := PeekMsgFlags(frameOf(OpCodeQuery, i32(0))); ok {
		t.Error("PeekMsgFlags accepted an OP_QUERY")
	}
}

func TestParseLegacy(t *testing.T) {
	sel := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	upd := doc(func(b *bsoncore.DocumentBuilder) { b.AppendDocument("$set", sel) })
	q := cmdDoc("find", "c", "db")
	proj := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("a", 1) })

	qm := mustParse(t, frameOf(OpCodeQuery, i32(4), cstr("db.c"), i32(2), i32(-1), q, proj)).(*OpQuery)
	if qm.Flags != 4 || qm.FullCollectionName != "db.c" || qm.NumberToSkip != 2 || qm.NumberToReturn != -1 ||
		!bytes.Equal(qm.Query, q) || !bytes.Equal(qm.ReturnFieldsSelector, proj) || qm.IsCommand() {
		t.Errorf("OP_QUERY %+v", qm)
	}
	qm = mustParse(t, frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), q)).(*OpQuery)
	if qm.ReturnFieldsSelector != nil || !qm.IsCommand() {
		t.Errorf("OP_QUERY without selector %+v", qm)
	}

	rm := mustParse(t, frameOf(OpCodeReply, i32(8), i64(99), i32(3), i32(2), q, proj)).(*OpReply)
	if rm.Flags != 8 || rm.CursorID != 99 || rm.StartingFrom != 3 || rm.NumberReturned != 2 || len(rm.Documents) != 2 || !bytes.Equal(rm.Documents[1], proj) {
		t.Errorf("OP_REPLY %+v", rm)
	}
	rm = mustParse(t, frameOf(OpCodeReply, i32(0), i64(0), i32(0), i32(0))).(*OpReply)
	if len(rm.Documents) != 0 {
		t.Errorf("empty OP_REPLY %+v", rm)
	}

	um := mustParse(t, frameOf(OpCodeUpdate, i32(0), cstr("db.c"), i32(3), sel, upd)).(*OpUpdate)
	if um.FullCollectionName != "db.c" || um.Flags != 3 || !bytes.Equal(um.Selector, sel) || !bytes.Equal(um.Update, upd) {
		t.Errorf("OP_UPDATE %+v", um)
	}
	im := mustParse(t, frameOf(OpCodeInsert, i32(1), cstr("db.c"), sel, upd)).(*OpInsert)
	if im.Flags != 1 || im.FullCollectionName != "db.c" || len(im.Documents) != 2 || !bytes.Equal(im.Documents[1], upd) {
		t.Errorf("OP_INSERT %+v", im)
	}
	dm := mustParse(t, frameOf(OpCodeDelete, i32(0), cstr("db.c"), i32(1), sel)).(*OpDelete)
	if dm.FullCollectionName != "db.c" || dm.Flags != 1 || !bytes.Equal(dm.Selector, sel) {
		t.Errorf("OP_DELETE %+v", dm)
	}
	gm := mustParse(t, frameOf(OpCodeGetMore, i32(0), cstr("db.c"), i32(10), i64(1234))).(*OpGetMore)
	if gm.FullCollectionName != "db.c" || gm.NumberToReturn != 10 || gm.CursorID != 1234 {
		t.Errorf("OP_GET_MORE %+v", gm)
	}
	km := mustParse(t, frameOf(OpCodeKillCursors, i32(0), i32(2), i64(5), i64(-6))).(*OpKillCursors)
	if len(km.CursorIDs) != 2 || km.CursorIDs[0] != 5 || km.CursorIDs[1] != -6 {
		t.Errorf("OP_KILL_CURSORS %+v", km)
	}
	for _, op := range []OpCode{OpCodeReserved, 1000, 0, -5} {
		raw := frameOf(op, []byte("anything"))
		u, ok := mustParse(t, raw).(*OpUnknown)
		if !ok || u.Header().OpCode != op || !bytes.Equal(u.Raw(), raw) {
			t.Errorf("opcode %v: %T", op, u)
		}
	}
}

func TestOpCodeString(t *testing.T) {
	for op, want := range map[OpCode]string{
		OpCodeMsg: "OP_MSG", OpCodeQuery: "OP_QUERY", OpCodeReply: "OP_REPLY", OpCodeCompressed: "OP_COMPRESSED",
		OpCodeUpdate: "OP_UPDATE", OpCodeInsert: "OP_INSERT", OpCodeDelete: "OP_DELETE", OpCodeGetMore: "OP_GET_MORE",
		OpCodeKillCursors: "OP_KILL_CURSORS", OpCodeReserved: "OP_RESERVED", 42: "OP_UNKNOWN(42)",
	} {
		if got := op.String(); got != want {
			t.Errorf("%d: %q, want %q", op, got, want)
		}
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{MessageLength: 1234, RequestID: -5, ResponseTo: 77, OpCode: OpCodeMsg}
	b := h.Append([]byte{9})
	if len(b) != 17 || b[0] != 9 {
		t.Fatalf("Append wrote %d bytes", len(b))
	}
	got, err := ParseHeader(b[1:])
	if err != nil || got != h {
		t.Fatalf("ParseHeader = %+v, %v", got, err)
	}
	_, err = ParseHeader(b[1:16])
	wantErr(t, err, ErrMalformed, "header needs 16 bytes, have 15")
}
