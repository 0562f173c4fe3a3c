// Package lockstoretest is the contract of a lock store, as the guard
// relies on it, written once and run against every implementation: the
// real lockstore.Store on an embedded FerretDB and the in-memory memstore
// that the guard's fast tests use. A fake that passes it answers as the
// real store does for everything the contract covers.
package lockstoretest

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson/primitive"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
)

// Store is what the contract exercises: guard.LockStore plus the fencing
// tokens the document fence reads.
type Store interface {
	Acquire(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error)
	Renew(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error)
	Release(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error)
	ReleaseAll(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, errText string) (int, error)
	ReleaseSession(ctx context.Context, session []byte) (int, error)
	Status(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error)
	Holds(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error)
	HeldTokens(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error)
	RecordTxn(ctx context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error
	BeginCommit(ctx context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error)
	EndTxn(ctx context.Context, session []byte, txn int64) error
}

// Lease limits every store under test is opened with.
const (
	DefaultLease = 5 * time.Second
	MaxLease     = time.Minute
)

// Clock is the lock store server's clock, moved by the tests only.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at the current time, in whole milliseconds as
// BSON dates keep it.
func NewClock() *Clock { return &Clock{t: time.Now().Truncate(time.Millisecond)} }

// Now implements lockstore.Clock, with no uncertainty.
func (c *Clock) Now() (time.Time, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t, 0
}

// Advance moves the clock.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Open returns a fresh, empty store whose server clock is clock, with
// DefaultLease and MaxLease and no takeover grace.
type Open func(t *testing.T, clock *Clock) Store

// Run runs every contract test against the stores open returns.
func Run(t *testing.T, open Open) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, Store, *Clock)
	}{
		{"AllOrNothing", allOrNothing},
		{"Reentrant", reentrant},
		{"BusyNamesHolder", busy},
		{"OneKeyPerValue", oneKeyPerValue},
		{"Binding", binding},
		{"WaitWokenByRelease", waitWoken},
		{"WaitTimeout", waitTimeout},
		{"WaitCancelled", waitCancelled},
		{"Renew", renew},
		{"Release", release},
		{"ReleaseAll", releaseAll},
		{"TokensNeverGoBack", tokens},
		{"LeaseExpiry", leaseExpiry},
		{"HoldsMargin", holdsMargin},
		{"HeldTokens", heldTokens},
		{"ReleaseSession", releaseSession},
		{"InvalidArguments", invalid},
		{"TransactionRecords", txnRecords},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := NewClock()
			c.f(t, open(t, clock), clock)
		})
	}
}

const ns = "shop.orders"

// NewOwner returns an owner with a random session.
func NewOwner(app string) lockstore.Owner {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return lockstore.Owner{Session: b, App: app, Client: "127.0.0.1:1"}
}

// ID makes an _id.
func ID(v any) docid.ID {
	id, err := docid.Of(v)
	if err != nil {
		panic(err)
	}
	return id
}

// IDs makes _ids.
func IDs(vs ...any) []docid.ID {
	out := make([]docid.ID, len(vs))
	for i, v := range vs {
		out[i] = ID(v)
	}
	return out
}

func mustAcquire(t *testing.T, s Store, o lockstore.Owner, space string, ids []docid.ID, lease time.Duration) []lockstore.Lock {
	t.Helper()
	ls, err := s.Acquire(context.Background(), o, namespace.Of(space), ids, lease, 0)
	if err != nil {
		t.Fatalf("acquire %v: %v", ids, err)
	}
	return ls
}

func holds(t *testing.T, s Store, o lockstore.Owner, ids []docid.ID, margin time.Duration) bool {
	t.Helper()
	ok, _, err := s.Holds(context.Background(), o, namespace.Of(ns), ids, margin)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func status(t *testing.T, s Store, o lockstore.Owner, id docid.ID) lockstore.Status {
	t.Helper()
	sts, err := s.Status(context.Background(), o, namespace.Of(ns), []docid.ID{id})
	if err != nil || len(sts) != 1 {
		t.Fatalf("status: %v %v", sts, err)
	}
	return sts[0]
}

func allOrNothing(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	mustAcquire(t, s, a, ns, IDs(2), 0)
	_, err := s.Acquire(context.Background(), b, namespace.Of(ns), IDs(1, 2, 3), 0, 0)
	var he *lockstore.HeldError
	if !errors.Is(err, lockstore.ErrBusy) || !errors.As(err, &he) || !he.ID.Equal(ID(2)) {
		t.Fatalf("acquire over a held id: %v, want ErrBusy on _id 2", err)
	}
	// Nothing of the failed call stays taken.
	for _, id := range IDs(1, 3) {
		if st := status(t, s, b, id); st.Held {
			t.Fatalf("_id %v held after a failed all-or-nothing acquire: %+v", id, st)
		}
	}
	if holds(t, s, b, IDs(1), 0) {
		t.Fatal("b holds _id 1 after its acquire failed")
	}
	ls := mustAcquire(t, s, a, ns, IDs(3, 1, 2), 0)
	if len(ls) != 3 || !ls[0].ID.Equal(ID(3)) || !ls[2].ID.Equal(ID(2)) {
		t.Fatalf("locks not in the order of the ids: %+v", ls)
	}
}

func reentrant(t *testing.T, s Store, clock *Clock) {
	a := NewOwner("a")
	first := mustAcquire(t, s, a, ns, IDs("x"), 2*time.Second)[0]
	clock.Advance(time.Second)
	again := mustAcquire(t, s, a, ns, IDs("x"), 2*time.Second)[0]
	if again.Token != first.Token {
		t.Fatalf("re-entrant acquire changed the token: %d -> %d", first.Token, again.Token)
	}
	if !again.ExpiresAt.After(first.ExpiresAt) {
		t.Fatalf("re-entrant acquire did not extend the lease: %v -> %v", first.ExpiresAt, again.ExpiresAt)
	}
	clock.Advance(1500 * time.Millisecond) // past the first lease, within the second
	if !holds(t, s, a, IDs("x"), 0) {
		t.Fatal("the extended lease was not honoured")
	}
}

func busy(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("billing"), NewOwner("b")
	l := mustAcquire(t, s, a, ns, IDs(7), 0)[0]
	_, err := s.Acquire(context.Background(), b, namespace.Of(ns), IDs(7), 0, 0)
	var he *lockstore.HeldError
	if !errors.As(err, &he) || !errors.Is(err, lockstore.ErrBusy) || errors.Is(err, lockstore.ErrTimeout) {
		t.Fatalf("got %v, want a *HeldError matching ErrBusy", err)
	}
	if he.Holder.App != "billing" || he.Holder.SessionPrefix != lockstore.SessionPrefix(a.Session) ||
		he.Holder.Token != l.Token || !he.Holder.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("holder %+v, want app billing, session %s, token %d, until %v", he.Holder, lockstore.SessionPrefix(a.Session), l.Token, l.ExpiresAt)
	}
	st := status(t, s, b, ID(7))
	if !st.Held || st.HeldByYou || st.Holder.App != "billing" || st.Token != l.Token {
		t.Fatalf("status for another session: %+v", st)
	}
	if st := status(t, s, a, ID(7)); !st.HeldByYou {
		t.Fatalf("status for the holder: %+v", st)
	}
}

func oneKeyPerValue(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	ls := mustAcquire(t, s, a, ns, []docid.ID{ID(int32(1)), ID(1.0), ID(int64(1))}, 0)
	if len(ls) != 1 {
		t.Fatalf("1, 1.0 and NumberLong(1) are one key; got %d locks", len(ls))
	}
	for _, id := range []docid.ID{ID(int64(1)), ID(1.0)} {
		if _, err := s.Acquire(context.Background(), b, namespace.Of(ns), []docid.ID{id}, 0, 0); !errors.Is(err, lockstore.ErrBusy) {
			t.Fatalf("acquire %v: %v, want ErrBusy", id, err)
		}
	}
	if !holds(t, s, a, []docid.ID{ID(int64(1))}, 0) {
		t.Fatal("a does not hold NumberLong(1) after locking 1")
	}
	// Another type is another document.
	mustAcquire(t, s, b, ns, IDs("1"), 0)
	// And another namespace another key.
	mustAcquire(t, s, b, "shop.other", IDs(1), 0)
}

func binding(t *testing.T, s Store, _ *Clock) {
	bound := NewOwner("a")
	bound.Bind = "conn-1"
	unbound := bound
	unbound.Bind = ""
	mustAcquire(t, s, bound, ns, IDs(1), 0)
	if holds(t, s, unbound, IDs(1), 0) {
		t.Fatal("the session without the binding holds a bound lock")
	}
	if _, err := s.Acquire(context.Background(), unbound, namespace.Of(ns), IDs(1), 0, 0); !errors.Is(err, lockstore.ErrBusy) {
		t.Fatalf("acquire without the binding: %v, want ErrBusy", err)
	}
	if n, err := s.Release(context.Background(), unbound, namespace.Of(ns), IDs(1), ""); err != nil || n != 0 {
		t.Fatalf("release without the binding freed %d (%v)", n, err)
	}
	if !holds(t, s, bound, IDs(1), 0) {
		t.Fatal("the bound owner lost its lock")
	}
}

func waitWoken(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	first := mustAcquire(t, s, a, ns, IDs(1), 0)[0]
	type result struct {
		ls  []lockstore.Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		ls, err := s.Acquire(context.Background(), b, namespace.Of(ns), IDs(1), 0, 20*time.Second)
		done <- result{ls, err}
	}()
	// Released whether or not b is queued yet: either way b must get it.
	if n, err := s.Release(context.Background(), a, namespace.Of(ns), IDs(1), ""); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if r.ls[0].Token <= first.Token {
			t.Fatalf("the waiter's token %d is not above the previous holder's %d", r.ls[0].Token, first.Token)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not given the released lock")
	}
	if !holds(t, s, b, IDs(1), 0) {
		t.Fatal("the waiter does not hold the lock")
	}
}

func waitTimeout(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	mustAcquire(t, s, a, ns, IDs(1), 0)
	start := time.Now()
	_, err := s.Acquire(context.Background(), b, namespace.Of(ns), IDs(1), 0, 50*time.Millisecond)
	var he *lockstore.HeldError
	if !errors.Is(err, lockstore.ErrTimeout) || !errors.As(err, &he) || !he.Timeout {
		t.Fatalf("got %v, want a *HeldError matching ErrTimeout", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the 50ms wait", d)
	}
	if he.Holder.App != "a" {
		t.Fatalf("the timeout does not name the holder: %+v", he.Holder)
	}
}

func waitCancelled(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	mustAcquire(t, s, a, ns, IDs(1), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.Acquire(ctx, b, namespace.Of(ns), IDs(1), 0, 20*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lockstore.ErrTimeout) || errors.Is(err, lockstore.ErrUnavailable) {
		t.Fatalf("a waiter whose context ended: %v, want the context's error alone", err)
	}
	if holds(t, s, b, IDs(1), 0) {
		t.Fatal("the cancelled waiter holds the lock")
	}
}

func renew(t *testing.T, s Store, clock *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	l := mustAcquire(t, s, a, ns, IDs(1, 2), 2*time.Second)
	clock.Advance(1500 * time.Millisecond)
	r, err := s.Renew(context.Background(), a, namespace.Of(ns), IDs(1), 10*time.Second)
	if err != nil || len(r) != 1 || r[0].Token != l[0].Token {
		t.Fatalf("renew: %+v %v", r, err)
	}
	now, _ := clock.Now()
	if !r[0].ExpiresAt.Equal(now.Add(10 * time.Second)) {
		t.Fatalf("renewed lease ends %v, want %v", r[0].ExpiresAt, now.Add(10*time.Second))
	}
	_, err = s.Renew(context.Background(), b, namespace.Of(ns), IDs(1), time.Second)
	var nh *lockstore.NotHolderError
	if !errors.Is(err, lockstore.ErrNotHolder) || !errors.As(err, &nh) || len(nh.IDs) != 1 {
		t.Fatalf("renew by another session: %v, want ErrNotHolder", err)
	}
	clock.Advance(time.Second) // _id 2's lease has ended, _id 1's not
	r, err = s.Renew(context.Background(), a, namespace.Of(ns), IDs(1, 2), time.Second)
	if !errors.As(err, &nh) || len(nh.IDs) != 1 || !nh.IDs[0].Equal(ID(2)) {
		t.Fatalf("renew of an expired lock: %v, want ErrNotHolder for _id 2", err)
	}
	if len(r) != 1 || !r[0].ID.Equal(ID(1)) {
		t.Fatalf("the held id was not renewed alongside: %+v", r)
	}
}

func release(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	l := mustAcquire(t, s, a, ns, IDs(1), 0)[0]
	if n, err := s.Release(context.Background(), b, namespace.Of(ns), IDs(1), ""); err != nil || n != 0 {
		t.Fatalf("release by another session: %d %v", n, err)
	}
	if !holds(t, s, a, IDs(1), 0) {
		t.Fatal("another session's release freed the lock")
	}
	if n, err := s.Release(context.Background(), a, namespace.Of(ns), IDs(1, 99), "disk full"); err != nil || n != 1 {
		t.Fatalf("release: %d %v, want 1 (an id not held does not count)", n, err)
	}
	st := status(t, s, a, ID(1))
	if st.Held || st.Token != l.Token || st.LastError != "disk full" {
		t.Fatalf("after release: %+v, want free, token %d kept, lastError", st, l.Token)
	}
	if holds(t, s, a, IDs(1), 0) {
		t.Fatal("a still holds a released lock")
	}
	next := mustAcquire(t, s, b, ns, IDs(1), 0)[0]
	if next.Token <= l.Token || next.LastError != "disk full" {
		t.Fatalf("next holder: %+v, want a token above %d and the last error", next, l.Token)
	}
	if n, _ := s.Release(context.Background(), b, namespace.Of(ns), IDs(1), ""); n != 1 {
		t.Fatal("clean release")
	}
	if st := status(t, s, b, ID(1)); st.LastError != "" {
		t.Fatalf("a clean release keeps lastError %q", st.LastError)
	}
}

func releaseAll(t *testing.T, s Store, _ *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	mustAcquire(t, s, a, ns, IDs(1, 2), 0)
	mustAcquire(t, s, a, "shop.other", IDs(1), 0)
	mustAcquire(t, s, b, ns, IDs(3), 0)
	if n, err := s.ReleaseAll(context.Background(), a, namespace.Of(ns), ""); err != nil || n != 2 {
		t.Fatalf("release all: %d %v, want 2", n, err)
	}
	if holds(t, s, a, IDs(1), 0) || holds(t, s, a, IDs(2), 0) {
		t.Fatal("release all left a lock of the namespace")
	}
	if ok, _, _ := s.Holds(context.Background(), a, namespace.Of("shop.other"), IDs(1), 0); !ok {
		t.Fatal("release all freed a lock of another namespace")
	}
	if !holds(t, s, b, IDs(3), 0) {
		t.Fatal("release all freed another session's lock")
	}
}

func tokens(t *testing.T, s Store, clock *Clock) {
	var last int64
	owners := []lockstore.Owner{NewOwner("a"), NewOwner("b"), NewOwner("c")}
	id := ID(primitive.NewObjectIDFromTimestamp(time.Unix(1, 0)))
	for i := range 9 {
		o := owners[i%len(owners)]
		l := mustAcquire(t, s, o, ns, []docid.ID{id}, time.Second)[0]
		if l.Token <= last {
			t.Fatalf("round %d: token %d after %d", i, l.Token, last)
		}
		last = l.Token
		// Free by release and by lease end in turn.
		if i%2 == 0 {
			if _, err := s.Release(context.Background(), o, namespace.Of(ns), []docid.ID{l.ID}, ""); err != nil {
				t.Fatal(err)
			}
		} else {
			clock.Advance(1100 * time.Millisecond)
		}
	}
}

func leaseExpiry(t *testing.T, s Store, clock *Clock) {
	a, b := NewOwner("a"), NewOwner("b")
	l := mustAcquire(t, s, a, ns, IDs(1), 2*time.Second)[0]
	clock.Advance(time.Second)
	if !holds(t, s, a, IDs(1), 0) {
		t.Fatal("lock lost within its lease")
	}
	if _, err := s.Acquire(context.Background(), b, namespace.Of(ns), IDs(1), 0, 0); !errors.Is(err, lockstore.ErrBusy) {
		t.Fatalf("taken within the lease: %v", err)
	}
	clock.Advance(1500 * time.Millisecond)
	if holds(t, s, a, IDs(1), 0) {
		t.Fatal("a lock is held after its lease ended")
	}
	if st := status(t, s, b, ID(1)); st.Held {
		t.Fatalf("status shows an expired lock held: %+v", st)
	}
	got := mustAcquire(t, s, b, ns, IDs(1), 0)[0]
	if got.Token <= l.Token {
		t.Fatalf("takeover token %d not above %d", got.Token, l.Token)
	}
	if n, _ := s.Release(context.Background(), a, namespace.Of(ns), IDs(1), ""); n != 0 {
		t.Fatal("the old holder released the new holder's lock")
	}
}

func holdsMargin(t *testing.T, s Store, clock *Clock) {
	a := NewOwner("a")
	mustAcquire(t, s, a, ns, IDs(1, 2), 5*time.Second)
	clock.Advance(2 * time.Second)
	if !holds(t, s, a, IDs(1, 2), 2*time.Second) {
		t.Fatal("3s left, margin 2s: not held")
	}
	ok, missing, err := s.Holds(context.Background(), a, namespace.Of(ns), IDs(1, 2, 3), 4*time.Second)
	if err != nil || ok || len(missing) != 3 {
		t.Fatalf("3s left, margin 4s: %v %v %v, want not held, all three missing", ok, missing, err)
	}
	ok, missing, err = s.Holds(context.Background(), a, namespace.Of(ns), IDs(1, 3), 0)
	if err != nil || ok || len(missing) != 1 || !missing[0].Equal(ID(3)) {
		t.Fatalf("an id never locked: %v %v %v, want _id 3 missing", ok, missing, err)
	}
}

func heldTokens(t *testing.T, s Store, clock *Clock) {
	a := NewOwner("a")
	ls := mustAcquire(t, s, a, ns, IDs(1, 2), 5*time.Second)
	clock.Advance(time.Second)
	mustAcquire(t, s, a, ns, IDs(2), 8*time.Second) // re-entrant: ends later
	toks, left, missing, err := s.HeldTokens(context.Background(), a, namespace.Of(ns), IDs(2, 1), time.Second)
	if err != nil || len(missing) != 0 || len(toks) != 2 {
		t.Fatalf("held tokens: %v %v %v", toks, missing, err)
	}
	if toks[0] != ls[1].Token || toks[1] != ls[0].Token {
		t.Fatalf("tokens %v not in the order of the ids (want %d, %d)", toks, ls[1].Token, ls[0].Token)
	}
	if left != 4*time.Second {
		t.Fatalf("lease left %v, want 4s (the earliest-ending lock)", left)
	}
	toks, _, missing, err = s.HeldTokens(context.Background(), a, namespace.Of(ns), IDs(1, 2), 5*time.Second)
	if err != nil || toks != nil || len(missing) != 1 || !missing[0].Equal(ID(1)) {
		t.Fatalf("short of the margin: tokens %v missing %v %v, want none and _id 1", toks, missing, err)
	}
}

func releaseSession(t *testing.T, s Store, _ *Clock) {
	a, c := NewOwner("a"), NewOwner("c")
	bound := a
	bound.Bind = "x"
	mustAcquire(t, s, a, ns, IDs(1, 2), 0)
	mustAcquire(t, s, bound, "shop.other", IDs(1), 0)
	mustAcquire(t, s, c, ns, IDs(3), 0)
	n, err := s.ReleaseSession(context.Background(), a.Session)
	if err != nil || n != 3 {
		t.Fatalf("release session: %d %v, want 3 (every binding, every namespace)", n, err)
	}
	if holds(t, s, a, IDs(1), 0) {
		t.Fatal("the ended session still holds a lock")
	}
	if ok, _, _ := s.Holds(context.Background(), bound, namespace.Of("shop.other"), IDs(1), 0); ok {
		t.Fatal("the ended session's bound lock is still held")
	}
	if !holds(t, s, c, IDs(3), 0) {
		t.Fatal("ending a session freed another session's lock")
	}
	mustAcquire(t, s, c, ns, IDs(1), 0)
}

func invalid(t *testing.T, s Store, _ *Clock) {
	ctx := context.Background()
	a := NewOwner("a")
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"no session", second(s.Acquire(ctx, lockstore.Owner{}, namespace.Of(ns), IDs(1), 0, 0)), lockstore.ErrInvalidArgument},
		{"no ids", second(s.Acquire(ctx, a, namespace.Of(ns), nil, 0, 0)), lockstore.ErrInvalidArgument},
		{"no namespace", second(s.Acquire(ctx, a, namespace.Of(""), IDs(1), 0, 0)), lockstore.ErrInvalidArgument},
		{"negative wait", second(s.Acquire(ctx, a, namespace.Of(ns), IDs(1), 0, -time.Second)), lockstore.ErrInvalidArgument},
		{"lease over the maximum", second(s.Acquire(ctx, a, namespace.Of(ns), IDs(1), MaxLease+time.Second, 0)), lockstore.ErrInvalidLease},
		{"negative lease", second(s.Renew(ctx, a, namespace.Of(ns), IDs(1), -time.Second)), lockstore.ErrInvalidLease},
		{"the zero _id", second(s.Acquire(ctx, a, namespace.Of(ns), []docid.ID{{}}, 0, 0)), lockstore.ErrInvalidID},
		{"holds without a session", third(s.Holds(ctx, lockstore.Owner{}, namespace.Of(ns), IDs(1), 0)), lockstore.ErrInvalidArgument},
		{"release session without one", second(s.ReleaseSession(ctx, nil)), lockstore.ErrInvalidArgument},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if st := status(t, s, a, ID(1)); st.Held || st.Token != 0 {
		t.Fatalf("an invalid call took a lock: %+v", st)
	}
}

func second[T any](_ T, err error) error { return err }

func third[A, B any](_ A, _ B, err error) error { return err }
