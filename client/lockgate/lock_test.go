package lockgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/client/lockgate"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/testkit"
)

func proxyURI(g *gateway.Gateway) string { return "mongodb://" + g.ProxyAddr().String() + "/" }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The "done when": auto-renew keeps a lock through three lease
// periods while the session writes under it, and Lost fires within one
// lease once the lock store stops answering (its connection cut).
func TestAutoRenewKeepsLockThenLostWhenLockStoreStops(t *testing.T) {
	r := testkit.StartRelay(t, upstream.Addr())
	g := startGateway(t, r.URI())
	c := connect(t, proxyURI(g), "kit-worker")
	other := connect(t, proxyURI(g), "kit-other")
	coll := c.Database("kit").Collection("renew")
	ctx := ctxFor(t, 90*time.Second)
	sess := startSession(t, c)

	// Renewed every lease/3, the lease keeps more than the policy's
	// default leaseMargin (1s) ahead of every write.
	const lease = 4 * time.Second
	l, err := lockgate.Acquire(ctx, sess, coll, []any{"job-1"}, &lockgate.Options{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	tok := l.Token()
	if tok == 0 {
		t.Fatalf("no fencing token: %+v", l.Locks())
	}
	// Write in the caller's session the whole time: renewals run on their
	// own goroutine, and under -race this shows they never share the
	// caller's Session value.
	sc := mongo.NewSessionContext(ctx, sess)
	start := time.Now()
	for i := 0; time.Since(start) < 3*lease+lease/3; i++ {
		if _, err := coll.UpdateOne(sc, bson.M{"_id": "job-1"}, bson.M{"$set": bson.M{"n": i, "fence": tok}}, options.Update().SetUpsert(true)); err != nil {
			t.Fatalf("write %d, %v after acquiring, refused under the renewed lock: %v", i, time.Since(start), err)
		}
		select {
		case <-l.Lost():
			t.Fatalf("lost after %v: %v", time.Since(start), l.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	osess := startSession(t, other)
	if _, err := lockgate.TryAcquire(ctx, osess, other.Database("kit").Collection("renew"), []any{"job-1"}, nil); !errors.Is(err, lockgate.ErrBusy) {
		t.Fatalf("another session after %v (over three leases): got %v, want ErrBusy", time.Since(start), err)
	}
	if l.Token() != tok {
		t.Fatalf("token moved from %d to %d while renewing", tok, l.Token())
	}

	r.Cut()
	cut := time.Now()
	select {
	case <-l.Lost():
	case <-time.After(3 * lease):
		t.Fatalf("Lost did not fire within %v of the lock store going away", 3*lease)
	}
	if el := time.Since(cut); el > lease {
		t.Fatalf("Lost fired %v after the lock store stopped answering, want within one lease (%v)", el, lease)
	}
	if !errors.Is(l.Err(), lockgate.ErrLost) || l.Context().Err() == nil {
		t.Fatalf("after loss: Err %v, Context().Err %v", l.Err(), l.Context().Err())
	}
	t.Logf("lost %v after the cut: %v", time.Since(cut), l.Err())
	r.Restore(t)
	if err := l.Release(ctx, ""); !errors.Is(err, lockgate.ErrNotHeld) && err != nil {
		t.Errorf("Release after the loss: %v", err)
	}
}

// The control for the test above: without renewal the same lease ends,
// Lost says so, and another session can take the lock.
func TestWithoutRenewalTheLeaseEnds(t *testing.T) {
	g := startGateway(t, "")
	c := connect(t, proxyURI(g), "kit-worker")
	other := connect(t, proxyURI(g), "kit-other")
	ctx := ctxFor(t, 60*time.Second)
	const lease = time.Second
	l, err := lockgate.Acquire(ctx, startSession(t, c), c.Database("kit").Collection("norenew"), []any{1}, &lockgate.Options{Lease: lease, NoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(3 * lease):
		t.Fatal("Lost did not fire when the lease ran out")
	}
	if !errors.Is(l.Err(), lockgate.ErrLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	osess := startSession(t, other)
	var l2 *lockgate.Lock
	testkit.Eventually(t, 3*lease, "the unrenewed lock to be free after its lease", func() bool {
		var err error
		l2, err = lockgate.TryAcquire(ctx, osess, other.Database("kit").Collection("norenew"), []any{1}, nil)
		if err != nil && !errors.Is(err, lockgate.ErrBusy) {
			t.Fatalf("taking over the unrenewed lock: %v", err)
		}
		return err == nil
	})
	if l2.Token() <= l.Token() {
		t.Errorf("token after takeover %d, want above %d", l2.Token(), l.Token())
	}
	l2.Release(ctx, "")
	l.Release(ctx, "")
}

func TestTypedErrorsBusyAndTimeout(t *testing.T) {
	g := startGateway(t, "")
	a := connect(t, proxyURI(g), "kit-holder")
	b := connect(t, proxyURI(g), "kit-waiter")
	ctx := ctxFor(t, 60*time.Second)
	la, err := lockgate.TryAcquire(ctx, startSession(t, a), a.Database("kit").Collection("busy"), []any{7, 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer la.Release(ctx, "")
	if n := len(la.Locks()); n != 2 {
		t.Fatalf("locks %d, want 2", n)
	}
	bs := startSession(t, b)
	bc := b.Database("kit").Collection("busy")
	_, err = lockgate.TryAcquire(ctx, bs, bc, []any{8}, nil)
	var e *lockgate.Error
	if !errors.Is(err, lockgate.ErrBusy) || !errors.As(err, &e) || e.Code != 46 || e.Holder == nil || e.Holder.App != "kit-holder" {
		t.Fatalf("TryAcquire of a held lock: %v (%+v)", err, e)
	}
	// The holder's tag as its own Lock reports it is the one a refusal
	// names (issue 26, item 2: one name for it everywhere).
	if tag := la.HolderTag(); len(tag) != 8 || e.Holder.Tag != tag {
		t.Errorf("the refusal names holder tag %q, the holder's Lock says %q; want the same 8 hex digits", e.Holder.Tag, tag)
	}
	start := time.Now()
	_, err = lockgate.Acquire(ctx, bs, bc, []any{8}, &lockgate.Options{Wait: 300 * time.Millisecond})
	if !errors.Is(err, lockgate.ErrTimeout) || errors.Is(err, lockgate.ErrBusy) {
		t.Fatalf("Acquire with Wait of a held lock: %v", err)
	}
	// The wait is measured on lockgate's clock; allow for the round trip.
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("timed out after %v, before the wait", el)
	}
	// A waiter gets the lock when the holder releases.
	got := make(chan error, 1)
	go func() {
		l, err := lockgate.Acquire(ctx, bs, bc, []any{8}, &lockgate.Options{Wait: 10 * time.Second})
		if err == nil {
			err = l.Release(ctx, "")
		}
		got <- err
	}()
	// Released once the waiter queues, so that the release wakes it.
	testkit.Eventually(t, 10*time.Second, "the waiter to queue", func() bool { return localWaiters(t, g) > 0 })
	if err := la.Release(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestWithLockRunsInSessionAndAlwaysReleases(t *testing.T) {
	g := startGateway(t, "")
	c := connect(t, proxyURI(g), "kit-worker")
	ctx := ctxFor(t, 60*time.Second)
	sess := startSession(t, c)
	coll := c.Database("kit").Collection("withlock")
	boom := errors.New("payment provider said no")
	var tok int64
	err := lockgate.WithLock(ctx, sess, coll, []any{"o1"}, nil, func(ctx mongo.SessionContext, l *lockgate.Lock) error {
		tok = l.Token()
		// ctx carries the session: the write is covered by the lock.
		if _, err := coll.UpdateOne(ctx, bson.M{"_id": "o1"}, bson.M{"$set": bson.M{"state": "charging"}}, options.Update().SetUpsert(true)); err != nil {
			return err
		}
		// The same write without the session is refused: the lock is the
		// session's, not the process's.
		_, err := coll.UpdateOne(context.Background(), bson.M{"_id": "o1"}, bson.M{"$set": bson.M{"state": "x"}})
		var we mongo.WriteException
		if !errors.As(err, &we) && !mongo.IsDuplicateKeyError(err) {
			var ce mongo.CommandError
			if !errors.As(err, &ce) || ce.Code != 46 {
				t.Errorf("write outside the session: %v, want refused with 46", err)
			}
		} else if len(we.WriteErrors) == 0 || we.WriteErrors[0].Code != 46 {
			t.Errorf("write outside the session: %v, want refused with 46", err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WithLock returned %v, want fn's error", err)
	}
	// Released, with fn's error recorded for the next holder.
	l, err := lockgate.TryAcquire(ctx, startSession(t, c), coll, []any{"o1"}, nil)
	if err != nil {
		t.Fatalf("after WithLock the lock is still held: %v", err)
	}
	defer l.Release(ctx, "")
	h := l.Locks()[0]
	if h.LastError != boom.Error() || h.Token <= tok {
		t.Fatalf("next holder sees %+v, want lastError %q and a token above %d", h, boom, tok)
	}
}

// A renewal that lockgate refuses (the lock was released behind the
// helper's back) ends the lock at once, with the refusal as the cause.
func TestRefusedRenewalFiresLost(t *testing.T) {
	g := startGateway(t, "")
	c := connect(t, proxyURI(g), "kit-worker")
	ctx := ctxFor(t, 60*time.Second)
	sess := startSession(t, c)
	coll := c.Database("kit").Collection("refused")
	l, err := lockgate.Acquire(ctx, sess, coll, []any{1}, &lockgate.Options{Lease: 10 * time.Second, RenewEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Database("kit").RunCommand(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "releaseLock", Value: "refused"}}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire after a refused renewal")
	}
	if !errors.Is(l.Err(), lockgate.ErrLost) || !errors.Is(l.Err(), lockgate.ErrNotHeld) {
		t.Fatalf("Err = %v, want ErrLost and ErrNotHeld", l.Err())
	}
	if err := l.Release(ctx, ""); !errors.Is(err, lockgate.ErrNotHeld) {
		t.Fatalf("Release of a lost lock: %v, want ErrNotHeld", err)
	}
}

func TestContextEndReleasesTheLock(t *testing.T) {
	g := startGateway(t, "")
	c := connect(t, proxyURI(g), "kit-worker")
	ctx := ctxFor(t, 60*time.Second)
	coll := c.Database("kit").Collection("ctxend")
	actx, cancel := context.WithCancel(ctx)
	l, err := lockgate.Acquire(actx, startSession(t, c), coll, []any{1}, nil) // 30s lease
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire when Acquire's context ended")
	}
	if err := l.Release(ctx, ""); err != nil {
		t.Fatalf("Release after the context ended: %v", err)
	}
	// Released at once, not after the 30s lease.
	l2, err := lockgate.TryAcquire(ctx, startSession(t, c), coll, []any{1}, nil)
	if err != nil {
		t.Fatalf("the lock of an ended context is still held: %v", err)
	}
	l2.Release(ctx, "")
}

func TestRefusesWhatCannotWork(t *testing.T) {
	direct := connect(t, upstream.URI(), "kit-direct")
	ctx := ctxFor(t, 30*time.Second)
	coll := direct.Database("kit").Collection("direct")
	if _, err := lockgate.TryAcquire(ctx, startSession(t, direct), coll, []any{1}, nil); !errors.Is(err, lockgate.ErrNotProtected) {
		t.Errorf("lock command straight to the database: %v, want ErrNotProtected", err)
	}
	if _, err := lockgate.TryAcquire(ctx, nil, coll, []any{1}, nil); !errors.Is(err, lockgate.ErrInvalid) {
		t.Errorf("nil session: %v, want ErrInvalid", err)
	}
}

// A lock lost while WithLock's function runs cancels the function's
// context, and WithLock reports the loss even though the function
// returned nil: the work may not have been exclusive.
func TestWithLockReportsALossDuringTheWork(t *testing.T) {
	g := startGateway(t, "")
	c := connect(t, proxyURI(g), "kit-worker")
	ctx := ctxFor(t, 60*time.Second)
	sess := startSession(t, c)
	coll := c.Database("kit").Collection("lostwork")
	var cause error
	err := lockgate.WithLock(ctx, sess, coll, []any{1}, &lockgate.Options{Lease: 10 * time.Second, RenewEvery: 200 * time.Millisecond},
		func(ctx mongo.SessionContext, l *lockgate.Lock) error {
			// An operator (here: the session itself) releases the lock.
			if err := c.Database("kit").RunCommand(ctx, bson.D{{Key: "releaseLock", Value: "lostwork"}}).Err(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(5 * time.Second):
				t.Error("the work's context was not cancelled when the lock was lost")
			}
			return nil
		})
	if !errors.Is(err, lockgate.ErrLost) || !errors.Is(cause, lockgate.ErrLost) {
		t.Fatalf("WithLock = %v, work context cause = %v; want both to match ErrLost", err, cause)
	}
}

// localWaiters is the number of acquires queued on g for any lock, as its
// console shows them.
func localWaiters(t *testing.T, g *gateway.Gateway) int {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr().String() + "/console/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct {
		Locks []struct {
			Waiters int `json:"waiters"`
		} `json:"locks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatalf("/console/state: %v", err)
	}
	n := 0
	for _, l := range state.Locks {
		n += l.Waiters
	}
	return n
}
