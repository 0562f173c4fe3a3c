package audittrail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
)

var testKey = NewKey([]byte("0123456789abcdef0123456789abcdef-test"))

// stepClock advances a millisecond per reading: distinct, ordered times
// without sleeping.
func stepClock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Millisecond)
		return t
	}
}

func testOptions(dir string) Options {
	return Options{Dir: dir, Instance: "test-1", Key: testKey, CheckpointEvery: 5,
		CheckpointInterval: time.Hour, SegmentBytes: 4000, Clock: stepClock()}
}

func mustID(t testing.TB, v any) docid.ID {
	t.Helper()
	typ, b, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	id, err := docid.New(bson.RawValue{Type: typ, Value: b})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func decision(t testing.TB, i int) Event {
	return Event{Kind: KindDecision, NS: "shop.orders", IDs: []docid.ID{mustID(t, int32(i))}, Op: "update",
		Mode: "enforce", Verdict: VerdictAllow, App: "billing", User: "app@admin", Client: "10.0.0.1:5000",
		Holder: "ab12cd", Tokens: []int64{int64(i)}, Policy: "p1"}
}

// writeTrail writes n decision records one Commit at a time (so that
// every record is in the file in this order) and closes the trail.
func writeTrail(t *testing.T, dir string, n int) {
	t.Helper()
	tr, err := Open(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := tr.Commit(context.Background(), decision(t, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func verify(t *testing.T, dir string, keys ...Key) *Report {
	t.Helper()
	if keys == nil {
		keys = []Key{testKey}
	}
	rep, err := Verify(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestUntouchedTrailVerifies(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, 40)
	rep := verify(t, dir)
	if !rep.OK() {
		t.Fatalf("untouched trail: %s", rep.Verdict())
	}
	if rep.Segments < 3 {
		t.Fatalf("want several segments (rotation by size), got %d", rep.Segments)
	}
	if rep.Unsigned != 0 {
		t.Fatalf("a closed trail ends with a checkpoint, %d unsigned records", rep.Unsigned)
	}
	// start + 40 decisions + stop, plus the checkpoints.
	var kinds = map[Kind]int{}
	forEachRecord(t, dir, func(r *Record) { kinds[r.Kind]++ })
	if kinds[KindStart] != 1 || kinds[KindStop] != 1 || kinds[KindDecision] != 40 || kinds[KindCheckpoint] < 9 {
		t.Fatalf("records by kind: %v", kinds)
	}
	t.Log(rep.Verdict())
}

func forEachRecord(t *testing.T, dir string, fn func(*Record)) {
	t.Helper()
	names, err := segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		for _, l := range readLines(t, filepath.Join(dir, n)) {
			var r Record
			if err := json.Unmarshal(l, &r); err != nil {
				t.Fatal(err)
			}
			fn(&r)
		}
	}
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(bytes.TrimSuffix(b, []byte{'\n'}), []byte{'\n'})
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	var b []byte
	for _, l := range lines {
		b = append(b, bytes.TrimSuffix(l, []byte{'\n'})...)
		b = append(b, '\n')
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// seg is the path of the i-th segment (negative: from the end).
func seg(t *testing.T, dir string, i int) string {
	t.Helper()
	names, err := segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if i < 0 {
		i += len(names)
	}
	return filepath.Join(dir, names[i])
}

func parse(t *testing.T, line []byte) Record {
	t.Helper()
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func line(t *testing.T, r *Record) []byte {
	t.Helper()
	b, err := marshalLine(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// seqAt is the seq of line i (0-based) of the segment at path.
func seqAt(t *testing.T, path string, i int) uint64 {
	return parse(t, readLines(t, path)[i]).Seq
}

// Every tampering must be caught at the first record it touched.
func TestVerifyNamesTheFirstBadRecord(t *testing.T) {
	type tamper struct {
		name string
		// do tampers with dir and returns the segment, line (1-based)
		// and seq verify must name, and a word its message must have.
		do func(t *testing.T, dir string) (seg string, line int, seq uint64, word string)
	}
	tampers := []tamper{
		{"delete a record", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			want := seqAt(t, p, 2)
			writeLines(t, p, append(ls[:2:2], ls[3:]...))
			return p, 3, want, "missing"
		}},
		{"alter one byte", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			want := seqAt(t, p, 3)
			ls[3] = bytes.Replace(ls[3], []byte(`"billing"`), []byte(`"billinh"`), 1)
			writeLines(t, p, ls)
			return p, 4, want, "altered"
		}},
		{"alter one byte of a number", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			want := seqAt(t, p, 1)
			ls[1] = bytes.Replace(ls[1], []byte(`"tokens":[`), []byte(`"tokens":[9`), 1)
			writeLines(t, p, ls)
			return p, 2, want, "altered"
		}},
		{"swap two records", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			want := seqAt(t, p, 1)
			ls[1], ls[2] = ls[2], ls[1]
			writeLines(t, p, ls)
			return p, 2, want, "missing"
		}},
		{"insert a forged record", func(t *testing.T, dir string) (string, int, uint64, string) {
			// A well-formed record that claims the next seq and links to
			// its predecessor: the original that follows no longer fits.
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			prev := parse(t, ls[1])
			forged := parse(t, ls[2])
			forged.App, forged.Prev = "forger", prev.Hash
			forged.Hash, _ = forged.computeHash(nil)
			want := seqAt(t, p, 3)
			writeLines(t, p, append(ls[:2:2], append([][]byte{line(t, &forged)}, ls[3:]...)...))
			return p, 4, want, "chain"
		}},
		{"insert a forged record and rehash the rest", func(t *testing.T, dir string) (string, int, uint64, string) {
			// Without the key the forger cannot sign: the next checkpoint
			// fails.
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			var out [][]byte
			var prevHash string
			var cpLine int
			var cpSeq uint64
			for i, l := range ls {
				r := parse(t, l)
				if i == 1 {
					r.App = "forger"
				}
				if i > 1 {
					r.Prev = prevHash
				}
				r.Hash, _ = r.computeHash(nil)
				prevHash = r.Hash
				if r.Kind == KindCheckpoint && i > 1 && cpLine == 0 {
					cpLine, cpSeq = i+1, r.Seq
				}
				out = append(out, line(t, &r))
			}
			writeLines(t, p, out)
			return p, cpLine, cpSeq, "signature"
		}},
		{"drop the last segment", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, -1)
			want := seqAt(t, p, 0)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, headFile), 0, want, "truncated"
		}},
		{"drop a middle segment", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			want := seqAt(t, p, 0)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			return seg(t, dir, 1), 0, want, "deleted"
		}},
		{"replace a checkpoint", func(t *testing.T, dir string) (string, int, uint64, string) {
			// Re-signed with a key of the forger's: a key id the
			// verifier does not hold.
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			for i, l := range ls {
				r := parse(t, l)
				if r.Kind != KindCheckpoint {
					continue
				}
				k := NewKey([]byte("forger-forger-forger-forger-forger-1"))
				r.KeyID, r.MAC = k.ID, ""
				r.MAC = k.sign(&r)
				r.Hash, _ = r.computeHash(nil)
				ls[i] = line(t, &r)
				writeLines(t, p, ls)
				return p, i + 1, r.Seq, "not among the keys"
			}
			t.Fatal("no checkpoint in the segment")
			return "", 0, 0, ""
		}},
		{"replace a checkpoint's mac under the same key id", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			ls := readLines(t, p)
			for i, l := range ls {
				r := parse(t, l)
				if r.Kind != KindCheckpoint {
					continue
				}
				r.MAC = strings.Repeat("0", 64)
				r.Hash, _ = r.computeHash(nil)
				ls[i] = line(t, &r)
				writeLines(t, p, ls)
				return p, i + 1, r.Seq, "bad checkpoint signature"
			}
			t.Fatal("no checkpoint in the segment")
			return "", 0, 0, ""
		}},
		{"truncate the last segment to a torn line", func(t *testing.T, dir string) (string, int, uint64, string) {
			// A cut in the middle of the last segment, as a crash would
			// leave: the head shows what is missing.
			p := seg(t, dir, -1)
			b, _ := os.ReadFile(p)
			ls := readLines(t, p)
			keep := len(ls[0]) + len(ls[1]) + 7
			want := seqAt(t, p, 2)
			os.WriteFile(p, b[:keep], 0o600)
			return filepath.Join(dir, headFile), 0, want, "truncated"
		}},
		{"an undeclared torn end of a middle segment", func(t *testing.T, dir string) (string, int, uint64, string) {
			p := seg(t, dir, 1)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, append(b, `{"seq":`...), 0o600)
			next := seg(t, dir, 2)
			return next, 1, seqAt(t, next, 0), "does not declare"
		}},
	}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTrail(t, dir, 40)
			if rep := verify(t, dir); !rep.OK() {
				t.Fatalf("before tampering: %s", rep.Verdict())
			}
			segPath, wantLine, wantSeq, word := tc.do(t, dir)
			rep := verify(t, dir)
			t.Log(rep.Verdict())
			if rep.OK() {
				t.Fatal("the tampered trail verified")
			}
			p := rep.Problem
			if p.Segment != filepath.Base(segPath) || p.Line != wantLine || p.Seq != wantSeq || !strings.Contains(p.What, word) {
				t.Fatalf("verify named %s line %d seq %d (%q); want %s line %d seq %d, with %q",
					p.Segment, p.Line, p.Seq, p.What, filepath.Base(segPath), wantLine, wantSeq, word)
			}
		})
	}
}

func TestVerifyWrongKey(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, 3)
	rep := verify(t, dir, NewKey([]byte("another-key-another-key-another-key")))
	if rep.OK() || rep.Problem.Line != 2 || !strings.Contains(rep.Problem.What, "not among the keys") {
		t.Fatalf("wrong key: %s", rep.Verdict())
	}
	// Unsigned verification still checks the chain and says so.
	rep = verify(t, dir, []Key{}...)
	if !rep.OK() || !strings.Contains(rep.Verdict(), "NOT checked") {
		t.Fatalf("no key: %s", rep.Verdict())
	}
}

// A restart continues the chain in a new segment linked to the last
// complete record, and declares a torn line the crash left.
func TestRestartAfterTornWrite(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, 7)
	last := seg(t, dir, -1)
	b, _ := os.ReadFile(last)
	os.WriteFile(last, append(b, `{"seq":99,"ti`...), 0o600)
	writeTrail(t, dir, 3)
	rep := verify(t, dir)
	if !rep.OK() {
		t.Fatal(rep.Verdict())
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "13 torn bytes") {
		t.Fatalf("notes: %q", rep.Notes)
	}
	if seg(t, dir, -1) == last {
		t.Fatal("the restart did not start a new segment")
	}
}

func TestOneWriterPerDirectory(t *testing.T) {
	dir := t.TempDir()
	tr, err := Open(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := Open(testOptions(dir)); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second writer: %v", err)
	}
}

// A full buffer drops records without blocking, and the trail says how
// many were lost.
func TestDroppedRecordsAreRecorded(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.BufferSize = 4
	o.defaults()
	w, err := openWriter(&o)
	if err != nil {
		t.Fatal(err)
	}
	// The writer goroutine is not running yet: the buffer only fills.
	tr := newTrail(o, w)
	kept := 0
	for i := range 10 {
		if tr.Append(decision(t, i)) {
			kept++
		}
	}
	if kept != 4 {
		t.Fatalf("kept %d of 10 with a buffer of 4", kept)
	}
	go tr.run()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	var decisions int
	forEachRecord(t, dir, func(r *Record) {
		switch r.Kind {
		case KindDropped:
			dropped += r.Count
		case KindDecision:
			decisions++
		}
	})
	if dropped != 6 || decisions != 4 {
		t.Fatalf("dropped records noted %d (want 6), decisions %d (want 4)", dropped, decisions)
	}
	if rep := verify(t, dir); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
}

// Commit returns only once the record is in the file.
func TestCommitIsDurableOnReturn(t *testing.T) {
	dir := t.TempDir()
	tr, err := Open(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ev := decision(t, 77)
	ev.App = "committed-app"
	if err := tr.Commit(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	found := false
	forEachRecord(t, dir, func(r *Record) { found = found || r.App == "committed-app" })
	if !found {
		t.Fatal("Commit returned before its record was in the segment")
	}
}

// When the sink cannot write, Commit fails (the caller refuses the write)
// and nothing of the failed batch enters the chain.
func TestCommitFailsWhenTheSinkFails(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.SegmentBytes = 1 // every batch rotates: the next record needs a new file
	var broken atomic.Bool
	o.createSegment = func(path string) (*os.File, error) {
		if broken.Load() {
			return nil, errors.New("disk on fire")
		}
		return os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	}
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Commit(context.Background(), decision(t, 1)); err != nil {
		t.Fatal(err)
	}
	broken.Store(true)
	err = tr.Commit(context.Background(), decision(t, 2))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Commit with a failing sink: %v", err)
	}
	broken.Store(false)
	if err := tr.Commit(context.Background(), decision(t, 3)); err != nil {
		t.Fatalf("after the sink recovered: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	rep := verify(t, dir)
	if !rep.OK() {
		t.Fatal(rep.Verdict())
	}
	var ids []string
	forEachRecord(t, dir, func(r *Record) {
		if r.Kind == KindDecision {
			ids = append(ids, r.IDs...)
		}
	})
	if fmt.Sprint(ids) != "[1 3]" {
		t.Fatalf("decisions in the trail: %v, want [1 3] (the refused one absent)", ids)
	}
}

func TestQueryHistoryOfOneDocument(t *testing.T) {
	dir := t.TempDir()
	tr, err := Open(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := decision(t, 42)
	b := decision(t, 43)
	c := decision(t, 42)
	c.Verdict, c.Reason, c.Holder = VerdictReject, "held_by_other", "ffff00"
	d := decision(t, 42)
	d.NS = "shop.other"
	for _, ev := range []Event{a, b, c, d} {
		if err := tr.Commit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	tr.Close()
	var got []string
	err = Query(dir, Filter{NS: "shop.orders", ID: "42"}, func(r *Record) error {
		got = append(got, r.Verdict+"/"+r.Holder)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[allow/ab12cd reject/ffff00]" {
		t.Fatalf("history of shop.orders 42: %v", got)
	}
	got = nil
	Query(dir, Filter{Holder: "ffff00"}, func(r *Record) error { got = append(got, r.IDs[0]); return nil })
	if fmt.Sprint(got) != "[42]" {
		t.Fatalf("history of holder ffff00: %v", got)
	}
}

// A trail whose oldest segment was removed by retention verifies with
// VerifyPruned from the first segment present, and not with Verify; a
// pruned trail is still checked from there on.
func TestVerifyPrunedTrail(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, 40)
	os.Remove(seg(t, dir, 0))
	if rep := verify(t, dir); rep.OK() {
		t.Fatal("Verify accepted a trail without its first segment")
	}
	rep, err := VerifyPruned(dir, []Key{testKey})
	if err != nil || !rep.OK() || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "pruned trail: verified from seq") {
		t.Fatalf("VerifyPruned: %v %s %q", err, rep.Verdict(), rep.Notes)
	}
	p := seg(t, dir, 1)
	ls := readLines(t, p)
	writeLines(t, p, append(ls[:1:1], ls[2:]...))
	if rep, _ := VerifyPruned(dir, []Key{testKey}); rep.OK() || rep.Problem.Segment != filepath.Base(p) || rep.Problem.Line != 2 {
		t.Fatalf("VerifyPruned of a pruned trail missing a record: %s", rep.Verdict())
	}
}

// The attack head.json cannot catch, and what does: cutting the trail
// back to an earlier checkpoint and copying that checkpoint into
// head.json verifies; a copy of a later head kept elsewhere shows it.
func TestRolledBackHeadNeedsAShippedHead(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, 40)
	shipped := filepath.Join(t.TempDir(), "head-shipped.json")
	b, err := os.ReadFile(filepath.Join(dir, headFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(shipped, b, 0o600)
	// The attacker drops the last segment and installs the checkpoint
	// that ends the one before as the head.
	last := seg(t, dir, -1)
	os.Remove(last)
	ls := readLines(t, seg(t, dir, -1))
	if parse(t, ls[len(ls)-1]).Kind != KindCheckpoint {
		t.Fatal("a rotated segment does not end with a checkpoint")
	}
	writeLines(t, filepath.Join(dir, headFile), ls[len(ls)-1:])
	if rep := verify(t, dir); !rep.OK() {
		t.Fatalf("the rolled-back trail did not verify on its own (the documented limit changed?): %s", rep.Verdict())
	}
	rep, err := VerifyWith(dir, VerifyOptions{Keys: []Key{testKey}, Heads: []string{shipped}})
	if err != nil || rep.OK() || rep.Problem.Segment != shipped || !strings.Contains(rep.Problem.What, "truncated") {
		t.Fatalf("with the shipped head: %v %s", err, rep.Verdict())
	}
	if rep, _ := VerifyWith(dir, VerifyOptions{Keys: []Key{testKey}, Heads: []string{shipped + ".missing"}}); rep.OK() {
		t.Fatal("a named head copy that does not exist was ignored")
	}
}

// A writer that fell behind writes everything still buffered when the
// trail closes, in order, in batches, and the trail verifies.
func TestCloseDrainsABacklog(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.BufferSize = 3*maxBatch + 7
	o.defaults()
	w, err := openWriter(&o)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrail(o, w)
	for i := range o.BufferSize {
		if !tr.Append(decision(t, i)) {
			t.Fatalf("record %d dropped with room in the buffer", i)
		}
	}
	tr.closeOnce.Do(func() { close(tr.closing) }) // the writer finds the trail closing, its buffer full
	go tr.run()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	next := 0
	forEachRecord(t, dir, func(r *Record) {
		if r.Kind == KindDecision {
			if want := fmt.Sprint(next); len(r.IDs) != 1 || r.IDs[0] != want {
				t.Fatalf("decision %d names %v", next, r.IDs)
			}
			next++
		}
	})
	if next != o.BufferSize {
		t.Fatalf("%d decisions written of %d buffered", next, o.BufferSize)
	}
	if rep := verify(t, dir); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
}

// A writer lingering after a batch takes the next one as soon as gather
// records wait, not when its linger ends (an hour here): a burst fills
// whole batches instead of filling the buffer. The records come out in
// the order they were appended, and the trail verifies.
func TestBacklogCutsTheLingerShort(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(dir)
	o.CheckpointEvery, o.SegmentBytes, o.linger = 1000, 1<<20, time.Hour
	// The first record waits before the writer starts, so that the
	// writer takes it at once, without being nudged (a nudge left over
	// would end the linger below by itself), and then lingers.
	tr, err := open(o)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Append(decision(t, 0)) {
		t.Fatal("the first record was dropped")
	}
	go tr.run()
	defer tr.Close()
	written := func() int {
		n := 0
		names, err := segments(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			n += bytes.Count(b, []byte(`"kind":"decision"`))
		}
		return n
	}
	testkit.Eventually(t, 10*time.Second, "the first record in the file", func() bool { return written() == 1 })
	for i := 1; i <= gather; i++ {
		if !tr.Append(decision(t, i)) {
			t.Fatalf("record %d was dropped", i)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the backlog in the file before the linger ends", func() bool { return written() == gather+1 })
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	forEachRecord(t, dir, func(r *Record) {
		if r.Kind != KindDecision {
			return
		}
		if len(r.Tokens) != 1 || r.Tokens[0] != want {
			t.Fatalf("record %d carries token %v, want %d: out of order", r.Seq, r.Tokens, want)
		}
		want++
	})
	if rep := verify(t, dir); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
}
