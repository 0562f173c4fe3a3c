package audittrail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/testserver/embedded"
)

// ferretURI is the embedded FerretDB v1.24 (SQLite) that the collection
// sink's tests write to.
var ferretURI string

func TestMain(m *testing.M) {
	opts := embedded.Options{}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "lockgate-audittrail-"); err == nil {
			opts.Dir = d
			defer os.RemoveAll(d)
		}
	}
	srv, err := embedded.Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "embedded upstream:", err)
		os.Exit(1)
	}
	ferretURI = srv.URI()
	code := m.Run()
	srv.Close()
	if opts.Dir != "" {
		os.RemoveAll(opts.Dir)
	}
	os.Exit(code)
}

var collSeq atomic.Int64

// testColl is a new, empty trail collection of the test's own.
func testColl(t testing.TB) *mongo.Collection {
	t.Helper()
	ctx := context.Background()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(ferretURI))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c.Database("audit").Collection(fmt.Sprintf("trail_%d", collSeq.Add(1)))
}

func collOptions(coll *mongo.Collection) Options {
	o := testOptions("")
	o.Collection = coll
	return o
}

// writeCollTrail writes n decision records, each committed, and closes
// the trail.
func writeCollTrail(t *testing.T, o Options, n int) {
	t.Helper()
	tr, err := Open(o)
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

func verifyColl(t *testing.T, coll *mongo.Collection, keys ...Key) *Report {
	t.Helper()
	if keys == nil {
		keys = []Key{testKey}
	}
	rep, err := VerifyCollection(context.Background(), coll, "test-1", VerifyOptions{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// docAt is the stored document of seq.
func docAt(t *testing.T, coll *mongo.Collection, seq uint64) bson.Raw {
	t.Helper()
	raw, err := coll.FindOne(context.Background(), bson.D{{"instance", "test-1"}, {"seq", int64(seq)}}).Raw()
	if err != nil {
		t.Fatalf("seq %d: %v", seq, err)
	}
	return raw
}

func TestCollectionTrailVerifies(t *testing.T) {
	coll := testColl(t)
	writeCollTrail(t, collOptions(coll), 23)
	rep := verifyColl(t, coll)
	if !rep.OK() || rep.Unsigned != 0 || rep.Records < 23+2+4 {
		t.Fatalf("untouched collection trail: %s %q", rep.Verdict(), rep.Notes)
	}
	if len(rep.Notes) != 0 {
		t.Fatalf("notes on an untouched trail: %q", rep.Notes)
	}
	inst, err := Instances(context.Background(), coll)
	if err != nil || fmt.Sprint(inst) != "[test-1]" {
		t.Fatalf("instances: %v %v", inst, err)
	}
	t.Log(rep.Verdict())
}

// TestCollectionVerifyNamesTheFirstBadRecord tampers with a closed
// collection trail as someone with write access to the collection could;
// verify names the document and the seq where the trail stops being
// what was written.
func TestCollectionVerifyNamesTheFirstBadRecord(t *testing.T) {
	ctx := context.Background()
	set := func(t *testing.T, coll *mongo.Collection, seq uint64, upd bson.D) {
		t.Helper()
		res, err := coll.UpdateOne(ctx, bson.D{{"instance", "test-1"}, {"seq", int64(seq)}}, upd)
		if err != nil || res.ModifiedCount != 1 {
			t.Fatalf("update of seq %d: %v %+v", seq, err, res)
		}
	}
	tampers := []struct {
		name string
		// do returns the seq verify must name and a word of its message.
		do func(t *testing.T, coll *mongo.Collection) (uint64, string)
	}{
		{"delete a record", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			if _, err := coll.DeleteOne(ctx, bson.D{{"instance", "test-1"}, {"seq", int64(7)}}); err != nil {
				t.Fatal(err)
			}
			return 7, "missing"
		}},
		{"alter one byte of a field", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			set(t, coll, 9, bson.D{{"$set", bson.D{{"app", "billinh"}}}})
			return 9, "altered"
		}},
		{"alter a token", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			set(t, coll, 4, bson.D{{"$set", bson.D{{"tokens", bson.A{int64(9)}}}}})
			return 4, "altered"
		}},
		{"swap two records' seqs", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			// Through a free seq, as the unique index wants.
			set(t, coll, 5, bson.D{{"$set", bson.D{{"seq", int64(1000)}}}})
			set(t, coll, 6, bson.D{{"$set", bson.D{{"seq", int64(5)}}}})
			set(t, coll, 1000, bson.D{{"$set", bson.D{{"seq", int64(6)}}}})
			return 5, "altered"
		}},
		{"insert a forged record past the index", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			// The unique index refuses a second seq 8 ...
			forged, err := decodeDoc(docAt(t, coll, 8))
			if err != nil {
				t.Fatal(err)
			}
			forged.App = "forger"
			forged.Hash, _ = forged.computeHash(nil)
			if _, err := coll.InsertOne(ctx, bson.Raw(appendDoc(nil, &forged))); !mongo.IsDuplicateKeyError(err) {
				t.Fatalf("a forged record with an existing seq: %v, want a duplicate key error", err)
			}
			// ... so the forger drops it first.
			if _, err := coll.Indexes().DropOne(ctx, IndexName); err != nil {
				t.Fatal(err)
			}
			if _, err := coll.InsertOne(ctx, bson.Raw(appendDoc(nil, &forged))); err != nil {
				t.Fatal(err)
			}
			return 9, "again"
		}},
		{"delete the tail with its checkpoints", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			if _, err := coll.DeleteMany(ctx, bson.D{{"instance", "test-1"}, {"seq", bson.D{{"$gt", int64(12)}}}}); err != nil {
				t.Fatal(err)
			}
			return 13, "truncated"
		}},
		{"replace a checkpoint", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			cp, err := decodeDoc(docAt(t, coll, 8))
			if err != nil || cp.Kind != KindCheckpoint {
				t.Fatalf("seq 8 is not a checkpoint: %+v %v", cp, err)
			}
			other := NewKey([]byte("another-key-another-key-another-key!"))
			cp.MAC = other.sign(&cp) // under the right key id
			cp.Hash, _ = cp.computeHash(nil)
			set(t, coll, 8, bson.D{{"$set", bson.D{{"mac", cp.MAC}, {"hash", cp.Hash}}}})
			return 8, "signature"
		}},
		{"a field of the wrong type", func(t *testing.T, coll *mongo.Collection) (uint64, string) {
			set(t, coll, 3, bson.D{{"$set", bson.D{{"count", "1"}}}})
			return 3, "not a record"
		}},
	}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			coll := testColl(t)
			o := collOptions(coll)
			writeCollTrail(t, o, 20) // checkpoints at seq 2, 8, 14, 20, 26 and 28
			if rep := verifyColl(t, coll); !rep.OK() {
				t.Fatalf("before tampering: %s", rep.Verdict())
			}
			seq, word := tc.do(t, coll)
			rep := verifyColl(t, coll)
			if rep.OK() {
				t.Fatalf("tampered trail verifies: %s", rep.Verdict())
			}
			if rep.Problem.Seq != seq || !strings.Contains(rep.Verdict(), word) || !strings.Contains(rep.Problem.Segment, coll.Name()) {
				t.Fatalf("verdict %q: want seq %d and %q", rep.Verdict(), seq, word)
			}
			t.Log(rep.Verdict())
		})
	}
}

// TestCollectionUnsignedTailIsTheWindow: records after the last
// checkpoint can be removed without verify noticing (the documented
// window); removing them with the checkpoint before them cannot.
func TestCollectionUnsignedTailIsTheWindow(t *testing.T) {
	ctx := context.Background()
	coll := testColl(t)
	o := collOptions(coll)
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for i := range 12 { // start, checkpoint, then checkpoints at 8 and 14; 15 and 16 unsigned
		if err := tr.Commit(ctx, decision(t, i)); err != nil {
			t.Fatal(err)
		}
	}
	rep := verifyColl(t, coll)
	if !rep.OK() || rep.LastCheckpoint != 14 || rep.Unsigned != 2 {
		t.Fatalf("open trail: %s", rep.Verdict())
	}
	if _, err := coll.DeleteMany(ctx, bson.D{{"seq", bson.D{{"$gt", int64(14)}}}}); err != nil {
		t.Fatal(err)
	}
	if rep := verifyColl(t, coll); !rep.OK() || rep.Unsigned != 0 {
		t.Fatalf("the unsigned tail removed: %s (it is the window before a checkpoint)", rep.Verdict())
	}
	if _, err := coll.DeleteMany(ctx, bson.D{{"seq", bson.D{{"$gt", int64(12)}}}}); err != nil {
		t.Fatal(err)
	}
	if rep := verifyColl(t, coll); rep.OK() || rep.Problem.Seq != 13 || !strings.Contains(rep.Verdict(), "truncated") {
		t.Fatalf("the tail with its checkpoint removed: %s", rep.Verdict())
	}
}

// TestCollectionRestartContinuesTheChain: a trail reopened on its
// collection continues the chain, and a previous run that did not stop
// cleanly is declared by the start record.
func TestCollectionRestartContinuesTheChain(t *testing.T) {
	ctx := context.Background()
	coll := testColl(t)
	o := collOptions(coll)
	writeCollTrail(t, o, 7)
	// A crashed run: its stop record and last checkpoint never came
	// (start 1, checkpoints 2 and 8, stop 11, checkpoint 12).
	if _, err := coll.DeleteMany(ctx, bson.D{{"seq", bson.D{{"$gt", int64(10)}}}}); err != nil {
		t.Fatal(err)
	}
	coll.Database().Collection(coll.Name()+HeadSuffix).DeleteMany(ctx, bson.D{})
	writeCollTrail(t, o, 3)
	rep := verifyColl(t, coll)
	if !rep.OK() || rep.Unsigned != 0 {
		t.Fatalf("after the restart: %s %q", rep.Verdict(), rep.Notes)
	}
	var starts []string
	readColl(ctx, coll, bson.D{{"kind", "start"}}, func(r *Record) error { starts = append(starts, r.Detail); return nil })
	if len(starts) != 2 || !strings.Contains(starts[1], "ended after seq 10 without a stop record") {
		t.Fatalf("start records: %q", starts)
	}
}

// TestBothSinks: every record goes to the files and to the collection, in
// one chain; a collection that missed the end of the chain (a crash
// between the two writes of a batch) gets it at the next start, and a
// collection added to a file trail starts where the files are.
func TestBothSinks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	coll := testColl(t)
	o := testOptions(dir)
	o.Collection = coll
	writeCollTrail(t, o, 12)
	if rep := verify(t, dir); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
	if rep := verifyColl(t, coll); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
	// The collection loses its last records (and its head) ...
	coll.DeleteMany(ctx, bson.D{{"seq", bson.D{{"$gt", int64(9)}}}})
	coll.Database().Collection(coll.Name()+HeadSuffix).DeleteMany(ctx, bson.D{})
	// ... and gets them back from the files at the next start.
	o.Clock = stepClock()
	writeCollTrail(t, o, 2)
	fileRep, collRep := verify(t, dir), verifyColl(t, coll)
	if !fileRep.OK() || !collRep.OK() || fileRep.Records != collRep.Records {
		t.Fatalf("after levelling: files %s, collection %s", fileRep.Verdict(), collRep.Verdict())
	}
	// One chain: the same records in both.
	var fileHashes, collHashes []string
	forEachRecord(t, dir, func(r *Record) { fileHashes = append(fileHashes, r.Hash) })
	readColl(ctx, coll, bson.D{}, func(r *Record) error { collHashes = append(collHashes, r.Hash); return nil })
	if strings.Join(fileHashes, ",") != strings.Join(collHashes, ",") {
		t.Fatalf("the collection's chain differs from the files':\n%v\n%v", collHashes, fileHashes)
	}
	// A new collection beside an existing file trail.
	coll2 := testColl(t)
	o.Collection, o.Clock = coll2, stepClock()
	writeCollTrail(t, o, 2)
	if rep := verify(t, dir); !rep.OK() {
		t.Fatal(rep.Verdict())
	}
	rep, err := VerifyCollection(ctx, coll2, "test-1", VerifyOptions{Keys: []Key{testKey}, Pruned: true})
	if err != nil || !rep.OK() {
		t.Fatalf("the new collection, pruned: %v %s", err, rep.Verdict())
	}
	if rep, _ := VerifyCollection(ctx, coll2, "test-1", VerifyOptions{Keys: []Key{testKey}}); rep.OK() {
		t.Fatalf("the new collection verifies as a whole trail: %s", rep.Verdict())
	}
}

func TestQueryCollection(t *testing.T) {
	ctx := context.Background()
	coll := testColl(t)
	tr, err := Open(collOptions(coll))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		ev := decision(t, i%2)
		if i == 3 {
			ev.Holder = "ffff00"
		}
		if err := tr.Commit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	tr.Close()
	var got []string
	err = QueryCollection(ctx, coll, "", Filter{NS: "shop.orders", ID: "1"}, func(r *Record) error {
		got = append(got, fmt.Sprintf("%d %s", r.Seq, r.Holder))
		return nil
	})
	if err != nil || fmt.Sprint(got) != "[4 ab12cd 6 ffff00]" {
		t.Fatalf("history of shop.orders 1: %v %v", got, err)
	}
	got = nil
	QueryCollection(ctx, coll, "test-1", Filter{Holder: "ffff00"}, func(r *Record) error { got = append(got, r.IDs[0]); return nil })
	if fmt.Sprint(got) != "[1]" {
		t.Fatalf("history of holder ffff00: %v", got)
	}
}

// TestCollectionFailureCutsTheBatch: a batch the collection refuses (here
// a document already holding the next seq: a duplicate key) fails as a
// failed file write does: Commit fails, none of its records enters the
// chain, the segment is cut back, and what an ordered insertMany left
// is removed before the next insert. The trail then goes on, in both
// sinks alike, and records the loss.
func TestCollectionFailureCutsTheBatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	coll := testColl(t)
	o := testOptions(dir)
	o.Collection = coll
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := tr.Commit(ctx, decision(t, i)); err != nil {
			t.Fatal(err)
		}
	}
	var last uint64
	readColl(ctx, coll, bson.D{}, func(r *Record) error { last = r.Seq; return nil })
	blocker := Record{Seq: last + 1, Instance: "test-1", Kind: KindDecision, Hash: "x"}
	if _, err := coll.InsertOne(ctx, bson.Raw(appendDoc(nil, &blocker))); err != nil {
		t.Fatal(err)
	}
	if err := tr.Commit(ctx, decision(t, 3)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("commit into a collection that refuses the batch: %v", err)
	}
	if err := tr.Commit(ctx, decision(t, 4)); err != nil {
		t.Fatalf("the next commit: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	fileRep, collRep := verify(t, dir), verifyColl(t, coll)
	if !fileRep.OK() || !collRep.OK() || fileRep.Records != collRep.Records {
		t.Fatalf("after a refused batch: files %s, collection %s", fileRep.Verdict(), collRep.Verdict())
	}
	var ids []string
	readColl(ctx, coll, bson.D{{"kind", "decision"}}, func(r *Record) error { ids = append(ids, r.IDs[0]); return nil })
	if fmt.Sprint(ids) != "[0 1 2 4]" {
		t.Fatalf("decisions stored: %v, want the refused one's absent", ids)
	}
}

// TestCollectionShippedHead: a copy of the head document kept elsewhere
// (as mongoexport writes it) is a -head for the collection: a trail cut
// back to an earlier checkpoint, its head document rolled back with it,
// verifies without the copy and fails with it.
func TestCollectionShippedHead(t *testing.T) {
	ctx := context.Background()
	coll := testColl(t)
	heads := coll.Database().Collection(coll.Name() + HeadSuffix)
	writeCollTrail(t, collOptions(coll), 10)
	raw, err := heads.FindOne(ctx, bson.D{{"_id", "test-1"}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	ext, err := bson.MarshalExtJSON(raw, false, false)
	if err != nil {
		t.Fatal(err)
	}
	shipped := filepath.Join(t.TempDir(), "head.json")
	os.WriteFile(shipped, append(ext, '\n'), 0o600)
	withHead := func() *Report {
		rep, err := VerifyCollection(ctx, coll, "test-1", VerifyOptions{Keys: []Key{testKey}, Heads: []string{shipped}})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := withHead(); !rep.OK() {
		t.Fatalf("untouched, with the shipped head: %s", rep.Verdict())
	}
	// Cut back to the checkpoint at seq 8, and roll the head back to it.
	cp, err := decodeDoc(docAt(t, coll, 8))
	if err != nil || cp.Kind != KindCheckpoint {
		t.Fatalf("seq 8: %+v %v", cp, err)
	}
	coll.DeleteMany(ctx, bson.D{{"seq", bson.D{{"$gt", int64(8)}}}})
	if _, err := heads.ReplaceOne(ctx, bson.D{{"_id", "test-1"}}, bsonWithID("test-1", &cp)); err != nil {
		t.Fatal(err)
	}
	if rep := verifyColl(t, coll); !rep.OK() {
		t.Fatalf("cut back with its head: %s (verifies: the head is the trail's own)", rep.Verdict())
	}
	if rep := withHead(); rep.OK() || !strings.Contains(rep.Verdict(), "truncated") {
		t.Fatalf("cut back, with the shipped head: %s", rep.Verdict())
	}
}
