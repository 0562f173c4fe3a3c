package lockstore

import "testing"

func poked(w *waiter) bool {
	select {
	case <-w.kick:
		return true
	default:
		return false
	}
}

// TestWaiterThatCannotProceedYields is issue 12's head-of-line blocking: a
// waiter for [4, "squat"] whose attempt found "squat" held used to keep a
// later waiter for [4] waiting although 4 was free. It now yields 4 until
// "squat" is released; fairness per key stays first come, first served
// among the waiters that can proceed.
func TestWaiterThatCannotProceedYields(t *testing.T) {
	t.Parallel()
	wq := newWaitQueues()
	a := newWaiter([]string{"4", "squat"})
	wq.join(a, 1000)
	if !poked(a) || !wq.isHead(a) {
		t.Fatal("the first waiter is not at the head")
	}
	b := newWaiter([]string{"4"})
	wq.join(b, 1000)
	if poked(b) || wq.isHead(b) {
		t.Fatal("the later waiter for 4 went ahead of the first one before it tried")
	}

	wq.block(a, "squat") // a's attempt: "squat" is held by someone else
	if !poked(b) || !wq.isHead(b) {
		t.Fatal("the waiter for [4] is still held up behind a waiter that cannot proceed")
	}
	wq.leave(b) // b took 4 and left

	wq.notify("squat") // "squat" released
	if !poked(a) || !wq.isHead(a) {
		t.Fatal("the blocked waiter was not woken when its key was released")
	}
	if !wq.startTry(a) {
		t.Fatal("the woken waiter may not try")
	}

	// FIFO per key among waiters that can proceed.
	c := newWaiter([]string{"4"})
	wq.join(c, 1000)
	if poked(c) || wq.isHead(c) {
		t.Fatal("a later waiter overtook one that can proceed")
	}
	wq.leave(a)
	if !poked(c) {
		t.Fatal("the next waiter was not woken when the first left")
	}
}

// TestWaitersPerLockAreBounded: one client cannot queue unbounded work on
// a key (issue 12); a waiter beyond the bound is refused and queues nothing.
func TestWaitersPerLockAreBounded(t *testing.T) {
	t.Parallel()
	wq := newWaitQueues()
	for i := 0; i < 3; i++ {
		if !wq.join(newWaiter([]string{"k"}), 3) {
			t.Fatalf("waiter %d refused under the bound", i)
		}
	}
	if wq.join(newWaiter([]string{"other", "k"}), 3) {
		t.Fatal("a fourth waiter for k was queued")
	}
	if n := wq.waiting("other"); n != 0 {
		t.Errorf("a refused waiter left %d entries on its other keys", n)
	}
}

// TestLeaverFirstForAKeyWakesTheNext: a waiter that gives up while it is
// the first waiter that may take a key, but not first in that key's queue
// (the one ahead is blocked on another key), hands its turn on. The next
// waiter had never tried (it was behind), so it has no retry timer of its
// own and, unwoken, would sleep until its deadline although the key was
// free.
func TestLeaverFirstForAKeyWakesTheNext(t *testing.T) {
	t.Parallel()
	wq := newWaitQueues()
	v := newWaiter([]string{"1", "5"})
	wq.join(v, 1000)
	if !poked(v) || !wq.startTry(v) {
		t.Fatal("the first waiter may not try")
	}
	wq.block(v, "5") // 5 is held elsewhere: v yields 1
	u := newWaiter([]string{"2"})
	wq.join(u, 1000)
	if !poked(u) || !wq.startTry(u) {
		t.Fatal("the waiter for 2 may not try")
	}
	w := newWaiter([]string{"1", "2"})
	wq.join(w, 1000) // first that may take 1, behind u for 2
	a := newWaiter([]string{"1"})
	wq.join(a, 1000)
	if poked(w) || poked(a) {
		t.Fatal("a waiter behind another that can proceed was woken")
	}
	wq.abandon(w) // its wait elapsed
	wq.leave(w)
	if !poked(a) || !wq.isHead(a) {
		t.Fatal("the waiter for 1 was not woken when the waiter ahead of it that could take 1 left")
	}
}

// trying12BehindBlocked sets the scene of the two tests below: x waits
// for [1, 5] and is blocked on 5 (held elsewhere), so it yields 1; w
// waits for [1, 2] behind it and is in its own attempt.
func trying12BehindBlocked(t *testing.T) (wq *waitQueues, x, w *waiter) {
	t.Helper()
	wq = newWaitQueues()
	x = newWaiter([]string{"1", "5"})
	wq.join(x, 1000)
	if !poked(x) || !wq.startTry(x) {
		t.Fatal("the first waiter may not try")
	}
	wq.block(x, "5")
	w = newWaiter([]string{"1", "2"})
	wq.join(w, 1000)
	if !poked(w) || !wq.startTry(w) {
		t.Fatal("the waiter for [1, 2] may not try while the one ahead is blocked")
	}
	return wq, x, w
}

// TestReleaseDuringAttemptIsNotLost: a key released while a waiter's own
// attempt runs, which that attempt then reports held, must not leave the
// waiter marked blocked on it: the release found it trying (and, as it
// was no longer first everywhere, woke nobody), so no later release would
// clear the mark, and the waiter would be skipped in its other queues.
func TestReleaseDuringAttemptIsNotLost(t *testing.T) {
	t.Parallel()
	wq, x, w := trying12BehindBlocked(t)
	wq.notify("5") // x may proceed again, and is ahead of w for 1
	wq.notify("2") // 2, which w's attempt is about to find held, is freed
	wq.block(w, "2")
	poked(w)
	if !poked(x) || !wq.startTry(x) {
		t.Fatal("the waiter ahead was not woken when its key was released")
	}
	wq.leave(x) // x took 1 and 5, and left
	if !poked(w) || !wq.isHead(w) {
		t.Fatal("the waiter whose blocking key was freed during its attempt was not woken when its turn came")
	}
}

// TestReleaseClearsTheBlockedMark is the lost wake-up TestWaitQueueModel
// found: a waiter blocked on 2 yields 1; when 2 is released while the
// waiter ahead of it for 1 may proceed again, that release cannot wake it
// (it is not first everywhere), and when the one ahead leaves, a waiter
// still marked blocked on 2 would be skipped for 1: nobody wakes it, and
// with it every waiter queued behind it.
func TestReleaseClearsTheBlockedMark(t *testing.T) {
	t.Parallel()
	wq, x, w := trying12BehindBlocked(t)
	wq.block(w, "2") // 2 held elsewhere: w yields 1
	wq.notify("5")
	if !poked(x) || !wq.startTry(x) {
		t.Fatal("the waiter ahead was not woken when its key was released")
	}
	wq.notify("2") // w is not first everywhere: x is ahead for 1
	poked(w)
	wq.leave(x) // x took 1 and 5, and left
	if !poked(w) || !wq.isHead(w) {
		t.Fatal("the waiter whose blocking key was released was not woken when its turn came")
	}
}
