package audittrail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// Problem is the first thing found wrong with a trail.
type Problem struct {
	Segment string // file name
	Line    int    // 1-based line in Segment; 0 when the problem is not one line
	Seq     uint64 // the seq expected at that place
	What    string
}

func (p *Problem) String() string {
	where := p.Segment
	if p.Line > 0 {
		where = fmt.Sprintf("%s line %d", p.Segment, p.Line)
	}
	if where == "" {
		where = "trail"
	}
	return fmt.Sprintf("%s (seq %d): %s", where, p.Seq, p.What)
}

// Report is what Verify found.
type Report struct {
	// Dir is the trail's directory, or the collection (db.coll) when
	// Collection; Instance is the instance verified in a collection.
	Dir        string
	Instance   string
	Collection bool
	Records    uint64 // records verified, checkpoints included
	Segments   int
	// LastCheckpoint is the seq of the last valid checkpoint; Unsigned
	// the records after it, which no signature vouches for yet.
	LastCheckpoint uint64
	Unsigned       uint64
	// Signed reports whether checkpoint signatures were checked (keys
	// were given).
	Signed bool
	// Notes are what was accepted but deserves a look (a torn line after
	// a crash, a missing head.json).
	Notes   []string
	Problem *Problem
}

// OK reports whether the trail verified.
func (r *Report) OK() bool { return r.Problem == nil }

// Verdict is the one-line summary for scripts.
func (r *Report) Verdict() string {
	if r.Problem != nil {
		return "FAIL " + r.Problem.String()
	}
	sig := "signatures checked"
	if !r.Signed {
		sig = "signatures NOT checked (no key)"
	}
	where := fmt.Sprintf("%d segments", r.Segments)
	if r.Collection {
		where = fmt.Sprintf("%s (instance %s)", r.Dir, r.Instance)
	}
	return fmt.Sprintf("OK %d records in %s, last checkpoint seq %d, %d unsigned after it, %s",
		r.Records, where, r.LastCheckpoint, r.Unsigned, sig)
}

// Verify checks the trail in dir: every line a record in canonical form,
// seqs consecutive from 1, each record linked to the one before (across
// segments too), hashes right, checkpoints signed by one of keys (when
// any is given), and the trail reaching the checkpoint in head.json. It
// stops at the first problem. An error is returned only when dir cannot
// be read.
func Verify(dir string, keys []Key) (*Report, error) {
	return VerifyWith(dir, VerifyOptions{Keys: keys})
}

// VerifyPruned is Verify for a trail whose oldest segments were removed
// under a retention policy: the first segment present may start after
// seq 1, and its first record's link to the removed one is not checked
// (a note says from where the trail was verified). Everything from there
// on is checked as by Verify.
func VerifyPruned(dir string, keys []Key) (*Report, error) {
	return VerifyWith(dir, VerifyOptions{Keys: keys, Pruned: true})
}

// VerifyOptions are Verify's inputs beyond the directory.
type VerifyOptions struct {
	// Keys are the checkpoint keys; none: signatures are not checked.
	Keys []Key
	// Pruned: see VerifyPruned.
	Pruned bool
	// Heads are copies of head.json kept elsewhere (write-once storage):
	// the trail must reach each, as it must reach its own head.json. They
	// catch what head.json cannot: a trail cut back to an earlier
	// checkpoint with that checkpoint copied into head.json.
	Heads []string
}

// VerifyWith is Verify with options.
func VerifyWith(dir string, o VerifyOptions) (*Report, error) {
	keys, pruned := o.Keys, o.Pruned
	names, err := segments(dir)
	if err != nil {
		return nil, err
	}
	v := verifier{rep: &Report{Dir: dir, Signed: len(keys) > 0}, keys: map[string]Key{}, checkpoints: map[uint64]string{}}
	for _, k := range keys {
		v.keys[k.ID] = k
	}
	if len(names) == 0 {
		v.fail("", 0, "no segments (trail-*.jsonl) in %s", dir)
		return v.rep, nil
	}
	if torn, _ := filepath.Glob(filepath.Join(dir, "*"+tornSuffix)); len(torn) > 0 {
		for _, t := range torn {
			v.rep.Notes = append(v.rep.Notes, filepath.Base(t)+": a segment with no complete record, set aside after a crash")
		}
	}
	if first, ok := segmentFirst(names[0]); ok && pruned && first > 1 {
		v.seq, v.pruned = first-1, true
		v.rep.Notes = append(v.rep.Notes, fmt.Sprintf("pruned trail: verified from seq %d (%s); the records before it were not checked", first, names[0]))
	}
	for i, name := range names {
		if !v.segment(dir, name, i == len(names)-1) {
			return v.rep, nil
		}
	}
	v.head(filepath.Join(dir, headFile), headFile, false)
	for _, h := range o.Heads {
		if v.rep.Problem != nil {
			break
		}
		v.head(h, h, true)
	}
	return v.rep, nil
}

type verifier struct {
	rep         *Report
	keys        map[string]Key
	seq         uint64 // last good seq
	prev        string // its hash
	checkpoints map[uint64]string
	// torn: the previous segment ended in a torn line of this many bytes.
	torn     int
	tornName string
	scratch  []byte
	// pruned: the first record's prev is taken as it is (its predecessor
	// was removed by retention).
	pruned bool
}

func (v *verifier) fail(seg string, line int, format string, args ...any) {
	v.rep.Problem = &Problem{Segment: seg, Line: line, Seq: v.seq + 1, What: fmt.Sprintf(format, args...)}
}

func (v *verifier) segment(dir, name string, last bool) bool {
	first, ok := segmentFirst(name)
	if !ok {
		v.fail(name, 0, "not a segment name (trail-<20 digits>.jsonl)")
		return false
	}
	switch {
	case first > v.seq+1:
		v.fail(name, 0, "%s missing: a segment before %s was deleted", span(v.seq+1, first-1), name)
		return false
	case first < v.seq+1:
		v.fail(name, 0, "segment starts at seq %d, which the previous segment already holds (inserted or renamed segment)", first)
		return false
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		v.fail(name, 0, "unreadable: %v", err)
		return false
	}
	v.rep.Segments++
	end := bytes.LastIndexByte(data, '\n') + 1
	var lines [][]byte
	if end > 0 {
		lines = bytes.SplitAfter(data[:end-1], []byte{'\n'})
		lines[len(lines)-1] = data[end-1-len(lines[len(lines)-1]) : end]
	}
	if len(lines) == 0 {
		v.fail(name, 0, "empty segment (no complete record)")
		return false
	}
	for i, line := range lines {
		if !v.record(name, i+1, line) {
			return false
		}
	}
	v.torn, v.tornName = len(data)-end, name
	if v.torn > 0 && last {
		v.rep.Notes = append(v.rep.Notes, fmt.Sprintf("%s ends with %d torn bytes after seq %d: a crash during a write, or a writer still writing", name, v.torn, v.seq))
	}
	return true
}

func (v *verifier) record(seg string, line int, raw []byte) bool {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		v.fail(seg, line, "not a record (%v): altered, inserted or damaged", err)
		return false
	}
	if canon, err := marshalLine(v.scratch[:0], &r); err != nil || !bytes.Equal(canon, raw) {
		v.fail(seg, line, "the line is not as written (altered bytes)")
		return false
	}
	return v.check(seg, line, &r)
}

// check verifies one parsed record at its place in the chain.
func (v *verifier) check(seg string, line int, rp *Record) bool {
	r := *rp
	var hash string
	hash, v.scratch = r.computeHash(v.scratch)
	if hash != r.Hash {
		v.fail(seg, line, "hash does not match the record's content: the record was altered")
		return false
	}
	switch {
	case r.Seq > v.seq+1:
		v.fail(seg, line, "found seq %d: %s missing (deleted or reordered)", r.Seq, span(v.seq+1, r.Seq-1))
		return false
	case r.Seq < v.seq+1:
		v.fail(seg, line, "found seq %d again or out of order: a record was inserted, repeated or reordered", r.Seq)
		return false
	}
	if v.pruned {
		v.prev, v.pruned = r.Prev, false
	}
	if r.Prev != v.prev {
		if line == 1 && v.seq > 0 {
			v.fail(seg, line, "the segment does not link to the previous one (its first record's prev is not the last hash of %s)", v.tornName)
		} else {
			v.fail(seg, line, "prev is not the hash of the record before: the chain is broken here (a record was replaced or forged)")
		}
		return false
	}
	if line == 1 && v.torn > 0 {
		if r.Kind != KindStart || !strings.HasPrefix(r.Detail, fmt.Sprintf(tornDetail, v.torn, v.seq)) {
			v.fail(seg, line, "%s ends with %d bytes that are no record, and this segment's start record does not declare them: the end of %s was altered", v.tornName, v.torn, v.tornName)
			return false
		}
		v.rep.Notes = append(v.rep.Notes, fmt.Sprintf("%s ends with %d torn bytes after seq %d, declared by the next start record (a crash)", v.tornName, v.torn, v.seq))
		v.torn = 0
	}
	if r.Kind == KindCheckpoint {
		if !v.checkMAC(seg, line, &r) {
			return false
		}
		v.checkpoints[r.Seq] = r.Hash
		v.rep.LastCheckpoint, v.rep.Unsigned = r.Seq, 0
	} else {
		v.rep.Unsigned++
	}
	v.seq, v.prev = r.Seq, r.Hash
	v.rep.Records++
	return true
}

func (v *verifier) checkMAC(seg string, line int, r *Record) bool {
	if len(v.keys) == 0 {
		return true
	}
	key, ok := v.keys[r.KeyID]
	if !ok {
		v.fail(seg, line, "checkpoint signed with key %q, which is not among the keys given: a wrong key, or a forged checkpoint", r.KeyID)
		return false
	}
	if !key.check(r) {
		v.fail(seg, line, "bad checkpoint signature: the checkpoint or a record before it was replaced")
		return false
	}
	return true
}

// head checks that the trail reaches the checkpoint in the head file at
// path (head.json, or a copy kept elsewhere), which a deleted tail (a
// whole last segment) would not. A missing head.json is a note; a missing
// copy the caller named is a problem.
func (v *verifier) head(path, headFile string, given bool) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !given {
		v.rep.Notes = append(v.rep.Notes, "no head.json: a deleted tail cannot be detected")
		return
	}
	if err != nil {
		v.fail(headFile, 0, "unreadable: %v", err)
		return
	}
	// The head of a collection, exported (mongoexport's relaxed JSON),
	// carries its _id too.
	var hd struct {
		ID json.RawMessage `json:"_id"`
		Record
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hd); err != nil || hd.Kind != KindCheckpoint {
		v.fail(headFile, 0, "not a checkpoint: altered")
		return
	}
	v.headRecord(headFile, &hd.Record)
}

// headRecord checks that the trail reaches the signed head r.
func (v *verifier) headRecord(headFile string, r *Record) {
	if r.Kind != KindCheckpoint {
		v.fail(headFile, 0, "not a checkpoint: altered")
		return
	}
	if hash, _ := r.computeHash(nil); hash != r.Hash {
		v.fail(headFile, 0, "hash does not match its content: altered")
		return
	}
	if !v.checkMAC(headFile, 0, r) {
		return
	}
	if r.Seq > v.seq {
		v.rep.Problem = &Problem{Segment: headFile, Seq: v.seq + 1,
			What: fmt.Sprintf("the trail is truncated: it ends at seq %d but the signed head is checkpoint seq %d (records %d to %d deleted)", v.seq, r.Seq, v.seq+1, r.Seq)}
		return
	}
	if h, ok := v.checkpoints[r.Seq]; !ok || h != r.Hash {
		v.rep.Problem = &Problem{Segment: headFile, Seq: r.Seq,
			What: fmt.Sprintf("the signed head (checkpoint seq %d) is not the trail's record %d: the trail was rewritten from there", r.Seq, r.Seq)}
	}
}

// span names the records from a to b.
func span(a, b uint64) string {
	if a == b {
		return fmt.Sprintf("record %d is", a)
	}
	return fmt.Sprintf("records %d to %d are", a, b)
}

// VerifyCollection is Verify for one instance's records in a trail
// collection: read in seq order, each document a record (decodeDoc), the
// same chain and signature checks, and the chain reaching the instance's
// document in the head collection (and any shipped heads in o.Heads). A
// problem names the document by its _id. An error is returned only when
// the collection cannot be read.
func VerifyCollection(ctx context.Context, coll *mongo.Collection, instance string, o VerifyOptions) (*Report, error) {
	name := coll.Database().Name() + "." + coll.Name()
	v := verifier{rep: &Report{Dir: name, Instance: instance, Collection: true, Signed: len(o.Keys) > 0},
		keys: map[string]Key{}, checkpoints: map[uint64]string{}}
	for _, k := range o.Keys {
		v.keys[k.ID] = k
	}
	v.rep.Notes = append(v.rep.Notes, indexNote(ctx, coll)...)
	cur, err := coll.Find(ctx, bson.D{{Key: "instance", Value: instance}},
		options.Find().SetSort(bson.D{{Key: "seq", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	first := true
	for cur.Next(ctx) {
		where := name + " document " + docID(cur.Current)
		r, err := decodeDoc(cur.Current)
		if err != nil {
			v.fail(where, 0, "not a record (%v): altered, inserted or damaged", err)
			return v.rep, nil
		}
		if first && o.Pruned && r.Seq > 1 {
			v.seq, v.pruned = r.Seq-1, true
			v.rep.Notes = append(v.rep.Notes, fmt.Sprintf("pruned trail: verified from seq %d; the records before it were not checked", r.Seq))
		}
		first = false
		if !v.check(where, 0, &r) {
			return v.rep, nil
		}
	}
	if err := cur.Err(); err != nil {
		return nil, err
	}
	if first {
		v.fail(name, 0, "no records of instance %q", instance)
		return v.rep, nil
	}
	headName := name + HeadSuffix + " document " + strconv.Quote(instance)
	raw, err := coll.Database().Collection(coll.Name()+HeadSuffix).FindOne(ctx, bson.D{{Key: "_id", Value: instance}}).Raw()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		v.rep.Notes = append(v.rep.Notes, "no head document in "+name+HeadSuffix+": a deleted tail cannot be detected")
	case err != nil:
		return nil, err
	default:
		r, err := decodeDoc(raw)
		if err != nil {
			v.fail(headName, 0, "not a checkpoint (%v): altered", err)
			return v.rep, nil
		}
		v.headRecord(headName, &r)
	}
	for _, h := range o.Heads {
		if v.rep.Problem != nil {
			break
		}
		v.head(h, h, true)
	}
	return v.rep, nil
}

// indexNote warns when the unique (instance, seq) index is gone: verify
// still finds a repeated seq, but inserts are no longer refused.
func indexNote(ctx context.Context, coll *mongo.Collection) []string {
	specs, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		return []string{fmt.Sprintf("could not list the indexes (%v)", err)}
	}
	for _, s := range specs {
		if s.Name == IndexName && s.Unique != nil && *s.Unique {
			return nil
		}
	}
	return []string{"the unique index " + IndexName + " is missing: someone with write access dropped it"}
}
