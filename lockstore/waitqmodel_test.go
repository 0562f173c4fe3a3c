package lockstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// TestWaitQueueModel runs owners that acquire (one or several ids, with
// wait, or fail-fast), renew and release at random against one Store whose
// polling is off, so that a waiter is only ever woken by the wait queues.
// A waiter the queues forget then stays blocked although its ids are free,
// which the test reports with the seed, the operation trace and the queues.
// Invariants: no two owners hold an id at once (in the model, checked at
// each grant), each grant is reflected in the store (Holds), and when the
// owners stop, every waiter finishes: an owner waits only while it holds
// nothing, so nothing can keep a waiter blocked for long once the others
// are done. The default run takes a few seconds; LOCKGATE_WAITQ_MODEL=30s
// runs longer, LOCKGATE_WAITQ_SEED=n repeats a seed's operation sequences
// (the goroutines' interleaving is the scheduler's).
func TestWaitQueueModel(t *testing.T) {
	t.Parallel() // it mostly waits on the store
	run := 3 * time.Second
	if v := os.Getenv("LOCKGATE_WAITQ_MODEL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LOCKGATE_WAITQ_MODEL: %v", err)
		}
		run = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("LOCKGATE_WAITQ_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LOCKGATE_WAITQ_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("seed %d (LOCKGATE_WAITQ_SEED=%d repeats the operation sequences)", seed, seed)

	cfg := testConfig(t)
	// Polling off: a retry timer of an hour, and leases far longer than
	// the run, so that a holder's expiry does not wake a waiter either.
	cfg.MinPoll, cfg.MaxPoll = time.Hour, time.Hour
	s := openStore(t, cfg)
	m := newWaitModel(t, s, seed)
	m.run(run)
}

// stallBound is how long every owner may stay inside an acquire with no
// operation finishing anywhere before the test calls it a lost wake-up.
// A store round trip takes milliseconds (hundreds under the race detector
// on a loaded host); this is for a broken run, not a measurement.
const stallBound = 15 * time.Second

const (
	modelOwners = 5
	modelIDs    = 4
	modelLease  = 5 * time.Minute
)

type waitModel struct {
	t    *testing.T
	s    *Store
	ns   namespace.Namespace
	seed uint64

	mu      sync.Mutex
	holder  map[int32]int // id -> owner index, in the model
	trace   []string
	failed  bool
	waiting [modelOwners]time.Time // zero: not inside an acquire with wait

	done   atomic.Int64 // operations finished
	ctx    context.Context
	cancel context.CancelFunc
}

func newWaitModel(t *testing.T, s *Store, seed uint64) *waitModel {
	ctx, cancel := context.WithCancel(context.Background())
	return &waitModel{t: t, s: s, ns: namespace.Of("model.c"), seed: seed, holder: make(map[int32]int), ctx: ctx, cancel: cancel}
}

func (m *waitModel) logf(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trace = append(m.trace, fmt.Sprintf("%s "+format, append([]any{time.Now().Format("15:04:05.000000")}, args...)...))
}

// fail reports once, with the trace and the queues, and stops the owners.
func (m *waitModel) fail(format string, args ...any) {
	m.mu.Lock()
	first := !m.failed
	m.failed = true
	tr := slices.Clone(m.trace)
	m.mu.Unlock()
	if !first {
		return
	}
	if len(tr) > 300 {
		tr = tr[len(tr)-300:]
	}
	m.t.Errorf("seed %d: %s\nqueues:\n%s\nlast %d operations:\n%s", m.seed, fmt.Sprintf(format, args...),
		m.queues(), len(tr), strings.Join(tr, "\n"))
	m.cancel()
}

// queues describes the store's wait queues (describeQueues).
func (m *waitModel) queues() string { return describeQueues(m.s.wq) }

func (m *waitModel) run(d time.Duration) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range modelOwners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.owner(i, rand.New(rand.NewPCG(m.seed, uint64(i))), stop)
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()

	end := time.After(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastDone, lastChange := m.done.Load(), time.Now()
	for {
		select {
		case <-finished:
			m.cancel()
			m.t.Logf("%d operations", m.done.Load())
			return
		case <-end:
			close(stop)
			m.logf("stop")
			end = nil
		case now := <-tick.C:
			if n := m.done.Load(); n != lastDone {
				lastDone, lastChange = n, now
				continue
			}
			if now.Sub(lastChange) < stallBound {
				continue
			}
			m.mu.Lock()
			var stuck []string
			for i, since := range m.waiting {
				if !since.IsZero() {
					stuck = append(stuck, fmt.Sprintf("owner %d (waiting %v)", i, now.Sub(since).Round(time.Millisecond)))
				}
			}
			held := len(m.holder)
			m.mu.Unlock()
			m.fail("lost wake-up: nothing finished for %v; %d ids held in the model; blocked: %s", stallBound, held, strings.Join(stuck, ", "))
			<-finished
			return
		}
	}
}

// owner runs random operations until stop. It acquires only while it
// holds nothing, so that owners cannot deadlock on each other.
func (m *waitModel) owner(i int, r *rand.Rand, stop <-chan struct{}) {
	o := newOwner(fmt.Sprintf("o%d", i))
	for {
		select {
		case <-stop:
			return
		case <-m.ctx.Done():
			return
		default:
		}
		want := m.pick(r)
		waitFor := time.Minute
		kind := "acquire"
		if r.IntN(4) == 0 {
			// Fail-fast, as an implicit lock's first try: takes the
			// keys it can in order and rolls them back at the first
			// one held.
			waitFor, kind = 0, "tryAcquire"
		}
		got := m.acquire(i, o, kind, want, waitFor)
		if !got {
			continue
		}
		for r.IntN(3) == 0 {
			m.step(i, "renew", want, func() error {
				_, err := m.s.Renew(m.ctx, o, m.ns, m.docs(want), modelLease)
				return err
			})
		}
		// Release in one or two calls, the model first: once the store
		// has let an id go, another owner may take it at once.
		rest := want
		if len(want) > 1 && r.IntN(2) == 0 {
			k := 1 + r.IntN(len(want)-1)
			m.release(i, o, want[:k])
			rest = want[k:]
		}
		m.release(i, o, rest)
	}
}

// pick returns 1 to 3 distinct ids, in random order.
func (m *waitModel) pick(r *rand.Rand) []int32 {
	n := 1 + r.IntN(3)
	perm := r.Perm(modelIDs)[:n]
	out := make([]int32, n)
	for j, p := range perm {
		out[j] = int32(p + 1)
	}
	return out
}

func (m *waitModel) docs(vs []int32) []docid.ID {
	out := make([]docid.ID, len(vs))
	for j, v := range vs {
		out[j] = rv(m.t, v)
	}
	return out
}

func (m *waitModel) acquire(i int, o Owner, kind string, want []int32, wait time.Duration) bool {
	m.logf("o%d %s %v start", i, kind, want)
	if wait > 0 {
		m.mu.Lock()
		m.waiting[i] = time.Now()
		m.mu.Unlock()
	}
	_, err := m.s.Acquire(m.ctx, o, m.ns, m.docs(want), modelLease, wait)
	m.mu.Lock()
	m.waiting[i] = time.Time{}
	m.mu.Unlock()
	m.done.Add(1)
	if err != nil {
		var he *HeldError
		if m.ctx.Err() != nil || (wait == 0 && errors.As(err, &he)) {
			m.logf("o%d %s %v: %v", i, kind, want, err)
			return false
		}
		m.fail("o%d %s %v: %v", i, kind, want, err)
		return false
	}
	m.mu.Lock()
	var clash []string
	for _, id := range want {
		if h, ok := m.holder[id]; ok {
			clash = append(clash, fmt.Sprintf("%d held by o%d", id, h))
		}
		m.holder[id] = i
	}
	m.mu.Unlock()
	m.logf("o%d %s %v granted", i, kind, want)
	if clash != nil {
		m.fail("o%d was granted %v: %s", i, want, strings.Join(clash, ", "))
		return true
	}
	m.check(i, o, want)
	return true
}

// check: the store shows the grant.
func (m *waitModel) check(i int, o Owner, want []int32) {
	ok, missing, err := m.s.Holds(m.ctx, o, m.ns, m.docs(want), 0)
	if err != nil {
		if m.ctx.Err() == nil {
			m.fail("o%d holds %v: %v", i, want, err)
		}
		return
	}
	if !ok {
		m.fail("o%d was granted %v but the store says it does not hold %v", i, want, missing)
	}
}

func (m *waitModel) release(i int, o Owner, ids []int32) {
	m.mu.Lock()
	for _, id := range ids {
		delete(m.holder, id)
	}
	m.mu.Unlock()
	m.step(i, "release", ids, func() error {
		_, err := m.s.Release(m.ctx, o, m.ns, m.docs(ids), "")
		return err
	})
}

func (m *waitModel) step(i int, kind string, ids []int32, f func() error) {
	m.logf("o%d %s %v", i, kind, ids)
	err := f()
	m.done.Add(1)
	if err != nil && m.ctx.Err() == nil {
		m.fail("o%d %s %v: %v", i, kind, ids, err)
	}
}
