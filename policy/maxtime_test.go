package policy

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// TestCapMaxTimeKeepsTheMessage: the rewrite carries maxTimeMS and is,
// apart from it, the same message: ids, flags, sections in their order,
// checksum recomputed; a smaller client value is kept, a larger one
// lowered.
func TestCapMaxTimeKeepsTheMessage(t *testing.T) {
	stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).Build()
	seq := wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt, stmt}}
	body := func(extra ...int64) bsoncore.Document {
		b := bsoncore.NewDocumentBuilder().AppendString("update", "orders").AppendString("$db", "shop")
		for _, ms := range extra {
			b.AppendInt64("maxTimeMS", ms)
		}
		return b.Build()
	}
	for _, tc := range []struct {
		name  string
		raw   []byte
		want  int64
		same  bool // sent unchanged
		wantB bsoncore.Document
	}{
		{"added", wire.AppendMsg(nil, 7, 0, 0, body(), seq), 500, false, body(500)},
		{"added, checksum", wire.AppendMsg(nil, 7, 0, wire.ChecksumPresent, body(), seq), 500, false, body(500)},
		{"added, no sequence", wire.AppendMsg(nil, 7, 0, 0, body()), 500, false, body(500)},
		{"kept", wire.AppendMsg(nil, 7, 0, 0, body(100), seq), 100, true, nil},
		{"lowered", wire.AppendMsg(nil, 7, 0, 0, body(900), seq), 500, false, body(500)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, capped, err := EditMessage(clParse(t, tc.raw), nil, Edit{MaxTimeMS: 500})
			if err != nil {
				t.Fatal(err)
			}
			if capped.Milliseconds() != tc.want {
				t.Errorf("runs under %v, want %d ms", capped, tc.want)
			}
			if tc.same {
				if b != nil {
					t.Errorf("rewritten, want sent unchanged")
				}
				return
			}
			msg, err := wire.Parse(b, wire.Limits{})
			if err != nil {
				t.Fatalf("rewrite does not parse: %v", err)
			}
			orig, _ := wire.Parse(tc.raw, wire.Limits{})
			m, o := msg.(*wire.OpMsg), orig.(*wire.OpMsg)
			if !bytes.Equal(m.Body, tc.wantB) {
				t.Errorf("body %v, want %v", m.Body, tc.wantB)
			}
			if m.Header().RequestID != 7 || m.Flags != o.Flags || len(m.Sequences) != len(o.Sequences) {
				t.Errorf("header or sections changed: %+v", m)
			}
			if !bytes.Equal(wire.WithSequences(m, o.Body, m.Sequences), tc.raw) {
				t.Errorf("apart from the body, the message changed")
			}
		})
	}
}

// A client's maxTimeMS that is a double with a fraction bounds nothing
// lockgate can count on: MongoDB refuses it, and a server that takes it
// may round it up (5.5 runs 6 ms under a cap of 5) or down to 0, no limit
// at all. It is replaced by the cap, never kept, however it compares;
// a whole double is the client's own, smaller value, and kept.
func TestFractionalMaxTimeIsReplaced(t *testing.T) {
	const capMS = 5
	stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).Build()
	seq := wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}
	for _, tc := range []struct {
		own  float64
		kept bool
	}{{5.5, false}, {0.5, false}, {4.25, false}, {4, true}, {5, true}} {
		raw := wire.AppendMsg(nil, 7, 0, 0, bsoncore.NewDocumentBuilder().AppendString("update", "orders").
			AppendDouble("maxTimeMS", tc.own).AppendString("$db", "shop").Build(), seq)
		b, capped, at, err := EditMessageAt(clParse(t, raw), nil, Edit{MaxTimeMS: capMS})
		if err != nil {
			t.Fatal(err)
		}
		sent := raw
		if b != nil {
			sent = b
		}
		m, err := wire.Parse(sent, wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		v := m.(*wire.OpMsg).Body.Lookup("maxTimeMS")
		f, isDouble := v.DoubleOK()
		switch {
		case tc.kept && (b != nil || !isDouble || f != tc.own):
			t.Errorf("maxTimeMS %v: sent %v, want the client's own kept", tc.own, v)
		case !tc.kept && (isDouble || v.AsInt64() != capMS):
			t.Errorf("maxTimeMS %v: sent %v, want the cap, %d", tc.own, v, capMS)
		case capped > capMS*time.Millisecond:
			t.Errorf("maxTimeMS %v: counted as %v, more than the cap", tc.own, capped)
		}
		if got, ok := at.Get(sent); !ok || got > capMS {
			t.Errorf("maxTimeMS %v: the value to patch at send reads %d, %v", tc.own, got, ok)
		}
	}
}
