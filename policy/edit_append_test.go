package policy

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestCapAppendedAsEncoded: a write whose only edit is the maxTimeMS cap
// has the field appended to its bytes (appendCap) rather than the message
// encoded again; the result is byte for byte the encoding's, and parses
// back to the same command with the cap. A message of another layout (its
// body after a sequence, a checksum) is encoded as before.
func TestCapAppendedAsEncoded(t *testing.T) {
	body := bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "db"}}
	upd := clSeq(t, "updates",
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 8}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 2}}}}}})
	other := clSeq(t, "extra", bson.D{{Key: "x", Value: 1}})
	for _, c := range []struct {
		name     string
		raw      []byte
		appended bool // appendCap takes it
	}{
		{"body and a sequence", clMsgRaw(t, 0, body, upd), true},
		{"body alone", clMsgRaw(t, 0, append(body, bson.E{Key: "updates", Value: bson.A{}})), true},
		{"body and two sequences", clMsgRaw(t, 0, body, upd, other), true},
		{"exhaustAllowed", clMsgRaw(t, 1<<16, body, upd), true},
		{"a checksum", clMsgRaw(t, wire.ChecksumPresent, body, upd), false},
		{"body after the sequence", msgBodyLast(t, 0, upd, body), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := clParse(t, c.raw)
			cmd, err := wire.CommandOf(m)
			if err != nil {
				t.Fatal(err)
			}
			extra := bsoncore.AppendInt64Element(nil, "maxTimeMS", 1500)
			want := wire.AppendWithEdits(nil, m.(*wire.OpMsg), cmd.Body, extra, cmd.Sequences)
			if _, _, ok := appendCap(nil, m.(*wire.OpMsg), cmd.Body, 1500, cmd.Sequences); ok != c.appended {
				t.Fatalf("appended %v, want %v", ok, c.appended)
			}
			for _, buf := range [][]byte{nil, make([]byte, 3, 8), make([]byte, 0, 4096)} {
				got, maxTime, err := EditMessage(m, cmd, Edit{MaxTimeMS: 1500, Buf: buf})
				if err != nil {
					t.Fatal(err)
				}
				if maxTime.Milliseconds() != 1500 {
					t.Fatalf("limit %s", maxTime)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("appended\n%x\nencoded\n%x", got, want)
				}
				// As the upstream reads it: the same command, capped.
				pm, err := wire.Parse(got, wire.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				pc, err := wire.CommandOf(pm)
				if err != nil {
					t.Fatal(err)
				}
				if v, ok := pc.Body.Lookup("maxTimeMS").AsInt64OK(); !ok || v != 1500 {
					t.Fatalf("maxTimeMS %v", pc.Body.Lookup("maxTimeMS"))
				}
				if pm.Header().RequestID != m.Header().RequestID || pm.(*wire.OpMsg).Flags != m.(*wire.OpMsg).Flags ||
					pc.Name != cmd.Name || len(pc.Sequences) != len(cmd.Sequences) {
					t.Fatalf("parsed back as %+v", pc)
				}
				for i, s := range pc.Sequences {
					if s.Identifier != cmd.Sequences[i].Identifier || len(s.Documents) != len(cmd.Sequences[i].Documents) {
						t.Fatalf("sequence %d: %+v", i, s)
					}
					for j, d := range s.Documents {
						if !bytes.Equal(d, cmd.Sequences[i].Documents[j]) {
							t.Fatalf("sequence %d document %d: %s", i, j, d)
						}
					}
				}
			}
		})
	}
}

// TestCapPatchedAsEncoded: where EditMessageAt says the cap lies, the
// sender lowers it in place (wire.NumberAt.Set) just before the bytes
// leave; the result is byte for byte what the encoder yields with that
// value, across layouts (the appended cap, a checksum recomputed, the body
// after a sequence, exhaustAllowed, a pinned statement, OP_QUERY bare and
// wrapped, a client's own larger value replaced) and, where the client's
// own smaller value is kept, in its own type (int32, int64, double), also
// from OP_COMPRESSED (sent uncompressed).
func TestCapPatchedAsEncoded(t *testing.T) {
	body := bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "db"}}
	with := func(d bson.D, kv ...bson.E) bson.D { return append(append(bson.D{}, d...), kv...) }
	upd := clSeq(t, "updates",
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}})
	other := clSeq(t, "extra", bson.D{{Key: "x", Value: 1}})
	query := func(q bson.D) []byte {
		return clFrame(wire.OpCodeQuery, clI32(0), clCStr("db.$cmd"), clI32(0), clI32(-1), clDoc(t, q))
	}
	stmts := bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}}}
	compressed := func(raw []byte) []byte {
		b, err := wire.AppendCompressed(nil, raw, wire.CompressorZlib)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pin := []Pin{{List: "updates", IDs: []bsoncore.Value{{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 7)}}}}
	const capMS, sendMS = 60000, 1234
	for _, c := range []struct {
		name string
		raw  []byte
		pins []Pin
		// own, when set, is the message carrying the client's own value
		// ms: kept, the message as sent is it, with ms lowered.
		own func(ms int64) []byte
	}{
		{name: "body and a sequence", raw: clMsgRaw(t, 0, body, upd)},
		{name: "body alone", raw: clMsgRaw(t, 0, with(body, bson.E{Key: "updates", Value: stmts}))},
		{name: "body and two sequences", raw: clMsgRaw(t, 0, body, upd, other)},
		{name: "exhaustAllowed", raw: clMsgRaw(t, wire.ExhaustAllowed, body, upd)},
		{name: "a checksum", raw: clMsgRaw(t, wire.ChecksumPresent, body, upd)},
		{name: "body after the sequence", raw: msgBodyLast(t, 0, upd, body)},
		{name: "body after the sequence, a checksum", raw: msgBodyLast(t, wire.ChecksumPresent, upd, body)},
		{name: "pinned", raw: clMsgRaw(t, 0, body, upd), pins: pin},
		{name: "pinned, a checksum", raw: clMsgRaw(t, wire.ChecksumPresent, body, upd), pins: pin},
		{name: "OP_QUERY", raw: query(with(body, bson.E{Key: "updates", Value: stmts}))},
		{name: "OP_QUERY in $query", raw: query(bson.D{{Key: "$query", Value: with(body, bson.E{Key: "updates", Value: stmts})}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}}})},
		{name: "a larger value of the client's", raw: clMsgRaw(t, 0, with(body, bson.E{Key: "maxTimeMS", Value: int64(90000)}), upd)},
		{name: "the client's int32", own: func(ms int64) []byte {
			return clMsgRaw(t, 0, with(body, bson.E{Key: "maxTimeMS", Value: int32(ms)}), upd)
		}},
		{name: "the client's int64, a checksum", own: func(ms int64) []byte {
			return clMsgRaw(t, wire.ChecksumPresent, with(body, bson.E{Key: "maxTimeMS", Value: ms}), upd)
		}},
		{name: "the client's double, body last", own: func(ms int64) []byte {
			return msgBodyLast(t, 0, upd, with(body, bson.E{Key: "maxTimeMS", Value: float64(ms)}))
		}},
		{name: "the client's int32 in OP_QUERY", own: func(ms int64) []byte {
			return query(with(body, bson.E{Key: "updates", Value: stmts}, bson.E{Key: "maxTimeMS", Value: int32(ms)}))
		}},
		{name: "the client's int64, compressed", own: func(ms int64) []byte {
			return clMsgRaw(t, 0, with(body, bson.E{Key: "maxTimeMS", Value: ms}), upd)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, plain := c.raw, c.raw
			if c.own != nil {
				raw, plain = c.own(30000), c.own(sendMS)
				if strings.HasSuffix(c.name, "compressed") {
					raw = compressed(raw)
				}
			}
			m := clParse(t, raw)
			cmd, err := wire.CommandOf(m)
			if err != nil {
				t.Fatal(err)
			}
			got, _, at, err := EditMessageAt(m, cmd, Edit{Pins: c.pins, MaxTimeMS: capMS})
			if err != nil {
				t.Fatal(err)
			}
			if !at.Located() {
				t.Fatal("the cap is not located")
			}
			want := plain
			if c.own == nil {
				if want, _, err = EditMessage(m, cmd, Edit{Pins: c.pins, MaxTimeMS: sendMS}); err != nil {
					t.Fatal(err)
				}
			}
			if got == nil {
				got = append([]byte(nil), raw...) // the client's bytes, sent as they are
			}
			was := int64(capMS)
			if c.own != nil {
				was = 30000
			}
			if cur, ok := at.Get(got); !ok || cur != was {
				t.Fatalf("the cap reads %d (%v), want %d", cur, ok, was)
			}
			if !at.Set(got, sendMS) {
				t.Fatalf("the cap at %+v cannot be lowered", at)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("patched\n%x\nencoded\n%x", got, want)
			}
			// As the upstream reads it, the checksum verified.
			pm := clParse(t, got)
			pc, err := wire.CommandOf(pm)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := pc.Body.Lookup("maxTimeMS").AsInt64OK(); !ok || v != sendMS {
				t.Fatalf("maxTimeMS %v", pc.Body.Lookup("maxTimeMS"))
			}
		})
	}
}

// msgBodyLast is an OP_MSG whose sequence comes before its body (the
// encoder never writes one), with a checksum if flags ask for it.
func msgBodyLast(t *testing.T, flags wire.MsgFlags, seq wire.Sequence, body bson.D) []byte {
	b := wire.Header{RequestID: 9, OpCode: wire.OpCodeMsg}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, uint32(flags))
	b = append(b, 1)
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	b = append(b, seq.Identifier+"\x00"...)
	for _, d := range seq.Documents {
		b = append(b, d...)
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at))
	b = append(b, 0)
	b = append(b, clDoc(t, body)...)
	if flags&wire.ChecksumPresent != 0 {
		binary.LittleEndian.PutUint32(b, uint32(len(b)+4))
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// TestCapHeadIsTheElement: the words appendCap stores are the bytes of
// the cap's element before its value, as the BSON encoder writes them.
func TestCapHeadIsTheElement(t *testing.T) {
	want := bsoncore.AppendInt64Element(nil, "maxTimeMS", 0)[:len(capElement)]
	got := binary.LittleEndian.AppendUint64(nil, capHead8)
	got = binary.LittleEndian.AppendUint16(got, capHead2)
	got = append(got, 0)
	if !bytes.Equal(got, want) || capElement != string(want) {
		t.Fatalf("stored %q, element %q, capElement %q", got, want, capElement)
	}
}
