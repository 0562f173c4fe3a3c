package policy

import (
	"bytes"
	"math/rand"
	"testing"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// editAllocs is how many allocations edit makes on a pinned update sent as
// the Go driver sends it (the statement in a kind-1 section).
func editAllocs(t *testing.T, edit func(wire.Message, *wire.Command, Edit) []byte, e Edit) float64 {
	t.Helper()
	m := clParse(t, clMsgRaw(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "db"}},
		clSeq(t, "updates", bson.D{{Key: "q", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}}})))
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if edit(m, cmd, e) == nil {
		t.Fatal("nothing edited")
	}
	return testing.AllocsPerRun(50, func() { edit(m, cmd, e) })
}

// TestEditEncodesOnce: the maxTimeMS cap rides along with the statement
// edits. Capping a pinned write costs no allocation beyond pinning it,
// where encoding the message a second time (or parsing the first result
// again) would cost at least one; capping alone costs the one buffer of
// the new message.
func TestEditEncodesOnce(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are counted without the race detector")
	}
	one := func(m wire.Message, cmd *wire.Command, e Edit) []byte {
		b, _, err := EditMessage(m, cmd, e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	checkEncodesOnce(t, one)
}

func checkEncodesOnce(t *testing.T, edit func(wire.Message, *wire.Command, Edit) []byte) {
	t.Helper()
	typ, data, _ := bson.MarshalValue(int32(7))
	pins := []Pin{{List: "updates", IDs: []bsoncore.Value{{Type: typ, Data: data}}}}
	pinned := editAllocs(t, edit, Edit{Pins: pins})
	both := editAllocs(t, edit, Edit{Pins: pins, MaxTimeMS: 500})
	if both != pinned {
		t.Errorf("pinning and capping: %v allocations, pinning alone %v: the message was encoded more than once", both, pinned)
	}
	if capped := editAllocs(t, edit, Edit{MaxTimeMS: 500}); capped != 1 {
		t.Errorf("capping alone: %v allocations, want the one of the message", capped)
	}
}

// clPin pins as the engine does, through the one editor.
func clPin(m wire.Message, cmd *wire.Command, pins []Pin) ([]byte, error) {
	b, _, err := EditMessage(m, cmd, Edit{Pins: pins})
	return b, err
}

// clFence pins and fences as the engine does, through the one editor.
func clFence(m wire.Message, cmd *wire.Command, pins []Pin, fences []Fence) ([]byte, error) {
	b, _, err := EditMessage(m, cmd, Edit{Pins: pins, Fences: fences})
	return b, err
}

// twoPasses edits as the proxy did before EditMessage: the statements
// first, then the cap over the re-parsed result.
func twoPasses(t *testing.T, msg wire.Message, cmd *wire.Command, e Edit) ([]byte, time.Duration, error) {
	b, _, err := EditMessage(msg, cmd, Edit{Pins: e.Pins, Fences: e.Fences})
	if err != nil || e.MaxTimeMS <= 0 {
		return b, 0, err
	}
	if b != nil {
		msg, cmd = clParse(t, b), nil
	}
	c, capped, err := EditMessage(msg, cmd, Edit{MaxTimeMS: e.MaxTimeMS})
	if err != nil || c == nil {
		return b, capped, err
	}
	return c, capped, nil
}

// FuzzEditOnePass: on generated write commands, editing in one pass gives
// the bytes and the limit of editing the statements and capping the
// result, the path before EditMessage (whose old two-step engines were
// compared to it the same way before they were removed), and refuses the
// same inputs. TestEditOnePass runs it over a fixed range of seeds.
func FuzzEditOnePass(f *testing.F) {
	for _, s := range []int64{1, 2, 3, 42, 1000} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed int64) { checkOnePass(t, seed, 2) })
}

func TestEditOnePass(t *testing.T) {
	for seed := int64(0); seed < 300; seed++ {
		checkOnePass(t, seed, 5)
	}
}

func checkOnePass(t *testing.T, seed int64, cases int) {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	for range cases {
		c := genEditCase(t, r, true)
		m := clParse(t, c.raw)
		cmd, err := wire.CommandOf(m)
		if err != nil || cmd == nil {
			t.Fatalf("CommandOf: %v", err)
		}
		old, oldLimit, oldErr := twoPasses(t, m, cmd, c.edit)
		got, limit, err := EditMessage(m, cmd, c.edit)
		if (oldErr == nil) != (err == nil) {
			t.Fatalf("seed %d: two passes: error %v, one pass: error %v", seed, oldErr, err)
		}
		if err != nil {
			continue
		}
		if limit != oldLimit {
			t.Fatalf("seed %d: limit %v, two passes %v", seed, limit, oldLimit)
		}
		if !bytes.Equal(old, got) {
			t.Fatalf("seed %d: edit %+v\n two passes %x\n one pass   %x", seed, c.edit, old, got)
		}
	}
}

// BenchmarkEditPinnedCapped: a pinned update capped by its lease, edited
// in one pass against the statements first and the cap over the re-parsed
// result (the path before EditMessage); compare the legs of one run.
//
//	go test ./policy -run '^$' -bench EditPinnedCapped -benchmem
func BenchmarkEditPinnedCapped(b *testing.B) {
	m := clParse(b, clMsgRaw(b, 0, bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "db"}},
		clSeq(b, "updates", bson.D{{Key: "q", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}}})))
	cmd, err := wire.CommandOf(m)
	if err != nil {
		b.Fatal(err)
	}
	typ, data, _ := bson.MarshalValue(int32(7))
	e := Edit{Pins: []Pin{{List: "updates", IDs: []bsoncore.Value{{Type: typ, Data: data}}}}, MaxTimeMS: 500}
	b.Run("one-pass", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, _, err := EditMessage(m, cmd, e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two-passes", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			pinned, _, err := EditMessage(m, cmd, Edit{Pins: e.Pins})
			if err != nil {
				b.Fatal(err)
			}
			pm, err := wire.Parse(pinned, wire.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := EditMessage(pm, nil, Edit{MaxTimeMS: e.MaxTimeMS}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEditCap is the usual enforced write's only edit: the maxTimeMS
// cap appended to an update that has none, into the connection's buffer,
// reused from one write to the next as the guard reuses it.
//
//	go test ./policy -run '^$' -bench EditCap -benchmem
func BenchmarkEditCap(b *testing.B) {
	m := clParse(b, clMsgRaw(b, 0, bson.D{{Key: "update", Value: "c"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "db"}},
		clSeq(b, "updates", bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: "doc-17"}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}}})))
	cmd, err := wire.CommandOf(m)
	if err != nil {
		b.Fatal(err)
	}
	e := Edit{MaxTimeMS: 500}
	b.ReportAllocs()
	for b.Loop() {
		out, _, at, err := e.MessageAt(m, cmd)
		if err != nil || !at.Located() {
			b.Fatal(err)
		}
		e.Buf = out
	}
}
