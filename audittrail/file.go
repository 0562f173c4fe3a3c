package audittrail

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// File names in a trail directory.
const (
	segmentPrefix = "trail-"
	segmentSuffix = ".jsonl"
	headFile      = "head.json"
	lockFile      = "LOCK"
	tornSuffix    = ".torn"
)

// tornDetail is the start record's Detail after a crash left a torn
// line; Verify accepts a torn segment end only when the next segment
// starts with this note naming its size.
const tornDetail = "recovered: the previous segment ends with %d torn bytes after seq %d (a crash during a write)"

func segmentName(first uint64) string {
	return fmt.Sprintf("%s%020d%s", segmentPrefix, first, segmentSuffix)
}

// segments lists the segment files of dir in chain order.
func segments(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasPrefix(n, segmentPrefix) && strings.HasSuffix(n, segmentSuffix) {
			out = append(out, n)
		}
	}
	sort.Strings(out) // fixed-width numbers: name order is seq order
	return out, nil
}

// segmentFirst is the first seq a segment's name promises.
func segmentFirst(name string) (uint64, bool) {
	s := strings.TrimSuffix(strings.TrimPrefix(name, segmentPrefix), segmentSuffix)
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && len(s) == 20
}

// writer owns the sinks of an open trail; only the writer goroutine (and
// Open before it starts) uses it.
type writer struct {
	opts *Options
	lock *os.File  // the directory's lock; nil without a file sink
	f    *os.File  // the current segment; nil until the next record
	coll *collSink // nil without a collection sink

	size     int64
	segStart time.Time
	seq      uint64
	prev     string
	// prevSafe: prev holds only jsonSafe bytes (a hash this writer made,
	// or a recovered one that was checked); instanceSafe the same of the
	// instance name. The record lines then copy them as they are.
	prevSafe, instanceSafe bool
	// known holds, per field of safeEventFields, the last string of an
	// event found safe. A string that is the same one (its bytes at the
	// same place, which known keeps alive: a Go string never changes)
	// is safe without a scan.
	known [len(safeEventFields)]string
	// sinceCP counts the records after the last checkpoint; firstUnsigned
	// is the time of the first of them.
	sinceCP       int
	firstUnsigned time.Time
	recovered     string

	buf, scratch []byte
	// recs are the batch's records, kept for the collection sink.
	recs []Record
	// kinds counts the batch's records by kind (kindIndex), for the
	// metric.
	kinds [len(recordKinds)]int
	// strs holds the records' strings; ids backs their id lists, reused
	// from batch to batch (a batch's records are not kept after it,
	// but for a checkpoint, which has none).
	strs arena
	ids  []string
}

// chainEnd is where a sink's copy of the chain ends.
type chainEnd struct {
	seq  uint64
	hash string
	kind Kind
	// clean: the last records are a stop and its checkpoint.
	clean bool
	// note says what recovery found (a torn line, set aside bytes); torn:
	// the note is tornDetail, which the start record must carry first.
	note string
	torn bool
}

// openWriter opens the sinks (locking the directory) and finds where the
// chain ends; with both sinks, the one behind is brought level with the
// other first.
func openWriter(o *Options) (*writer, error) {
	w := &writer{opts: o}
	var fileEnd, collEnd chainEnd
	if o.Dir != "" {
		if err := os.MkdirAll(o.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("audit.dir: %w", err)
		}
		lock, err := os.OpenFile(filepath.Join(o.Dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("audit.dir: %w", err)
		}
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			lock.Close()
			return nil, fmt.Errorf("audit.dir: %s is in use by another lockgate (one trail per instance): %w", o.Dir, err)
		}
		w.lock = lock
		if fileEnd, err = w.recover(); err != nil {
			lock.Close()
			return nil, err
		}
	}
	if o.Collection != nil {
		w.coll = newCollSink(o.Collection, o.Instance)
		var err error
		if collEnd, err = w.recoverColl(); err != nil {
			w.close()
			return nil, err
		}
	}
	end, err := w.reconcile(fileEnd, collEnd)
	if err != nil {
		w.close()
		return nil, err
	}
	w.seq, w.prev = end.seq, end.hash
	w.prevSafe, w.instanceSafe = isSafe(w.prev), isSafe(o.Instance)
	if end.seq > 0 && end.kind != KindCheckpoint {
		// Records after the last checkpoint: the next checkpoint signs
		// them with the rest.
		w.sinceCP, w.firstUnsigned = 1, o.Clock()
	}
	return w, nil
}

// reconcile picks the chain's end from the sinks' and levels them: a
// sink behind the other gets the records it misses (a crash between the
// two writes of a batch); a sink with no records of this instance at all
// (newly added) starts where the other ends, and says so.
func (w *writer) reconcile(f, c chainEnd) (chainEnd, error) {
	var notes []string
	note := func(n string) {
		if n != "" {
			notes = append(notes, n)
		}
	}
	end := f
	switch {
	case w.coll == nil:
	case w.lock == nil:
		end = c
	case f.seq == c.seq:
		if f.hash != c.hash {
			return end, fmt.Errorf("audit: the files in %s and the collection %s disagree at seq %d (hashes %s and %s): run `lockgate audit verify` on both", w.opts.Dir, w.coll.name(), f.seq, f.hash, c.hash)
		}
	case c.seq == 0:
		note(fmt.Sprintf("the collection sink %s starts here: records 1 to %d are in the files only", w.coll.name(), f.seq))
	case f.seq == 0:
		end = c
		note(fmt.Sprintf("the file sink starts here: records 1 to %d are in the collection %s only", c.seq, w.coll.name()))
	case f.seq > c.seq:
		if err := w.levelColl(c); err != nil {
			return end, err
		}
		note(fmt.Sprintf("records %d to %d were copied from the files into the collection, which missed them", c.seq+1, f.seq))
	default: // the collection is ahead
		if f.torn {
			return end, fmt.Errorf("audit: the collection %s holds records after seq %d but the files in %s end there in a torn line: run `lockgate audit verify` on both", w.coll.name(), f.seq, w.opts.Dir)
		}
		if err := w.levelFiles(f); err != nil {
			return end, err
		}
		end = c
		note(fmt.Sprintf("records %d to %d were copied from the collection into the files, which missed them", f.seq+1, c.seq))
	}
	// A torn line's note comes first: verify finds it there.
	switch {
	case f.torn:
		notes = append([]string{f.note}, notes...)
	default:
		if f.note != "" {
			notes = append([]string{f.note}, notes...)
		}
		if end.seq > 0 && !end.clean {
			note(fmt.Sprintf("recovered: the previous run ended after seq %d without a stop record (a crash or a kill)", end.seq))
		}
	}
	w.recovered = strings.Join(notes, "; ")
	return end, nil
}

// recoverColl finds where the instance's chain in the collection ends,
// creating the unique index first.
func (w *writer) recoverColl() (chainEnd, error) {
	ctx := context.Background()
	if err := w.coll.ensureIndex(ctx); err != nil {
		return chainEnd{}, err
	}
	tail, err := w.coll.tail(ctx)
	if err != nil || len(tail) == 0 {
		return chainEnd{}, err
	}
	end := chainEnd{seq: tail[0].Seq, hash: tail[0].Hash, kind: tail[0].Kind}
	end.clean = len(tail) == 2 && tail[0].Kind == KindCheckpoint && tail[1].Kind == KindStop
	return end, nil
}

// levelColl copies the file records after c into the collection.
func (w *writer) levelColl(c chainEnd) error {
	var recs []Record
	err := readFilesAfter(w.opts.Dir, c.seq, func(r *Record) error {
		if len(recs) == 0 && r.Prev != c.hash {
			return fmt.Errorf("audit: record %d of the files in %s does not follow record %d of the collection %s: run `lockgate audit verify` on both", r.Seq, w.opts.Dir, c.seq, w.coll.name())
		}
		recs = append(recs, *r)
		if len(recs) == maxBatch {
			err := w.coll.insert(context.Background(), recs, true)
			recs = recs[:0]
			return err
		}
		return nil
	})
	if err == nil {
		err = w.coll.insert(context.Background(), recs, true)
	}
	return err
}

// levelFiles writes the collection's records after f into a new segment.
func (w *writer) levelFiles(f chainEnd) error {
	w.buf = w.buf[:0]
	first := true
	err := w.coll.after(context.Background(), f.seq, func(r *Record) error {
		if first && r.Prev != f.hash {
			return fmt.Errorf("audit: record %d of the collection %s does not follow record %d of the files in %s: run `lockgate audit verify` on both", r.Seq, w.coll.name(), f.seq, w.opts.Dir)
		}
		first = false
		w.buf, _ = marshalLine(w.buf, r)
		return nil
	})
	if err != nil {
		return err
	}
	return w.writeFile(true, f.seq+1)
}

// readFilesAfter calls fn with the records of dir after seq, reading only
// the segments that can hold them.
func readFilesAfter(dir string, seq uint64, fn func(*Record) error) error {
	names, err := segments(dir)
	if err != nil {
		return err
	}
	from := 0
	for i, n := range names {
		if first, ok := segmentFirst(n); ok && first <= seq+1 {
			from = i
		}
	}
	for _, name := range names[from:] {
		err := readSegment(filepath.Join(dir, name), name, func(r *Record) error {
			if r.Seq > seq {
				return fn(r)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// recover finds the last complete record of the files. A segment that
// ends in a torn line (a crash during a write) stays as it is, noted in
// the start record; one with no complete line at all is set aside as
// .torn (its name would be the next segment's).
func (w *writer) recover() (chainEnd, error) {
	var end chainEnd
	names, err := segments(w.opts.Dir)
	if err != nil {
		return end, fmt.Errorf("audit.dir: %w", err)
	}
	for len(names) > 0 {
		name := names[len(names)-1]
		path := filepath.Join(w.opts.Dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return end, fmt.Errorf("audit: reading %s: %w", name, err)
		}
		last := bytes.LastIndexByte(data, '\n')
		if last < 0 {
			if len(data) > 0 {
				if err := os.Rename(path, path+tornSuffix); err != nil {
					return end, fmt.Errorf("audit: setting aside %s: %w", name, err)
				}
				end.note = fmt.Sprintf("recovered: %s held %d torn bytes and no complete record; kept as %s", name, len(data), name+tornSuffix)
			} else if err := os.Remove(path); err != nil {
				return end, fmt.Errorf("audit: removing the empty %s: %w", name, err)
			}
			names = names[:len(names)-1]
			continue
		}
		start := bytes.LastIndexByte(data[:last], '\n') + 1
		var r Record
		if err := json.Unmarshal(data[start:last], &r); err != nil || r.Hash == "" {
			return end, fmt.Errorf("audit: the last record of %s does not parse (%v): the trail is damaged; run `lockgate audit verify %s`", name, err, w.opts.Dir)
		}
		end.seq, end.hash, end.kind = r.Seq, r.Hash, r.Kind
		if start > 0 && r.Kind == KindCheckpoint {
			var before Record
			from := bytes.LastIndexByte(data[:start-1], '\n') + 1
			end.clean = json.Unmarshal(data[from:start-1], &before) == nil && before.Kind == KindStop
		}
		if torn := len(data) - last - 1; torn > 0 {
			end.note, end.torn = fmt.Sprintf(tornDetail, torn, r.Seq), true
		}
		return end, nil
	}
	return end, nil
}

// build makes the next record of the chain from ev, its strings in the
// writer's arena.
func (w *writer) build(ev *Event) Record {
	w.seq++
	r := Record{
		Seq: w.seq, Time: w.timeString(ev.Time), Instance: w.opts.Instance, Prev: w.prev,
		Kind: ev.Kind, NS: ev.NS, Op: ev.Op, Mode: ev.Mode, Verdict: ev.Verdict, Reason: ev.Reason,
		App: ev.App, User: ev.User, Client: ev.Client, Holder: ev.Holder, Tokens: ev.Tokens,
		Policy: ev.Policy, Detail: ev.Detail, Count: ev.Count,
	}
	if r.Holder == "" && ev.HolderTag.n > 0 {
		var h [2 * len(ev.HolderTag.b)]byte
		n := hex.Encode(h[:], ev.HolderTag.b[:ev.HolderTag.n])
		r.Holder = w.strs.str(h[:n])
	}
	if len(ev.IDs) > 0 {
		start := len(w.ids)
		for _, id := range ev.IDs {
			w.scratch = appendID(w.scratch[:0], id)
			w.ids = append(w.ids, w.strs.str(w.scratch))
		}
		r.IDs = w.ids[start:len(w.ids):len(w.ids)]
	}
	return r
}

func (w *writer) timeString(t time.Time) string {
	var b [len(TimeFormat)]byte
	return w.strs.str(appendTime(b[:0], t))
}

// checkpoint builds a signed checkpoint at the chain's end.
func (w *writer) checkpoint(now time.Time) Record {
	w.seq++
	r := Record{Seq: w.seq, Time: w.timeString(now), Instance: w.opts.Instance, Prev: w.prev,
		Kind: KindCheckpoint, KeyID: w.opts.Key.ID, Count: uint64(w.sinceCP)}
	r.MAC = w.opts.Key.sign(&r)
	return r
}

func (w *writer) appendRecord(r *Record) error {
	var h [2 * sha256.Size]byte
	w.scratch = r.hashInto(&h, w.scratch)
	r.Hash = w.strs.str(h[:])
	// Times and hashes are written by this writer in digits, hex and
	// the layout's punctuation.
	safe := safeTime | safeHash
	if w.prevSafe {
		safe |= safePrev
	}
	if w.instanceSafe {
		safe |= safeInstance
	}
	for i, f := range [...]string{string(r.Kind), r.NS, r.Op, r.Mode, r.Verdict, r.App, r.User, r.Client, r.Policy} {
		if w.knownSafe(i, f) {
			safe |= safeEventFields[i]
		}
	}
	w.buf = append(appendJSONSafe(w.buf, r, safe), '\n')
	w.prev, w.prevSafe = r.Hash, true
	w.kinds[kindIndex(r.Kind)]++
	if w.coll != nil {
		w.recs = append(w.recs, *r)
	}
	return nil
}

// safeEventFields are the fields appendRecord looks up in known, in the
// order it lists them.
var safeEventFields = [...]safeFields{safeKind, safeNS, safeOp, safeMode, safeVerdict, safeApp, safeUser, safeClient, safePolicy}

// knownSafe reports whether s, field i's string, holds only jsonSafe
// bytes: at once when it is known[i], with a scan otherwise (a safe s
// is then remembered).
func (w *writer) knownSafe(i int, s string) bool {
	if len(s) == len(w.known[i]) && unsafe.StringData(s) == unsafe.StringData(w.known[i]) {
		return true
	}
	if !isSafe(s) {
		return false
	}
	w.known[i] = s
	return true
}

// recordKinds are the kinds the writer counts, in kindIndex's order.
var recordKinds = [...]Kind{KindStart, KindStop, KindDecision, KindLock, KindReload, KindDropped, KindCheckpoint}

func kindIndex(k Kind) int {
	switch k {
	case KindStart:
		return 0
	case KindStop:
		return 1
	case KindDecision:
		return 2
	case KindLock:
		return 3
	case KindReload:
		return 4
	case KindDropped:
		return 5
	}
	return 6
}

// writeBatch chains and writes items, with a checkpoint after every
// CheckpointEvery records; final adds a checkpoint at the end whatever
// the count. The segment is fsynced when a checkpoint or a committed
// record is in the batch. On failure nothing of the batch is in the
// chain: the file is cut back and the chain state restored.
func (w *writer) writeBatch(items []item, final bool) error {
	if len(items) == 0 && !final {
		return nil
	}
	began := w.opts.Clock()
	seq, prev, prevSafe, sinceCP, firstUnsigned := w.seq, w.prev, w.prevSafe, w.sinceCP, w.firstUnsigned
	restore := func() {
		w.seq, w.prev, w.prevSafe, w.sinceCP, w.firstUnsigned = seq, prev, prevSafe, sinceCP, firstUnsigned
		clear(w.kinds[:])
	}
	w.buf = w.buf[:0]
	clear(w.recs)
	w.recs = w.recs[:0]
	w.ids = w.ids[:0]
	clear(w.kinds[:])
	needSync := false
	var head *Record
	for i := range items {
		r := w.build(&items[i].ev)
		if err := w.appendRecord(&r); err != nil {
			restore()
			return err
		}
		if w.sinceCP == 0 {
			w.firstUnsigned = items[i].ev.Time
		}
		w.sinceCP++
		needSync = needSync || items[i].done != nil
		if w.sinceCP >= w.opts.CheckpointEvery || (final && i == len(items)-1) {
			cp := w.checkpoint(w.opts.Clock())
			if err := w.appendRecord(&cp); err != nil {
				restore()
				return err
			}
			w.sinceCP, head, needSync = 0, &cp, true
		}
	}
	if final && w.sinceCP > 0 { // no items: seal the records already written
		cp := w.checkpoint(w.opts.Clock())
		if err := w.appendRecord(&cp); err != nil {
			restore()
			return err
		}
		w.sinceCP, head, needSync = 0, &cp, true
	}
	if err := w.write(needSync, seq+1); err != nil {
		restore()
		return err
	}
	if head != nil {
		if err := w.writeHead(head); err != nil {
			// The records are durable; only head.json lags, which the
			// next checkpoint fixes. Count it, do not undo the batch.
			w.opts.Metrics.sinkErrors.Inc()
		}
	}
	m := w.opts.Metrics
	for i, n := range w.kinds {
		if n > 0 {
			m.byKind[i].Add(float64(n))
		}
	}
	now := w.opts.Clock()
	m.batch.Observe(now.Sub(began).Seconds())
	m.lastWrite.Set(float64(now.UnixNano()) / 1e9)
	return nil
}

// write stores the batch in every sink: w.buf in the current segment,
// w.recs in the collection. On failure nothing of it stays: the segment is
// cut back, the collection's documents of the batch deleted.
func (w *writer) write(sync bool, first uint64) error {
	before := w.size
	if err := w.writeFile(sync, first); err != nil {
		return err
	}
	if w.coll == nil {
		return nil
	}
	err := w.coll.insert(context.Background(), w.recs, sync)
	if err != nil && w.f != nil && w.size != before {
		if terr := w.f.Truncate(before); terr != nil {
			// Records the chain will not hold stay in the segment: start
			// a new one, as after a crash.
			w.f.Close()
			w.f = nil
			return errors.Join(err, terr)
		}
		w.size = before
	}
	return err
}

// writeFile appends w.buf to the current segment, opening one when none
// is; on failure the segment is cut back to its size before.
func (w *writer) writeFile(sync bool, first uint64) error {
	if len(w.buf) == 0 || w.lock == nil {
		return nil
	}
	if w.f == nil {
		if err := w.openSegment(first); err != nil {
			return err
		}
	}
	n, err := w.f.Write(w.buf)
	if err == nil && sync {
		err = w.f.Sync()
	}
	if err != nil {
		if n > 0 {
			if terr := w.f.Truncate(w.size); terr != nil {
				// The segment now ends in a partial line we cannot
				// remove: start a new one, as after a crash.
				w.f.Close()
				w.f = nil
				return errors.Join(err, terr)
			}
		}
		return err
	}
	w.size += int64(n)
	return nil
}

// openSegment creates the segment whose first record is first.
func (w *writer) openSegment(first uint64) error {
	name := segmentName(first)
	f, err := w.opts.createSegment(filepath.Join(w.opts.Dir, name))
	if err != nil {
		return fmt.Errorf("audit: new segment: %w", err)
	}
	if err := syncDir(w.opts.Dir); err != nil {
		f.Close()
		return err
	}
	w.f, w.size, w.segStart = f, 0, w.opts.Clock()
	return nil
}

// maintain writes a checkpoint when unsigned records are older than
// CheckpointInterval, and rotates the segment on size or age.
func (w *writer) maintain() error {
	now := w.opts.Clock()
	rotate := w.f != nil && (w.size >= w.opts.SegmentBytes || now.Sub(w.segStart) >= w.opts.SegmentAge)
	if w.sinceCP > 0 && (rotate || now.Sub(w.firstUnsigned) >= w.opts.CheckpointInterval) {
		if err := w.writeBatch(nil, true); err != nil {
			return err
		}
	}
	if rotate {
		err := w.f.Sync()
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		w.f = nil // the next record opens the next segment
		return err
	}
	return nil
}

// writeHead records the checkpoint as the head of every sink.
func (w *writer) writeHead(cp *Record) error {
	var err error
	if w.lock != nil {
		err = w.writeHeadFile(cp)
	}
	if w.coll != nil {
		err = errors.Join(err, w.coll.writeHead(context.Background(), cp))
	}
	return err
}

// writeHeadFile replaces head.json with the checkpoint, atomically.
func (w *writer) writeHeadFile(cp *Record) error {
	line, err := marshalLine(nil, cp)
	if err != nil {
		return err
	}
	tmp := filepath.Join(w.opts.Dir, headFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(line)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(w.opts.Dir, headFile))
	}
	if err == nil {
		err = syncDir(w.opts.Dir)
	}
	return err
}

func (w *writer) close() error {
	var err error
	if w.f != nil {
		err = errors.Join(w.f.Sync(), w.f.Close())
		w.f = nil
	}
	if w.lock != nil {
		err = errors.Join(err, w.lock.Close())
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return err
	}
	return nil
}
