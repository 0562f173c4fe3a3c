package lockstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// handoffConfig makes waiters poll so rarely that, in these tests, a
// waiter tries on its own only when woken: a release decides alone
// whether it hands the key over.
func handoffConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.MinPoll, cfg.MaxPoll = 10*time.Minute, 10*time.Minute
	return cfg
}

type acquireResult struct {
	locks []Lock
	err   error
}

// startWaiter starts an Acquire by o that waits up to wait, and returns
// when it is queued, has tried once, and waits idle (a release may hand
// the key over to it): the waiter and where its result will arrive.
func startWaiter(t *testing.T, ctx context.Context, s *Store, o Owner, ns string, id []docid.ID, lease, wait time.Duration) (*waiter, <-chan acquireResult) {
	t.Helper()
	done := make(chan acquireResult, 1)
	go func() {
		ls, err := s.Acquire(ctx, o, namespace.Of(ns), id, lease, wait)
		done <- acquireResult{ls, err}
	}()
	rid := ks(t, ns, id)
	var w *waiter
	testkit.Eventually(t, 20*time.Second, "the waiter to start waiting", func() bool {
		s.wq.mu.Lock()
		defer s.wq.mu.Unlock()
		w = nil
		if q := s.wq.q[rid]; len(q) > 0 && q[len(q)-1].want != nil && q[len(q)-1].want.owner.App == o.App {
			w = q[len(q)-1]
		}
		return w != nil && w.state == stateIdle && w.blockedOn == rid
	})
	return w, done
}

// handoffAwaited returns a channel that receives when a waiter of s that
// gives up finds a handoff to it under way and waits for its outcome.
// Set before the waiter starts.
func handoffAwaited(s *Store) <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.wq.testHookAbandonWaits = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return ch
}

// awaitEvent waits for ch to receive, failing t (and returning) if it does
// not within 20s: the bound of a broken run, not an ordering.
func awaitEvent(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Errorf("timed out waiting for %s", what)
	}
}

func stateOf(s *Store, w *waiter) waiterState {
	s.wq.mu.Lock()
	defer s.wq.mu.Unlock()
	return w.state
}

func result(t *testing.T, done <-chan acquireResult) acquireResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter never returned")
		return acquireResult{}
	}
}

func headOf(t *testing.T, s *Store, rid string) *gen {
	t.Helper()
	h, err := s.head(bg, rid)
	if err != nil || h == nil {
		t.Fatalf("head of %s: %v %v", rid, h, err)
	}
	return h
}

// callerTrips counts the commands a Store sends on behalf of the calls
// whose context came from tag: the Store's own timers (the cache's
// refresh, the heartbeat, the claims scan, all on the Store's context)
// use the same operations, a find among them, and under load a tick fell
// inside the window a test counted (the store-wide round-trip metric
// read 5 where the release and its grant took 2). Commands a call starts
// in the background from its caller's context still carry its tag.
type callerTrips struct {
	n atomic.Int64
}

type callerTripsKey struct{}

func (c *callerTrips) tag(ctx context.Context) context.Context {
	return context.WithValue(ctx, callerTripsKey{}, c)
}

// client connects a client to cfg's deployment that counts the tagged
// calls' commands, for the Store under test (WithClient).
func (c *callerTrips) client(t *testing.T, cfg Config) *mongo.Client {
	t.Helper()
	mon := &event.CommandMonitor{Started: func(ctx context.Context, _ *event.CommandStartedEvent) {
		if ctx.Value(callerTripsKey{}) == c {
			c.n.Add(1)
		}
	}}
	client, err := mongo.Connect(context.Background(), options.Client().ApplyURI(cfg.URI).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}

// TestReleaseHandsOverToLocalWaiter: the release's own generation grants
// the key to the waiter on the same store (token + 1, the waiter's lease),
// so the waiter holds it when the release returns, without a round trip of
// its own.
func TestReleaseHandsOverToLocalWaiter(t *testing.T) {
	t.Parallel()
	cfg := handoffConfig(t)
	var trips callerTrips
	s := openStore(t, cfg, WithClient(trips.client(t, cfg)))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "h")
	rid := ks(t, "db.c", id)
	la := mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	// The waiter's calls are counted too: a grant that left the waiter to
	// take the key itself would show as its round trips.
	w, done := startWaiter(t, trips.tag(bg), s, b, "db.c", id, 30*time.Second, 20*time.Second)

	before := trips.n.Load()
	if n, err := s.Release(trips.tag(bg), a, namespace.Of("db.c"), id, "boom"); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	if st := stateOf(s, w); st != stateGranted {
		t.Fatalf("when the release returned the waiter was in state %d, not granted", st)
	}
	r := result(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := trips.n.Load() - before; got != 2 {
		t.Fatalf("release and grant took %v lock store round trips, want 2 (claim and head)", got)
	}
	lb := r.locks[0]
	if lb.Token != la[0].Token+1 || lb.LastError != "boom" {
		t.Fatalf("handed lock %+v, want token %d and lastError boom", lb, la[0].Token+1)
	}
	h := headOf(t, s, rid)
	now, _ := s.clock.Now()
	if h.Kind != kindHandoff || !h.ownedBy(b) || h.Token != lb.Token || !h.ExpiresAt.Equal(lb.ExpiresAt) ||
		h.ExpiresAt.Sub(now) < 20*time.Second {
		t.Fatalf("head after the handoff: %+v", h)
	}
	if ok, _, _ := s.Holds(bg, b, namespace.Of("db.c"), id, 0); !ok {
		t.Fatal("the waiter does not hold the lock")
	}
	if ok, _, _ := s.Holds(bg, a, namespace.Of("db.c"), id, 0); ok {
		t.Fatal("the releaser still holds the lock")
	}
	if got := testutil.ToFloat64(s.m.handoffs); got != 1 {
		t.Fatalf("handoffs metric %v", got)
	}
	if _, err := s.Acquire(bg, newOwner("c"), namespace.Of("db.c"), id, time.Minute, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third owner: %v, want busy", err)
	}
}

// TestHandoffLosesToTakeoverThroughAnotherStore: while a release is about
// to hand an expired lock to a local waiter, another instance takes the
// lock over. The claim decides: the other instance holds it, the release
// frees nothing, the waiter is not granted and keeps waiting.
func TestHandoffLosesToTakeoverThroughAnotherStore(t *testing.T) {
	t.Parallel()
	cfg := handoffConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	clk := newFakeClock()
	s1, s2 := openStore(t, cfg, WithClock(clk)), openStore(t, cfg, WithClock(clk))
	a, b, c := newOwner("a"), newOwner("b"), newOwner("c")
	id := ids(t, "race")
	rid := ks(t, "db.c", id)
	la := mustAcquire(t, s1, a, "db.c", id, time.Minute, 0)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	w, done := startWaiter(t, ctx, s1, b, "db.c", id, time.Minute, time.Minute)

	var lc []Lock
	s1.testHookHandoff = func(string) {
		clk.Advance(2*time.Minute + s1.cfg.TakeoverGrace)
		lc = mustAcquire(t, s2, c, "db.c", id, time.Minute, 0)
	}
	n, err := s1.Release(bg, a, namespace.Of("db.c"), id, "")
	s1.testHookHandoff = nil
	if err != nil || n != 0 {
		t.Fatalf("release after the takeover: %d %v, want 0 freed", n, err)
	}
	if lc[0].Token != la[0].Token+1 {
		t.Fatalf("takeover token %d, want %d", lc[0].Token, la[0].Token+1)
	}
	if st := stateOf(s1, w); st == stateGranted || st == stateHanding {
		t.Fatalf("the waiter is in state %d after a lost handoff", st)
	}
	h := headOf(t, s1, rid)
	if !h.ownedBy(c) || h.Kind != kindAcquire || h.Token != lc[0].Token {
		t.Fatalf("head: %+v, want c's acquire", h)
	}
	if ok, _, _ := s1.Holds(bg, b, namespace.Of("db.c"), id, 0); ok {
		t.Fatal("the waiter holds the lock the other instance took")
	}
	cancel()
	if r := result(t, done); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter: %v %v, want cancelled", r.locks, r.err)
	}
	if got := testutil.ToFloat64(s1.m.handoffs); got != 0 {
		t.Fatalf("handoffs metric %v", got)
	}
}

// TestHandoffOfExpiredLease: a release of the owner's own lock after its
// lease ended (nobody took it over) hands it over like any release, with
// a fresh lease for the waiter.
func TestHandoffOfExpiredLease(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	s := openStore(t, handoffConfig(t), WithClock(clk))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "expired")
	la := mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	_, done := startWaiter(t, bg, s, b, "db.c", id, 30*time.Second, time.Minute)
	clk.Advance(2*time.Minute + s.cfg.TakeoverGrace)
	if n, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	r := result(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	now, _ := clk.Now()
	if r.locks[0].Token != la[0].Token+1 || !r.locks[0].ExpiresAt.Equal(now.Add(30*time.Second)) {
		t.Fatalf("handed lock %+v, want token %d until %v", r.locks[0], la[0].Token+1, now.Add(30*time.Second))
	}
}

// TestHandoffToWaiterWhoseCallerLeft: the waiter's caller goes away (its
// connection closed) while the release is writing the handoff. The waiter
// learns the outcome and releases the lock again: nobody is left holding a
// lock that no client will ever release.
func TestHandoffToWaiterWhoseCallerLeft(t *testing.T) {
	t.Parallel()
	s := openStore(t, handoffConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "gone")
	rid := ks(t, "db.c", id)
	la := mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	waits := handoffAwaited(s)
	_, done := startWaiter(t, ctx, s, b, "db.c", id, time.Minute, time.Minute)
	s.testHookHandoff = func(string) {
		cancel()
		// The handoff is written only once the waiter, giving up, waits
		// for its outcome.
		awaitEvent(t, waits, "the waiter to give up during the handoff")
	}
	if n, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	s.testHookHandoff = nil
	if r := result(t, done); !errors.Is(r.err, context.Canceled) || r.locks != nil {
		t.Fatalf("waiter: %v %v, want cancelled", r.locks, r.err)
	}
	h := headOf(t, s, rid)
	if h.Owner != nil {
		t.Fatalf("the lock is held after its waiter left: %+v", h)
	}
	if h.Token != la[0].Token+1 {
		t.Fatalf("token %d, want %d (the handoff's, kept by the release)", h.Token, la[0].Token+1)
	}
	if l := mustAcquire(t, s, newOwner("d"), "db.c", id, time.Minute, 0); l[0].Token <= h.Token {
		t.Fatalf("next token %d, want above %d", l[0].Token, h.Token)
	}
}

// TestHandoffToWaiterWhoseWaitElapsed: the wait ends while the handoff is
// being written. The waiter is told the truth: it holds the lock (like an
// attempt of its own that was under way at the deadline).
func TestHandoffToWaiterWhoseWaitElapsed(t *testing.T) {
	t.Parallel()
	s := openStore(t, handoffConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "late")
	mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	// The wait is long enough for the release below to find the waiter
	// still waiting; the handoff is written only once the wait has ended
	// and the waiter, giving up, waits for its outcome.
	const wait = time.Second
	waits := handoffAwaited(s)
	_, done := startWaiter(t, bg, s, b, "db.c", id, time.Minute, wait)
	s.testHookHandoff = func(string) { awaitEvent(t, waits, "the waiter's wait to end during the handoff") }
	if n, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	s.testHookHandoff = nil
	r := result(t, done)
	held, _, _ := s.Holds(bg, b, namespace.Of("db.c"), id, 0)
	if r.err != nil || !held {
		t.Fatalf("waiter: %v %v, holds %v: the answer and the store disagree", r.locks, r.err, held)
	}
}

// TestNoHandoffToWaiterNotIdle: only an idle waiter for one key, whose
// caller is still there, is handed a key.
func TestNoHandoffToWaiterNotIdle(t *testing.T) {
	t.Parallel()
	wq := newWaitQueues()
	ctx, cancel := context.WithCancel(bg)
	single := func() *waiter {
		w := newWaiter([]string{"k"})
		w.want = &handoffWant{ctx: ctx}
		return w
	}
	multi := newWaiter([]string{"j", "k"})
	wq.join(multi, 10)
	if wq.takeForHandoff("k") != nil {
		t.Fatal("a waiter for two keys was taken")
	}
	wq.leave(multi)
	w := single()
	wq.join(w, 10)
	if !wq.startTry(w) || wq.takeForHandoff("k") != nil {
		t.Fatal("a waiter in its own attempt was taken")
	}
	wq.block(w, "k")
	later := single()
	wq.join(later, 10)
	if x := wq.takeForHandoff("k"); x != w {
		t.Fatalf("took %p, want the first waiter %p", x, w)
	}
	if wq.startTry(w) || wq.takeForHandoff("k") != nil {
		t.Fatal("a waiter being handed a key may try, or was taken twice")
	}
	gaveUp := make(chan bool)
	go func() { gaveUp <- wq.abandon(w) }()
	wq.handoffDone(w, handoffResult{})
	if <-gaveUp {
		t.Fatal("abandon reported a grant after a failed handoff")
	}
	if wq.takeForHandoff("k") != nil {
		t.Fatal("a waiter that gave up was taken")
	}
	wq.leave(w)
	cancel()
	if wq.takeForHandoff("k") != nil {
		t.Fatal("a waiter whose caller is gone was taken")
	}
}

// TestNoHandoffWithinOneSession: a release by the waiter's own session
// (another binding, or endSessions) only frees the key.
func TestNoHandoffWithinOneSession(t *testing.T) {
	t.Parallel()
	o := newOwner("a")
	x := newWaiter([]string{"k"})
	x.want = &handoffWant{owner: Owner{Session: o.Session, Bind: "other"}, lease: time.Minute}
	release := func(h *gen, now time.Time, _ time.Duration) (*gen, error) {
		n := h.next(kindRelease, now)
		n.Owner = nil
		return n, nil
	}
	h := &gen{Key: "k", Seq: 3, Token: 7, Owner: sessionBinary(o.Session)}
	n, _ := handoffStep(release, x)(h, time.Now(), 0)
	if n.Kind != kindRelease || n.Owner != nil || n.Token != 7 {
		t.Fatalf("step gave %+v, want a plain release", n)
	}
	x.want.owner = newOwner("b")
	n, _ = handoffStep(release, x)(h, time.Now(), 0)
	if n.Kind != kindHandoff || !n.ownedBy(x.want.owner) || n.Token != 8 {
		t.Fatalf("step gave %+v, want a handoff to b with token 8", n)
	}
}
