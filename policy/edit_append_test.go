package policy

import (
	"bytes"
	"encoding/binary"
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
	// bodyLast is an OP_MSG whose sequence comes before its body.
	bodyLast := func() []byte {
		b := wire.Header{RequestID: 9, OpCode: wire.OpCodeMsg}.Append(nil)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = append(b, 1)
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		b = append(b, "updates\x00"...)
		for _, d := range upd.Documents {
			b = append(b, d...)
		}
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at))
		b = append(b, 0)
		b = append(b, clDoc(t, body)...)
		binary.LittleEndian.PutUint32(b, uint32(len(b)))
		return b
	}
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
		{"body after the sequence", bodyLast(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := clParse(t, c.raw)
			cmd, err := wire.CommandOf(m)
			if err != nil {
				t.Fatal(err)
			}
			extra := bsoncore.AppendInt64Element(nil, "maxTimeMS", 1500)
			want := wire.AppendWithEdits(nil, m.(*wire.OpMsg), cmd.Body, extra, cmd.Sequences)
			if _, ok := appendCap(nil, m.(*wire.OpMsg), cmd.Body, extra, cmd.Sequences); ok != c.appended {
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
