package lockstore

import "sync"

// waiter is one Acquire call that is allowed to wait.
type waiter struct {
	rids []string      // record ids it needs, distinct
	kick chan struct{} // buffered(1): "try now"
	// blockedOn is the record id its last attempt found held by someone
	// who is not waiting here (under waitQueues.mu; "" when none). While
	// it is set the waiter cannot proceed, so it yields its place in the
	// queues of its other keys: a waiter that can proceed is never held
	// up behind one that cannot.
	blockedOn string
}

func newWaiter(rids []string) *waiter {
	return &waiter{rids: rids, kick: make(chan struct{}, 1)}
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
}

func newWaitQueues() *waitQueues { return &waitQueues{q: make(map[string][]*waiter)} }

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
// here; w yields its other keys, whose next waiters are woken.
func (wq *waitQueues) block(w *waiter, rid string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	w.blockedOn = rid
	for _, r := range w.rids {
		if r != rid {
			wq.wakeLocked(r, w)
		}
	}
}

// unblock: w is about to try again, and takes its places back.
func (wq *waitQueues) unblock(w *waiter) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	w.blockedOn = ""
}

// isHead tells whether w may try now.
func (wq *waitQueues) isHead(w *waiter) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	return wq.headLocked(w)
}

// leave removes w and wakes the waiters that became first everywhere.
func (wq *waitQueues) leave(w *waiter) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range w.rids {
		q := wq.q[rid]
		wasHead := len(q) > 0 && q[0] == w
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
		if wasHead || w.blockedOn != "" {
			wq.wakeLocked(rid, nil)
		}
	}
}

// notify wakes the first waiter for rid, if it is first everywhere: the lock
// was released (or may have been) and it should try now.
func (wq *waitQueues) notify(rids ...string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range rids {
		wq.wakeLocked(rid, nil)
	}
}

// notifyExcept is notify without waking self.
func (wq *waitQueues) notifyExcept(self *waiter, rids ...string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range rids {
		wq.wakeLocked(rid, self)
	}
}

// waiting reports how many waiters are queued for rid (tests).
func (wq *waitQueues) waiting(rid string) int {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	return len(wq.q[rid])
}
