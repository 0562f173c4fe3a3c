package audittrail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/mongo"
	"go.uber.org/zap"
)

// Mode is the trail's durability mode.
type Mode string

const (
	// ModeBestEffort: Append hands the record to a bounded buffer and
	// returns; a full buffer drops it (counted, and recorded in the trail).
	ModeBestEffort Mode = "bestEffort"
	// ModeRequired: writes on rules that require an audit record call
	// Commit, which returns once the record is durable (fsynced) or
	// fails; the caller refuses the write then.
	ModeRequired Mode = "required"
)

// Modes lists the valid modes.
func Modes() []Mode { return []Mode{ModeBestEffort, ModeRequired} }

// Defaults of Options.
const (
	DefaultSegmentBytes       = 64 << 20
	DefaultSegmentAge         = 24 * time.Hour
	DefaultCheckpointEvery    = 1000
	DefaultCheckpointInterval = 10 * time.Second
	DefaultBufferSize         = 8192
	maxBatch                  = 512
	// linger is how long the writer waits after a batch that was not
	// full before it takes the next one, unless gather records are
	// waiting by then, a Commit calls it or the trail closes: a record
	// handed over while the writer sleeps in the queue's receive costs
	// the request path a wake-up of the writer (a futex call), one per
	// record under a steady load; lingering makes it one per batch. Each
	// batch costs the process some 40 µs of CPU besides its records (the
	// writer's timer wake-up, the scheduler's work around it, the write
	// system call), so at 10 000 records a second a 2 ms linger (batches
	// of 20) spent about 1.5 µs a record on them; 10 ms spends a fifth of
	// that (BenchmarkTrailPaced, docs/AUDIT.md "Cost").
	// A best-effort record waits at most this long in the buffer (what a
	// crash of the process loses); a Commit does not wait for it.
	linger = 10 * time.Millisecond
	// gather is the backlog at which a producer cuts the writer's linger
	// short: half a batch, so that a burst fills whole batches and the
	// buffer never fills while the writer lingers.
	gather = maxBatch / 2
)

// ErrUnavailable is Commit's error when the record could not be made
// durable (the sink fails, the buffer is full, or the trail is closed).
var ErrUnavailable = errors.New("audit trail unavailable")

// Options configure a Trail.
type Options struct {
	// Dir holds the trail's files (the file sink); one lockgate instance
	// per directory. Empty: no file sink.
	Dir string
	// Collection, when set, is the collection sink: one document per
	// record, a unique index on (instance, seq), each instance's latest
	// checkpoint in the collection named with HeadSuffix beside it. The
	// caller owns the client. Dir, Collection or both must be set; with
	// both, every record goes to both, in the same chain.
	Collection *mongo.Collection
	// Instance names the lockgate in every record (e.g. the host name).
	Instance string
	// Key signs checkpoints.
	Key Key
	// SegmentBytes and SegmentAge rotate a segment once it is this large
	// or this old (checked after each batch and on the ticker).
	SegmentBytes int64
	SegmentAge   time.Duration
	// CheckpointEvery and CheckpointInterval: a checkpoint follows this
	// many records or this much time with unsigned records, whichever
	// comes first.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// BufferSize bounds the records waiting for the writer.
	BufferSize int
	// Clock is time.Now unless set (tests).
	Clock   func() time.Time
	Logger  *zap.Logger
	Metrics *Metrics

	// createSegment creates a segment file (os.OpenFile unless a test
	// makes it fail).
	createSegment func(path string) (*os.File, error)
	// linger is the constant linger unless a test lengthens it.
	linger time.Duration
}

func (o *Options) defaults() {
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.SegmentAge <= 0 {
		o.SegmentAge = DefaultSegmentAge
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = DefaultCheckpointEvery
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.BufferSize <= 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.linger <= 0 {
		o.linger = linger
	}
	if o.createSegment == nil {
		o.createSegment = func(path string) (*os.File, error) {
			return os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
		}
	}
}

// item is one queued event; done, when set, receives the outcome once
// the record is durable or has failed (Commit).
type item struct {
	ev   Event
	done chan error
}

// Trail is an open audit trail. Append and Commit are safe for
// concurrent use; records are chained in the order the writer takes
// them from the buffer.
type Trail struct {
	opts    Options
	log     *zap.Logger
	metrics *Metrics
	ring    *ring
	dropped atomic.Uint64
	// idle is set while the writer sleeps on an empty buffer; the
	// producer that finds it set wakes the writer through wake. A busy
	// writer lingers instead (see linger) until gather records wait, and
	// a producer pays the atomic loads that tell it which.
	idle atomic.Bool
	wake chan struct{}
	// urgent cuts the writer's linger short: a Commit waits.
	urgent chan struct{}
	// dones are Commit's reply channels (chan error, capacity 1), reused.
	dones sync.Pool

	closeOnce sync.Once
	closing   chan struct{}
	closed    chan struct{}
	closeErr  error

	w *writer // owned by the writer goroutine after Open
}

// Open recovers the trail in opts.Dir (creating it when new), writes a
// start record in a new segment linked to the last complete record, and
// starts the writer. Close it to write the stop record.
func Open(opts Options) (*Trail, error) {
	t, err := open(opts)
	if err != nil {
		return nil, err
	}
	go t.run()
	return t, nil
}

// open is Open without starting the writer goroutine.
func open(opts Options) (*Trail, error) {
	opts.defaults()
	if err := opts.Key.CanSign(); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if opts.Key.ID == "" {
		opts.Key = NewKey(opts.Key.Secret)
	}
	if opts.Dir == "" && opts.Collection == nil {
		return nil, errors.New("audit: no sink: set a directory, a collection or both")
	}
	w, err := openWriter(&opts)
	if err != nil {
		return nil, err
	}
	t := newTrail(opts, w)
	start := Event{Kind: KindStart, Time: opts.Clock(), Detail: w.recovered}
	if err := t.w.writeBatch([]item{{ev: start}}, true); err != nil {
		w.close()
		return nil, fmt.Errorf("audit: writing the start record: %w", err)
	}
	return t, nil
}

// newTrail is the trail of an open writer, its buffer empty and its
// writer goroutine not started.
func newTrail(opts Options, w *writer) *Trail {
	t := &Trail{
		opts:    opts,
		log:     opts.Logger,
		metrics: opts.Metrics,
		ring:    newRing(opts.BufferSize),
		wake:    make(chan struct{}, 1),
		urgent:  make(chan struct{}, 1),
		closing: make(chan struct{}),
		closed:  make(chan struct{}),
		w:       w,
	}
	t.dones.New = func() any { return make(chan error, 1) }
	t.metrics.bufferCap.Set(float64(opts.BufferSize))
	bufferLen := t.ring.len
	t.metrics.bufferLen.Store(&bufferLen)
	return t
}

// Append queues ev and returns at once; it never blocks and, but for the
// event's own slices, which the writer reads later, never allocates. It
// reports false when the buffer was full and the record was dropped
// (counted, and noted in the trail).
func (t *Trail) Append(ev Event) bool {
	if ev.Time.IsZero() {
		ev.Time = t.opts.Clock()
	}
	if !t.ring.put(&ev, nil) {
		t.dropped.Add(1)
		t.metrics.dropped.Inc()
		return false
	}
	if t.idle.Load() || t.ring.len() >= gather {
		t.nudge(t.wake)
	}
	return true
}

// nudge sends on a wake-up channel of capacity 1 unless a wake-up is
// pending already (then it costs a load: no lock is taken).
func (t *Trail) nudge(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Commit queues ev and waits until its record is durable. It fails with
// ErrUnavailable when the buffer is full, the sink cannot write, the
// trail is closed, or ctx ends first (the record may then still be
// written later: a caller that refuses the write on this error leaves a
// record saying allow; the refusal is the caller's to record).
func (t *Trail) Commit(ctx context.Context, ev Event) error {
	if ev.Time.IsZero() {
		ev.Time = t.opts.Clock()
	}
	select {
	case <-t.closing:
		return fmt.Errorf("%w: closed", ErrUnavailable)
	default:
	}
	done := t.dones.Get().(chan error)
	if !t.ring.put(&ev, done) {
		t.dones.Put(done)
		return fmt.Errorf("%w: the buffer is full", ErrUnavailable)
	}
	t.nudge(t.urgent) // wakes an idle writer too
	select {
	case err := <-done:
		t.dones.Put(done)
		return err
	case <-t.closed:
		select {
		case err := <-done: // answered while closing
			return err
		default:
			return fmt.Errorf("%w: closed", ErrUnavailable)
		}
	case <-ctx.Done():
		// done may still be answered: it is not reused.
		return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
}

// Close drains the buffer, writes the stop record and a final
// checkpoint, and syncs and closes the segment. Safe to call many times.
func (t *Trail) Close() error {
	t.closeOnce.Do(func() { close(t.closing) })
	<-t.closed
	return t.closeErr
}

// run is the writer goroutine: it takes batches from the buffer, writes
// them, and checkpoints and rotates on count, size and time.
func (t *Trail) run() {
	defer close(t.closed)
	tick := time.NewTicker(min(t.opts.CheckpointInterval, time.Second))
	defer tick.Stop()
	batch := make([]item, 0, maxBatch)
	backoff := time.Duration(0)
	pause := time.NewTimer(t.opts.linger)
	pause.Stop()
	defer pause.Stop()
	for {
		var closing bool
		select {
		case <-t.closing:
			closing = true
		default:
		}
		batch = t.ring.take(batch, maxBatch)
		if len(batch) == 0 && !closing {
			// Nothing waits: sleep until a producer, a Commit, the
			// ticker or Close. idle is set before the buffer is looked
			// at again, and a producer looks at idle after publishing,
			// so one of the two sees the other.
			t.idle.Store(true)
			if t.ring.empty() {
				select {
				case <-t.wake:
				case <-t.urgent:
				case <-tick.C:
				case <-t.closing:
					closing = true
				}
			}
			t.idle.Store(false)
			batch = t.ring.take(batch, maxBatch)
		}
		if n := t.dropped.Swap(0); n > 0 {
			batch = append([]item{{ev: droppedEvent(n, t.opts.Clock())}}, batch...)
		}
		if err := t.w.writeBatch(batch, false); err != nil {
			t.fail(batch, err)
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			if closing {
				t.closeErr = err
				t.w.close()
				return
			}
			select {
			case <-time.After(backoff):
			case <-t.closing:
			}
			clear(batch)
			batch = batch[:0]
			continue
		}
		backoff = 0
		for _, it := range batch {
			if it.done != nil {
				it.done <- nil
			}
		}
		full := len(batch) == maxBatch
		clear(batch)
		batch = batch[:0]
		if err := t.w.maintain(); err != nil {
			t.metrics.sinkErrors.Inc()
			t.log.Error("audit trail: checkpoint or rotation failed", zap.Error(err))
		}
		if closing {
			t.closeErr = t.finish()
			return
		}
		if !full && t.ring.len() < gather {
			// Let records gather before the next batch, unless enough
			// are waiting, a Commit waits or the trail closes. A wake-up
			// left from before (a producer that saw the writer idle or
			// a backlog) only makes this batch come early.
			pause.Reset(t.opts.linger)
			select {
			case <-pause.C:
			case <-t.wake:
				pause.Stop()
			case <-t.urgent:
				pause.Stop()
			case <-t.closing:
				pause.Stop()
			}
		}
	}
}

// fail answers a batch that could not be written: Commit callers get
// ErrUnavailable; the other records are lost and counted as dropped, so
// the next record that is written says how many.
func (t *Trail) fail(batch []item, err error) {
	t.metrics.sinkErrors.Inc()
	t.log.Error("audit trail: write failed", zap.Error(err), zap.Int("records", len(batch)))
	var lost, noted uint64
	for _, it := range batch {
		switch {
		case it.done != nil:
			it.done <- fmt.Errorf("%w: %w", ErrUnavailable, err)
		case it.ev.Kind == KindDropped:
			noted += it.ev.Count // a note that was not written: counted already
		default:
			lost++
		}
	}
	t.dropped.Add(lost + noted)
	t.metrics.dropped.Add(float64(lost))
}

// finish drains what is left, in batches of at most maxBatch (a writer
// that fell behind catches up without holding the whole buffer twice),
// and writes the stop record and a final checkpoint.
func (t *Trail) finish() error {
	batch := make([]item, 0, maxBatch)
	answer := func(err error) {
		for _, it := range batch {
			if it.done != nil {
				if err != nil {
					it.done <- fmt.Errorf("%w: %w", ErrUnavailable, err)
				} else {
					it.done <- nil
				}
			}
		}
		clear(batch)
		batch = batch[:0]
	}
	for stalled := 0; stalled < 1000; {
		batch = t.ring.take(batch, maxBatch)
		if len(batch) == 0 {
			if t.ring.len() == 0 {
				break
			}
			// A producer has claimed a slot and is copying into it.
			stalled++
			runtime.Gosched()
			continue
		}
		if len(batch) < maxBatch && t.ring.len() == 0 {
			break // the last of it goes with the stop record
		}
		if err := t.w.writeBatch(batch, false); err != nil {
			t.fail(batch, err)
			clear(batch)
			batch = batch[:0]
			continue
		}
		answer(nil)
		if err := t.w.maintain(); err != nil {
			t.metrics.sinkErrors.Inc()
			t.log.Error("audit trail: checkpoint or rotation failed", zap.Error(err))
		}
	}
	if n := t.dropped.Swap(0); n > 0 {
		batch = append([]item{{ev: droppedEvent(n, t.opts.Clock())}}, batch...)
	}
	batch = append(batch, item{ev: Event{Kind: KindStop, Time: t.opts.Clock()}})
	err := t.w.writeBatch(batch, true)
	answer(err)
	return errors.Join(err, t.w.close())
}

func droppedEvent(n uint64, now time.Time) Event {
	return Event{Kind: KindDropped, Time: now, Count: n,
		Detail: fmt.Sprintf("%d records dropped before this one: the audit buffer was full or the sink failed", n)}
}
