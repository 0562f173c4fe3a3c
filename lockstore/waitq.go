package lockstore

import "sync"

// waiter is one Acquire call that is allowed to wait.
type waiter struct {
	rids []string      // record ids it needs, distinct
	kick chan struct{} // buffered(1): "try now"
	// want is set for a waiter of one key: what a release through this
	// Store needs to hand the key over to it directly (handoff.go). nil
	// for waiters of several keys, which are woken instead.
	want *handoffWant
	// handed receives the lock a release handed over (buffered(1); at
	// most once).
	handed chan handoffResult
	// state is what the waiter is doing (under waitQueues.mu).
	state waiterState
	// blockedOn is the record id its last attempt found held by someone
	// who is not waiting here (under waitQueues.mu; "" when none). While
	// it is set the waiter cannot proceed, so it yields its place in the
	// queues of its other keys: a waiter that can proceed is never held
	// up behind one that cannot.
	blockedOn string
	// freed is set when a release of one of its keys came while its own
	// attempt ran (under waitQueues.mu): the refusal the attempt ends with
	// may name a key that is free by now, and that release's wake-up found
	// it trying, so block must not mark it blocked on that key (nothing
	// would clear the mark) but let it try again.
	freed bool
	// who is what Store.Waiters shows of it; set before join, then only
	// read.
	who Waiter
}

// waiterState is the life of a waiter, under waitQueues.mu. A release
// hands a key over only to an idle waiter, and only the releaser moves it
// out of stateHanding, so a waiter never tries on its own while a handoff
// to it is under way, and never leaves without learning its outcome.
type waiterState uint8

const (
	stateIdle    waiterState = iota // waiting; a release may hand over to it
	stateTrying                     // its own attempt (acquireAll) runs
	stateHanding                    // a release is writing the handoff to it
	stateGranted                    // a handoff gave it the key; result in handed
	stateGone                       // gave up; no handoff may start
)

func newWaiter(rids []string) *waiter {
	return &waiter{rids: rids, kick: make(chan struct{}, 1), handed: make(chan handoffResult, 1)}
}

func (w *waiter) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// waitQueues keeps, per record id, the local waiters in arrival order.
//
// Fairness guarantee: among waiting Acquire calls on one Store, a waiter
// tries to take its locks only while it is first in the queue of every key
// it needs, not counting waiters that cannot proceed: a waiter whose last
// attempt found one of its keys held yields its other keys until that key
// is released, so a waiter for [4] is not delayed by an older waiter for
// [4, "squat"] while "squat" is held. Among waiters that can proceed,
// those whose key sets overlap are served in arrival order (FIFO per key).
// A local release wakes exactly one waiter per released key. This is not a
// guarantee against fail-fast calls (wait 0) or other instances, which may
// take a freed lock first (barging); the woken waiter then waits again.
type waitQueues struct {
	mu sync.Mutex
	q  map[string][]*waiter
	// settled is signalled when a handoff ends (abandon waits on it).
	settled *sync.Cond
	// testHookAbandonWaits, when set, runs (with mu held) when a waiter
	// giving up finds a handoff to it under way, before it waits for the
	// handoff's outcome.
	testHookAbandonWaits func()
}

func newWaitQueues() *waitQueues {
	wq := &waitQueues{q: make(map[string][]*waiter)}
	wq.settled = sync.NewCond(&wq.mu)
	return wq
}

// join queues w on every key it needs, unless one of them already has
// max waiters (then nothing is queued and it returns false).
func (wq *waitQueues) join(w *waiter, max int) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range w.rids {
		if len(wq.q[rid]) >= max {
			return false
		}
	}
	for _, rid := range w.rids {
		wq.q[rid] = append(wq.q[rid], w)
	}
	if wq.headLocked(w) {
		w.poke()
	}
	return true
}

func (wq *waitQueues) headLocked(w *waiter) bool {
	for _, rid := range w.rids {
		if wq.firstLocked(rid, w) != w {
			return false
		}
	}
	return true
}

// firstLocked is the first waiter for rid that may take it now: w itself
// (asking on its own behalf), or one not blocked on another key.
func (wq *waitQueues) firstLocked(rid string, w *waiter) *waiter {
	for _, x := range wq.q[rid] {
		if x == w || x.blockedOn == "" || x.blockedOn == rid {
			return x
		}
	}
	return nil
}

// wakeLocked pokes the waiter that may take rid now, if it may take all
// its keys.
func (wq *waitQueues) wakeLocked(rid string, except *waiter) {
	if x := wq.firstLocked(rid, nil); x != nil && x != except && wq.headLocked(x) {
		x.poke()
	}
}

// block records that w's attempt found rid held by someone not waiting
// here (rid "" when the refusal names none of its keys); w yields its
// other keys, whose next waiters are woken. w is idle again: a release
// may hand a key over to it from now on.
func (wq *waitQueues) block(w *waiter, rid string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	w.state = stateIdle
	if w.freed {
		w.freed = false
		w.blockedOn = ""
		w.poke()
		return
	}
	w.blockedOn = rid
	if rid == "" {
		return
	}
	for _, r := range w.rids {
		if r != rid {
			wq.wakeLocked(r, w)
		}
	}
}

// startTry tells whether w may try now: it is first everywhere and no
// handoff to it is under way or done. If so, w takes its places back and
// no release hands a key over to it until block.
func (wq *waitQueues) startTry(w *waiter) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if w.state == stateHanding || w.state == stateGranted || !wq.headLocked(w) {
		return false
	}
	w.blockedOn = ""
	w.freed = false
	w.state = stateTrying
	return true
}

// isHead tells whether w may try now (tests).
func (wq *waitQueues) isHead(w *waiter) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	return wq.headLocked(w)
}

// takeForHandoff returns the waiter that a release of rid may hand the key
// over to, marked stateHanding, or nil: the waiter a release would wake
// (first for rid and first everywhere), if it waits for rid alone, is idle
// and its caller is still there. The caller must call handoffDone with it.
func (wq *waitQueues) takeForHandoff(rid string) *waiter {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	x := wq.firstLocked(rid, nil)
	if x == nil || x.want == nil || x.state != stateIdle || x.want.ctx.Err() != nil || !wq.headLocked(x) {
		return nil
	}
	x.state = stateHanding
	return x
}

// handoffDone ends a handoff to w: granted (the result goes to w.handed),
// or not (w then tries on its own at once, like a woken waiter).
func (wq *waitQueues) handoffDone(w *waiter, r handoffResult) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if r.granted {
		w.state = stateGranted
		w.handed <- r // never blocks: a waiter is granted at most once
	} else {
		w.state = stateIdle
		w.poke()
	}
	wq.settled.Broadcast()
}

// abandon is w giving up (wait elapsed, caller gone, store closed). If a
// handoff to w is under way it waits for its outcome (one lock store
// operation, bounded by OpTimeout per round trip) and returns true when
// w was granted the key: the result is in w.handed. Otherwise no handoff
// to w can start any more.
func (wq *waitQueues) abandon(w *waiter) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if w.state == stateHanding && wq.testHookAbandonWaits != nil {
		wq.testHookAbandonWaits()
	}
	for w.state == stateHanding {
		wq.settled.Wait()
	}
	if w.state == stateGranted {
		return true
	}
	w.state = stateGone
	return false
}

// leave removes w and wakes the waiters that became first everywhere.
// What w held up is its turn as the first waiter that may take a key,
// which it can have without being first in the queue (those ahead of it
// may be blocked on other keys): a waiter behind it that never tried has
// no retry timer, and only this wake-up tells it its turn came.
func (wq *waitQueues) leave(w *waiter) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range w.rids {
		wasFirst := wq.firstLocked(rid, nil) == w
		q := wq.q[rid]
		for i, x := range q {
			if x == w {
				q = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		if len(q) == 0 {
			delete(wq.q, rid)
			continue
		}
		wq.q[rid] = q
		if wasFirst || w.blockedOn != "" {
			wq.wakeLocked(rid, nil)
		}
	}
}

// notify wakes the first waiter for rid, if it is first everywhere: the lock
// was released (or may have been) and it should try now.
func (wq *waitQueues) notify(rids ...string) {
	wq.notifyExcept(nil, rids...)
}

// notifyExcept is notify without waking self. A waiter blocked on rid is
// no longer known to be blocked: it takes its places back in the queues
// of its other keys, where it is woken in its turn, for this wake-up may
// not reach it (it need not be first everywhere now). A waiter in its
// own attempt is told that a key of its was freed meanwhile (block); self
// is not, as its own rollback frees only keys it took.
func (wq *waitQueues) notifyExcept(self *waiter, rids ...string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range rids {
		for _, x := range wq.q[rid] {
			switch {
			case x.blockedOn == rid:
				x.blockedOn = ""
			case x.state == stateTrying && x != self:
				x.freed = true
			}
		}
		wq.wakeLocked(rid, self)
	}
}

// list copies what an operator sees of the waiters queued for rid.
func (wq *waitQueues) list(rid string) []Waiter {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	q := wq.q[rid]
	if len(q) == 0 {
		return nil
	}
	out := make([]Waiter, len(q))
	for i, w := range q {
		out[i] = w.who
	}
	return out
}

// waiting reports how many waiters are queued for rid (tests).
func (wq *waitQueues) waiting(rid string) int {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	return len(wq.q[rid])
}
