package lockstore

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitQueuesFast drives the wait queues as acquireWait does (join,
// wait for a kick, startTry, take the keys in order, roll back and block
// at the first one held, leave), with the lock store replaced by a map,
// so that it runs hundreds of thousands of operations where
// TestWaitQueueModel, on FerretDB, runs hundreds. There is no poll: a
// waiter wakes only when poked. Fail-fast attempts roll back with no
// waiter of their own (notifyExcept(nil, …)), as an implicit lock's first
// try does. When no operation finishes for fastStall while some owner
// waits, a wake-up was lost: the test prints the seed, the queues and the
// last operations. The keys are taken by one owner at a time (the map
// says so), so what it checks is liveness, and at the end that the
// queues are empty. LOCKGATE_WAITQ_MODEL and LOCKGATE_WAITQ_SEED as for
// TestWaitQueueModel; the default run is one second per seed, three seeds.
func TestWaitQueuesFast(t *testing.T) {
	run := time.Second
	if v := os.Getenv("LOCKGATE_WAITQ_MODEL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LOCKGATE_WAITQ_MODEL: %v", err)
		}
		run = d
	}
	seeds := []uint64{uint64(time.Now().UnixNano()), 1, 2}
	if v := os.Getenv("LOCKGATE_WAITQ_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LOCKGATE_WAITQ_SEED: %v", err)
		}
		seeds = []uint64{n}
	}
	for _, seed := range seeds {
		if !runFastModel(t, seed, run) {
			return
		}
	}
}

// fastStall is how long no operation may finish, while an owner waits,
// before the fast model calls it a lost wake-up. An operation is a few
// map writes; this is generous even for a loaded host under -race.
const fastStall = 5 * time.Second

type fastModel struct {
	t    *testing.T
	seed uint64
	wq   *waitQueues

	mu      sync.Mutex
	held    map[string]int // the lock store: key -> owner
	trace   [256]string    // ring of the last operations
	n       int
	waiting [modelOwners]bool

	done   atomic.Int64
	failed atomic.Bool
	stop   atomic.Bool
}

func (m *fastModel) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	m.mu.Lock()
	m.trace[m.n%len(m.trace)] = s
	m.n++
	m.mu.Unlock()
}

func (m *fastModel) lastOps() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for i := max(0, m.n-len(m.trace)); i < m.n; i++ {
		b.WriteString(m.trace[i%len(m.trace)])
		b.WriteByte('\n')
	}
	return b.String()
}

// runFastModel runs one seed and reports whether it passed.
func runFastModel(t *testing.T, seed uint64, d time.Duration) bool {
	m := &fastModel{t: t, seed: seed, wq: newWaitQueues(), held: map[string]int{}}
	var wg sync.WaitGroup
	for i := range modelOwners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.owner(i, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	end := time.After(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastDone, lastChange := m.done.Load(), time.Now()
	for {
		select {
		case <-finished:
			m.wq.mu.Lock()
			left := len(m.wq.q)
			m.wq.mu.Unlock()
			if left != 0 {
				t.Errorf("seed %d: %d keys still have queues after every waiter left:\n%s", seed, left, describeQueues(m.wq))
				return false
			}
			t.Logf("seed %d: %d operations", seed, m.done.Load())
			return true
		case <-end:
			m.stop.Store(true)
			end = nil
		case now := <-tick.C:
			if n := m.done.Load(); n != lastDone {
				lastDone, lastChange = n, now
				continue
			}
			if now.Sub(lastChange) < fastStall {
				continue
			}
			m.mu.Lock()
			var stuck []string
			for i, w := range m.waiting {
				if w {
					stuck = append(stuck, fmt.Sprintf("o%d", i))
				}
			}
			held := len(m.held)
			m.mu.Unlock()
			t.Errorf("seed %d (LOCKGATE_WAITQ_SEED=%d repeats the operation sequences): lost wake-up: nothing finished for %v; %d keys held; waiting: %s\nqueues:\n%s\nlast operations:\n%s",
				seed, seed, fastStall, held, strings.Join(stuck, ", "), describeQueues(m.wq), m.lastOps())
			m.failed.Store(true)
			m.stop.Store(true)
			// Let the stuck owners see the failure and leave.
			m.wq.mu.Lock()
			for _, q := range m.wq.q {
				for _, w := range q {
					w.poke()
				}
			}
			m.wq.mu.Unlock()
			<-finished
			return false
		}
	}
}

// describeQueues is a failure's dump of wq: per key, each waiter's keys,
// the key it is blocked on, its state and whether a release found it
// trying.
func describeQueues(wq *waitQueues) string {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	var b strings.Builder
	for _, rid := range slices.Sorted(maps.Keys(wq.q)) {
		fmt.Fprintf(&b, "  %q:", rid)
		for _, w := range wq.q[rid] {
			fmt.Fprintf(&b, " [%s %v blockedOn=%q state=%d freed=%v]", w.who.App, w.rids, w.blockedOn, w.state, w.freed)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// owner acquires (waiting three times in four), holds a little, and
// releases in one or two calls; it acquires only while it holds nothing.
func (m *fastModel) owner(i int, r *rand.Rand) {
	for !m.stop.Load() {
		n := 1 + r.IntN(3)
		keys := make([]string, n)
		for j, p := range r.Perm(modelIDs)[:n] {
			keys[j] = strconv.Itoa(p + 1)
		}
		slices.Sort(keys) // acquireAll takes keys in one order
		var ok bool
		if r.IntN(4) == 0 {
			ok = m.tryAll(i, keys, nil) == ""
			m.logf("o%d try %v: %v", i, keys, ok)
			m.done.Add(1)
		} else {
			ok = m.acquireWait(i, keys, r)
		}
		if !ok {
			continue
		}
		for range r.IntN(3) {
			runtime.Gosched()
		}
		rest := keys
		if n > 1 && r.IntN(2) == 0 {
			k := 1 + r.IntN(n-1)
			m.release(i, keys[:k])
			rest = keys[k:]
		}
		m.release(i, rest)
	}
}

// tryAll takes keys in order; at the first held one it releases those it
// took, wakes their waiters (not self) and returns the held key.
func (m *fastModel) tryAll(i int, keys []string, self *waiter) string {
	var took []string
	for _, k := range keys {
		m.mu.Lock()
		_, busy := m.held[k]
		if !busy {
			m.held[k] = i
		}
		m.mu.Unlock()
		if busy {
			if len(took) > 0 {
				m.mu.Lock()
				for _, k := range took {
					delete(m.held, k)
				}
				m.mu.Unlock()
				m.wq.notifyExcept(self, took...)
			}
			return k
		}
		took = append(took, k)
		runtime.Gosched() // another owner may release or try between keys
	}
	return ""
}

func (m *fastModel) acquireWait(i int, keys []string, r *rand.Rand) bool {
	w := newWaiter(keys)
	w.who = Waiter{App: fmt.Sprintf("o%d", i)}
	if !m.wq.join(w, 1000) {
		m.t.Errorf("join refused")
		return false
	}
	defer m.wq.leave(w)
	m.mu.Lock()
	m.waiting[i] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.waiting[i] = false
		m.mu.Unlock()
	}()
	m.logf("o%d wait %v", i, keys)
	for {
		<-w.kick
		if m.failed.Load() {
			return false
		}
		if !m.wq.startTry(w) {
			continue
		}
		blocked := m.tryAll(i, keys, w)
		if blocked == "" {
			m.logf("o%d got %v", i, keys)
			m.done.Add(1)
			return true
		}
		if r.IntN(2) == 0 {
			runtime.Gosched() // a release may land before block
		}
		m.logf("o%d blocked on %s", i, blocked)
		m.wq.block(w, blocked)
	}
}

func (m *fastModel) release(i int, keys []string) {
	m.mu.Lock()
	for _, k := range keys {
		if m.held[k] != i {
			m.mu.Unlock()
			m.t.Errorf("o%d releases %s held by o%d", i, k, m.held[k])
			return
		}
		delete(m.held, k)
	}
	m.mu.Unlock()
	m.logf("o%d release %v", i, keys)
	m.wq.notify(keys...)
	m.done.Add(1)
}
