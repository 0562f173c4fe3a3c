package lockstore

import "sync"

// waiter is one Acquire call that is allowed to wait.
type waiter struct {
	rids []string      // record ids it needs, distinct
	kick chan struct{} // buffered(1): "try now"
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
// it needs; everyone joins all their queues at once, under one mutex, so the
// oldest waiter is always first everywhere and waiters whose key sets
// overlap are served in arrival order (FIFO). A local release wakes exactly
// one waiter per released key (the head). This is not a guarantee against
// fail-fast calls (wait 0) or other instances, which may take a freed lock
// first (barging); the woken waiter then waits again at the head.
type waitQueues struct {
	mu sync.Mutex
	q  map[string][]*waiter
}

func newWaitQueues() *waitQueues { return &waitQueues{q: make(map[string][]*waiter)} }

func (wq *waitQueues) join(w *waiter) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range w.rids {
		wq.q[rid] = append(wq.q[rid], w)
	}
	if wq.headLocked(w) {
		w.poke()
	}
}

func (wq *waitQueues) headLocked(w *waiter) bool {
	for _, rid := range w.rids {
		if q := wq.q[rid]; len(q) == 0 || q[0] != w {
			return false
		}
	}
	return true
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
		if wasHead && wq.headLocked(q[0]) {
			q[0].poke()
		}
	}
}

// notify wakes the first waiter for rid, if it is first everywhere: the lock
// was released (or may have been) and it should try now.
func (wq *waitQueues) notify(rids ...string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range rids {
		if q := wq.q[rid]; len(q) > 0 && wq.headLocked(q[0]) {
			q[0].poke()
		}
	}
}

// notifyExcept is notify without waking self.
func (wq *waitQueues) notifyExcept(self *waiter, rids ...string) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, rid := range rids {
		if q := wq.q[rid]; len(q) > 0 && q[0] != self && wq.headLocked(q[0]) {
			q[0].poke()
		}
	}
}

// waiting reports how many waiters are queued for rid (tests).
func (wq *waitQueues) waiting(rid string) int {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	return len(wq.q[rid])
}
