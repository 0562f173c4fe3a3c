package wire

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// fuzzLimits keep the fuzzer's allocations small while exercising the
// limit checks.
var fuzzLimits = Limits{MaxMessageSize: 1 << 20, MaxBSONSize: 64 << 10}

func addCaptures(f *testing.F, add func(raw []byte)) {
	for _, c := range loadCaptures(f) {
		add(c.raw)
	}
	body := cmdDoc("update", "items", "app")
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1) })
	add(AppendMsg(nil, 1, 0, ChecksumPresent, body, Sequence{Identifier: "updates", Documents: []bsoncore.Document{a}}))
	for _, c := range compressors {
		raw, _ := AppendCompressed(nil, AppendMsg(nil, 1, 0, 0, body), c)
		add(raw)
	}
	add(frameOf(OpCodeUpdate, i32(0), cstr("db.c"), i32(0), a, a))
	add(frameOf(OpCodeInsert, i32(0), cstr("db.c"), a))
	add(frameOf(OpCodeDelete, i32(0), cstr("db.c"), i32(0), a))
	add(frameOf(OpCodeGetMore, i32(0), cstr("db.c"), i32(0), i64(1)))
	add(frameOf(OpCodeKillCursors, i32(0), i32(1), i64(1)))
}

// checkMessage asserts the properties every successfully parsed message
// must have.
func checkMessage(t *testing.T, raw []byte, m Message) {
	if !bytes.Equal(m.Raw(), raw) || int(m.Header().MessageLength) != len(raw) {
		t.Fatal("Raw is not the input")
	}
	for _, d := range documentsOf(m) {
		if err := validateDocument(d); err != nil {
			t.Fatalf("parsed document invalid: %v", err)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("bsoncore rejects a parsed document: %v", err)
		}
	}
	if om, ok := m.(*OpMsg); ok {
		again, err := WithBody(om, om.Body)
		if err != nil || !bytes.Equal(again, raw) {
			t.Fatalf("OP_MSG does not re-encode to its bytes: %v", err)
		}
		if !bytes.Equal(WithSequences(om, om.Body, om.Sequences), raw) {
			t.Fatal("OP_MSG sections do not re-encode to their bytes")
		}
	}
	cmd, err := CommandOf(m)
	if err != nil || cmd == nil {
		return
	}
	for _, field := range []string{"updates", "deletes", "documents", "ops", "nsInfo"} {
		docs, err := cmd.Documents(field)
		if err == nil {
			for _, d := range docs {
				if validateDocument(d) != nil {
					t.Fatal("statement is invalid BSON")
				}
			}
		}
	}
	if id, ok := cmd.SessionID(); ok && len(id) != 16 {
		t.Fatal("session id not 16 bytes")
	}
	nb, err := WithBody(m, cmd.Body)
	if err != nil {
		t.Fatalf("WithBody: %v", err)
	}
	m2, err := Parse(nb, Limits{MaxMessageSize: 2 << 20, MaxBSONSize: fuzzLimits.MaxBSONSize})
	if err != nil {
		t.Fatalf("WithBody output does not parse: %v", err)
	}
	cmd2, err := CommandOf(m2)
	if err != nil || cmd2 == nil || cmd2.Name != cmd.Name || cmd2.DB != cmd.DB {
		t.Fatalf("WithBody changed the command: %+v -> %+v, %v", cmd, cmd2, err)
	}
	if _, ok := ReplyTo(m, 1, cmd.Body); ok != !cmd.MoreToCome {
		t.Fatalf("ReplyTo ok=%v with moreToCome=%v", ok, cmd.MoreToCome)
	}
}

func documentsOf(m Message) []bsoncore.Document {
	switch m := m.(type) {
	case *OpMsg:
		ds := []bsoncore.Document{m.Body}
		for _, s := range m.Sequences {
			ds = append(ds, s.Documents...)
		}
		return ds
	case *OpQuery:
		if m.ReturnFieldsSelector != nil {
			return []bsoncore.Document{m.Query, m.ReturnFieldsSelector}
		}
		return []bsoncore.Document{m.Query}
	case *OpReply:
		return m.Documents
	case *OpInsert:
		return m.Documents
	case *OpUpdate:
		return []bsoncore.Document{m.Selector, m.Update}
	case *OpDelete:
		return []bsoncore.Document{m.Selector}
	case *OpCompressed:
		return documentsOf(m.Inner)
	}
	return nil
}

func FuzzParse(f *testing.F) {
	addCaptures(f, func(raw []byte) { f.Add(raw) })
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := Parse(raw, fuzzLimits)
		if err != nil {
			if m != nil {
				t.Fatal("message with error")
			}
			return
		}
		checkMessage(t, raw, m)
	})
}

func FuzzReadMessage(f *testing.F) {
	addCaptures(f, func(raw []byte) { f.Add(raw) })
	f.Add(append(AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin")), 1, 2, 3))
	pool := NewBufferPool()
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		consumed := 0
		for {
			m, err := ReadMessage(r, pool, fuzzLimits)
			if err != nil {
				if m != nil {
					t.Fatal("message with error")
				}
				return
			}
			if int(m.Header.MessageLength) != len(m.Bytes) || !bytes.Equal(m.Bytes, stream[consumed:consumed+len(m.Bytes)]) {
				t.Fatal("framed bytes differ from the stream")
			}
			consumed += len(m.Bytes)
			if pm, err := Parse(m.Bytes, fuzzLimits); err == nil {
				checkMessage(t, m.Bytes, pm)
			}
			m.Release()
		}
	})
}

// FuzzParseOpMsg fuzzes the OP_MSG body; when the fuzzed flags ask for a
// checksum, a correct one is appended so that the sections get explored.
func FuzzParseOpMsg(f *testing.F) {
	addCaptures(f, func(raw []byte) {
		if OpCode(binary.LittleEndian.Uint32(raw[12:])) == OpCodeMsg {
			f.Add(raw[HeaderSize:])
		}
	})
	f.Add(frameOf(OpCodeMsg, i32(1), bodySection(cmdDoc("find", "c", "d")))[HeaderSize:])
	f.Fuzz(func(t *testing.T, body []byte) {
		raw := frameOf(OpCodeMsg, body)
		if len(body) >= 4 && body[0]&1 != 0 {
			raw = binary.LittleEndian.AppendUint32(raw, 0)
			binary.LittleEndian.PutUint32(raw, uint32(len(raw)))
			binary.LittleEndian.PutUint32(raw[len(raw)-4:], crc32.Checksum(raw[:len(raw)-4], castagnoli))
		}
		m, err := Parse(raw, fuzzLimits)
		if err != nil {
			return
		}
		if _, ok := m.(*OpMsg); !ok {
			t.Fatalf("%T from an OP_MSG", m)
		}
		checkMessage(t, raw, m)
	})
}

func FuzzParseOpQuery(f *testing.F) {
	addCaptures(f, func(raw []byte) {
		if OpCode(binary.LittleEndian.Uint32(raw[12:])) == OpCodeQuery {
			f.Add(raw[HeaderSize:])
		}
	})
	f.Add(frameOf(OpCodeQuery, i32(0), cstr("a.$cmd"), i32(0), i32(-1), doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendDocument("$query", cmdDoc("find", "c", "a")).AppendDocument("$readPreference", cmdDoc("mode", "primary", "a"))
	}))[HeaderSize:])
	f.Fuzz(func(t *testing.T, body []byte) {
		raw := frameOf(OpCodeQuery, body)
		m, err := Parse(raw, fuzzLimits)
		if err != nil {
			return
		}
		checkMessage(t, raw, m)
	})
}

// FuzzParseOpCompressed fuzzes the inner message and the compressed
// envelope: with compress set the payload is a real compression of inner,
// otherwise inner is taken as the compressed bytes themselves.
func FuzzParseOpCompressed(f *testing.F) {
	addCaptures(f, func(raw []byte) {
		op := int32(binary.LittleEndian.Uint32(raw[12:]))
		if OpCode(op) != OpCodeCompressed {
			for _, c := range compressors {
				f.Add(op, uint8(c), int16(0), true, raw[HeaderSize:])
			}
		}
	})
	f.Add(int32(OpCodeCompressed), uint8(0), int16(0), true, []byte("x"))
	f.Add(int32(OpCodeMsg), uint8(3), int16(-5), false, []byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Fuzz(func(t *testing.T, op int32, c uint8, delta int16, compress bool, inner []byte) {
		payload := inner
		if compress {
			var err error
			if payload, err = Compress(Compressor(c), inner, nil); err != nil {
				return
			}
		}
		raw := frameOf(OpCodeCompressed, i32(op), i32(int32(len(inner))+int32(delta)), []byte{c}, payload)
		m, err := Parse(raw, fuzzLimits)
		if err != nil {
			return
		}
		cm, ok := m.(*OpCompressed)
		if !ok || cm.Inner == nil {
			t.Fatalf("%T from an OP_COMPRESSED", m)
		}
		if _, nested := cm.Inner.(*OpCompressed); nested {
			t.Fatal("nested compression accepted")
		}
		if len(cm.Inner.Raw()) != HeaderSize+int(cm.UncompressedSize) {
			t.Fatal("inner size differs from the declared size")
		}
		if compress && delta == 0 && !bytes.Equal(cm.Inner.Raw()[HeaderSize:], inner) {
			t.Fatal("inner bytes differ from what was compressed")
		}
		checkMessage(t, raw, m)
	})
}

func FuzzCommandOf(f *testing.F) {
	addCaptures(f, func(raw []byte) { f.Add(raw) })
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := Parse(raw, fuzzLimits)
		if err != nil {
			return
		}
		cmd, err := CommandOf(m)
		if err != nil {
			if cmd != nil {
				t.Fatal("command with error")
			}
			return
		}
		if cmd == nil {
			return
		}
		if e, err := cmd.Body.IndexErr(0); err != nil || e.Key() != cmd.Name {
			t.Fatalf("name %q is not the first key", cmd.Name)
		}
		if !cmd.Legacy && cmd.DB == "" {
			t.Fatal("OP_MSG command without $db accepted")
		}
		// The values kept by the walk are the body's first (what
		// enforcement reads is what the server reads).
		for k, key := range bodyKeys {
			want, werr := cmd.Body.LookupErr(key)
			if got, ok := cmd.Kept(BodyKey(k)); ok != (werr == nil) || !got.Equal(want) {
				t.Fatalf("Kept(%s) = %v, %v; the body has %v, %v", key, got, ok, want, werr)
			}
		}
		checkMessage(t, raw, m)
	})
}

func FuzzDecompress(f *testing.F) {
	for _, c := range compressors {
		for _, s := range [][]byte{nil, []byte("hello hello hello"), bytes.Repeat([]byte{0}, 3000)} {
			enc, _ := Compress(c, s, nil)
			f.Add(uint8(c), enc, uint32(len(s)))
		}
	}
	f.Fuzz(func(t *testing.T, c uint8, src []byte, size uint32) {
		size %= 1 << 20
		out, err := Decompress(Compressor(c), src, int(size))
		if err == nil && len(out) != int(size) {
			t.Fatalf("decompressed %d bytes, declared %d", len(out), size)
		}
		if err == nil && cap(out) > int(size)+1 {
			t.Fatalf("capacity %d for %d bytes", cap(out), size)
		}
		// Whatever src is, compressing it must round trip.
		enc, err := Compress(Compressor(c), src, nil)
		if err != nil {
			if Compressor(c) <= CompressorZstd {
				t.Fatal(err)
			}
			return
		}
		back, err := Decompress(Compressor(c), enc, len(src))
		if err != nil || !bytes.Equal(back, src) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
