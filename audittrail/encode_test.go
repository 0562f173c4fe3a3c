package audittrail

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// The writer's encoder must produce json.Marshal's bytes: docs/AUDIT.md
// promises it, and a verifier written elsewhere may rely on it.
func TestEncoderMatchesEncodingJSON(t *testing.T) {
	tricky := []string{"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "tab\tnl\ncr\r bs\b ff\f nul\x00 esc\x1b del\x7f",
		"é ü 日本 🙂", "\u2028\u2029", "bad \xff\xfe utf8 \xc3", "ObjectId(\"6555\")", "\"42\""}
	rng := rand.New(rand.NewPCG(1, 2))
	randString := func() string {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		if rng.IntN(3) == 0 {
			return tricky[rng.IntN(len(tricky))] + string(b)
		}
		return string(b)
	}
	pick := func() string {
		if rng.IntN(4) == 0 {
			return ""
		}
		return randString()
	}
	for i := range 5000 {
		r := Record{Seq: rng.Uint64(), Time: pick(), Instance: pick(), Prev: pick(), Kind: Kind(pick()), NS: pick(),
			Op: pick(), Mode: pick(), Verdict: pick(), Reason: pick(), App: pick(), User: pick(), Client: pick(),
			Holder: pick(), Policy: pick(), Detail: pick(), KeyID: pick(), MAC: pick(), Hash: pick()}
		if i < len(tricky) {
			r.App = tricky[i]
		}
		for range rng.IntN(3) {
			r.IDs = append(r.IDs, randString())
			r.Tokens = append(r.Tokens, rng.Int64()-rng.Int64())
		}
		if rng.IntN(2) == 0 {
			r.Count = rng.Uint64()
		}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSON(nil, &r); !bytes.Equal(got, want) {
			t.Fatalf("record %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// docs/AUDIT.md gives a record line whose hash is a test vector for
// verifiers written elsewhere; it must stay right.
func TestDocExampleRecordHash(t *testing.T) {
	doc, err := os.ReadFile("../docs/AUDIT.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- example record -->\n```json\n")
	line, _, ok2 := strings.Cut(rest, "\n```")
	if !ok || !ok2 {
		t.Fatal("docs/AUDIT.md has no example record")
	}
	var r Record
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.computeHash(nil); got != r.Hash {
		t.Fatalf("the example's hash is %s, its content hashes to %s", r.Hash, got)
	}
	if b, _ := marshalLine(nil, &r); string(b) != line+"\n" {
		t.Fatalf("the example is not in the form written:\n%s\n%s", b, line)
	}
}

func TestFormatTime(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 11, 26, 12, 0, 0, 6000000, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", 3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Unix(0, 1764158400123456789).In(time.FixedZone("y", -7200)),
	} {
		if got, want := formatTime(tm), tm.UTC().Format(TimeFormat); got != want {
			t.Errorf("formatTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

// The 8-bytes-at-a-time scan must stop at every byte json.Marshal
// escapes, wherever it sits in a word: each byte value at each place of
// strings long enough for two words and a tail.
func TestAppendStringEveryByteEveryPlace(t *testing.T) {
	for c := range 256 {
		for at := range 19 {
			b := []byte(strings.Repeat("0123456789abcdef", 2)[:19])
			b[at] = byte(c)
			s := string(b)
			want, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			if got := appendString(nil, s); !bytes.Equal(got, want) {
				t.Fatalf("byte %#x at %d: got %s, want %s", c, at, got, want)
			}
		}
	}
}

// The writer copies the strings it knows to be safe without escaping
// them; its lines must still be json.Marshal's, whatever the instance
// name and whatever hash a recovered trail ended with (a tampered file
// may end with anything).
func TestAppendJSONSafe(t *testing.T) {
	hash := strings.Repeat("0123456789abcdef", 4)
	for _, inst := range []string{"host-1", `in"st<&>` + "\x01é"} {
		for _, prev := range []string{hash, `tampered "prev" <x> ` + "\xff\u2028"} {
			w := &writer{opts: &Options{Instance: inst, Key: testKey, CheckpointEvery: 1 << 30}, prev: prev}
			w.prevSafe, w.instanceSafe = isSafe(prev), isSafe(inst)
			var recs []Record
			// The event's strings alternate between safe ones and ones
			// of the same length that need escaping, each made anew or
			// the same string again.
			apps := []string{"billing", strings.Clone("billing"), `bi"ling`, "billing", "bi<l>ng", strings.Clone(`bi"ling`)}
			for i := range 12 {
				ev := decision(t, i)
				ev.Time = time.Date(2026, 11, 27, 2, 0, i, 123, time.UTC)
				ev.App = apps[i%len(apps)]
				ev.User = apps[(i+1)%len(apps)]
				ev.NS, ev.Op, ev.Mode, ev.Verdict, ev.Client, ev.Policy = ev.App, ev.User, ev.App, ev.User, ev.App, ev.User
				if i%3 == 0 {
					ev.Kind = Kind(ev.App)
				}
				r := w.build(&ev)
				if err := w.appendRecord(&r); err != nil {
					t.Fatal(err)
				}
				recs = append(recs, r)
			}
			cp := w.checkpoint(time.Date(2026, 11, 27, 2, 0, 9, 0, time.UTC))
			if err := w.appendRecord(&cp); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, cp)
			var want []byte
			for i := range recs {
				line, err := json.Marshal(&recs[i])
				if err != nil {
					t.Fatal(err)
				}
				want = append(append(want, line...), '\n')
			}
			if !bytes.Equal(w.buf, want) {
				t.Fatalf("instance %q, prev %q:\n got %s\nwant %s", inst, prev, w.buf, want)
			}
		}
	}
	for _, s := range []string{"", "plain", strings.Repeat("a", 17), "2026-11-27T02:00:00.000000123Z"} {
		if !isSafe(s) {
			t.Errorf("isSafe(%q) = false", s)
		}
	}
	for _, s := range []string{`"`, `\`, "<", ">", "&", "\x1f", "\x7f\x80", "é", strings.Repeat("a", 16) + `"`} {
		if isSafe(s) { // é is copied as it is, but isSafe need not know
			t.Errorf("isSafe(%q) = true", s)
		}
	}
}
