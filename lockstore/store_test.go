package lockstore

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
)

var bg = context.Background()

func mustAcquire(t *testing.T, s *Store, o Owner, ns string, idv []docid.ID, lease, wait time.Duration) []Lock {
	t.Helper()
	locks, err := s.Acquire(bg, o, namespace.Of(ns), idv, lease, wait)
	if err != nil {
		t.Fatalf("acquire by %s: %v", o.App, err)
	}
	if len(locks) == 0 {
		t.Fatal("no locks returned")
	}
	return locks
}

func heldErr(t *testing.T, err error, sentinel error) *HeldError {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err %v, want %v", err, sentinel)
	}
	var he *HeldError
	if !errors.As(err, &he) {
		t.Fatalf("err %T is not a *HeldError", err)
	}
	return he
}

func TestContention(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("appA"), newOwner("appB")
	l := mustAcquire(t, s, a, "shop.orders", ids(t, int32(1)), time.Minute, 0)
	if l[0].Token <= 0 || l[0].ExpiresAt.IsZero() {
		t.Fatalf("bad lock %+v", l[0])
	}
	_, err := s.Acquire(bg, b, namespace.Of("shop.orders"), ids(t, int32(1)), time.Minute, 0)
	he := heldErr(t, err, ErrBusy)
	if he.Holder.App != "appA" || he.Holder.SessionPrefix != SessionPrefix(a.Session) || !he.Holder.ExpiresAt.Equal(l[0].ExpiresAt) {
		t.Fatalf("holder %+v, want appA %s until %v", he.Holder, SessionPrefix(a.Session), l[0].ExpiresAt)
	}
	if !strings.Contains(err.Error(), "appA") || !strings.Contains(err.Error(), SessionPrefix(a.Session)) {
		t.Fatalf("message %q does not name the holder", err)
	}
	// Another namespace and another id are other keys.
	mustAcquire(t, s, b, "shop.other", ids(t, int32(1)), time.Minute, 0)
	mustAcquire(t, s, b, "shop.orders", ids(t, int32(2)), time.Minute, 0)
	if got := testutil.ToFloat64(s.m.acquisitions.WithLabelValues(resultBusy)); got != 1 {
		t.Fatalf("busy acquisitions %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.held); got != 3 {
		t.Fatalf("locks held gauge %v, want 3", got)
	}
}

func TestReentrant(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	s := openStore(t, testConfig(t), WithClock(clk))
	a := newOwner("a")
	l1 := mustAcquire(t, s, a, "db.c", ids(t, "x"), 10*time.Second, 0)
	clk.Advance(5 * time.Second)
	l2 := mustAcquire(t, s, a, "db.c", ids(t, "x"), 10*time.Second, 0)
	if l2[0].Token != l1[0].Token {
		t.Fatalf("re-entrant acquire changed the token: %d -> %d", l1[0].Token, l2[0].Token)
	}
	if !l2[0].ExpiresAt.After(l1[0].ExpiresAt) {
		t.Fatalf("re-entrant acquire did not extend the lease: %v -> %v", l1[0].ExpiresAt, l2[0].ExpiresAt)
	}
	// Also without the cache (another store, same session): still re-entrant.
	s2 := openStore(t, Config{URI: s.cfg.URI, Database: s.cfg.Database, Collection: s.cfg.Collection, NewcomerHorizon: noMemoryLocks}, WithClock(clk))
	l3 := mustAcquire(t, s2, a, "db.c", ids(t, "x"), 10*time.Second, 0)
	if l3[0].Token != l1[0].Token {
		t.Fatalf("re-entrant acquire through another store changed the token: %d -> %d", l1[0].Token, l3[0].Token)
	}
	// A different binding of the same session is another owner.
	strict := a
	strict.Bind = "conn-2"
	_, err := s.Acquire(bg, strict, namespace.Of("db.c"), ids(t, "x"), time.Second, 0)
	heldErr(t, err, ErrBusy)
}

func TestMongoIDEquality(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	mustAcquire(t, s, a, "db.c", ids(t, int32(1)), time.Minute, 0)
	// (Decimal128 is covered by the key tests: FerretDB v1 cannot store it.)
	for _, same := range []any{int64(1), 1.0} {
		_, err := s.Acquire(bg, b, namespace.Of("db.c"), ids(t, same), time.Minute, 0)
		heldErr(t, err, ErrBusy)
	}
	mustAcquire(t, s, b, "db.c", ids(t, "1"), time.Minute, 0)
	ab := bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(2)}}
	ba := bson.D{{Key: "b", Value: int32(2)}, {Key: "a", Value: int32(1)}}
	mustAcquire(t, s, a, "db.c", ids(t, ab), time.Minute, 0)
	mustAcquire(t, s, b, "db.c", ids(t, ba), time.Minute, 0) // field order matters
	_, err := s.Acquire(bg, b, namespace.Of("db.c"), ids(t, bson.D{{Key: "a", Value: 1.0}, {Key: "b", Value: int64(2)}}), time.Minute, 0)
	heldErr(t, err, ErrBusy)
	// An array cannot even become an id (docid.TestInvalid); the zero ID
	// stands for one that slipped through.
	if _, err := s.Acquire(bg, a, namespace.Of("db.c"), []docid.ID{{}}, time.Minute, 0); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("the zero ID: %v, want ErrInvalidID", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a := newOwner("a")
	one := ids(t, int32(1))
	for name, tc := range map[string]struct {
		o     Owner
		ns    string
		ids   []docid.ID
		lease time.Duration
		wait  time.Duration
		want  error
	}{
		"no session":     {Owner{App: "x"}, "db.c", one, 0, 0, ErrInvalidArgument},
		"no ids":         {a, "db.c", nil, 0, 0, ErrInvalidArgument},
		"no ns":          {a, "", one, 0, 0, ErrInvalidArgument},
		"negative lease": {a, "db.c", one, -time.Second, 0, ErrInvalidLease},
		"lease over max": {a, "db.c", one, time.Hour, 0, ErrInvalidLease},
		"negative wait":  {a, "db.c", one, 0, -time.Second, ErrInvalidArgument},
		"zero id":        {a, "db.c", []docid.ID{{}}, 0, 0, ErrInvalidID},
	} {
		if _, err := s.Acquire(bg, tc.o, namespace.Of(tc.ns), tc.ids, tc.lease, tc.wait); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// Nothing was taken.
	st, err := s.Status(bg, a, namespace.Of("db.c"), one)
	if err != nil || st[0].Held {
		t.Fatalf("invalid calls took a lock: %+v %v", st, err)
	}
	// Default lease: the expiry is DefaultLease after a moment between
	// the clock read before the call and the one after it, so a slow
	// round trip on a loaded machine does not count as a short lease
	// (one did: 28.985s at load 20). The second of slack is the clock's.
	before, _ := s.clock.Now()
	l := mustAcquire(t, s, a, "db.c", one, 0, 0)
	after, _ := s.clock.Now()
	if e := l[0].ExpiresAt; e.Before(before.Add(DefaultLease-time.Second)) || e.After(after.Add(DefaultLease+time.Second)) {
		t.Fatalf("default lease expires %v after the call began and %v after it ended, want ~%v", e.Sub(before), e.Sub(after), DefaultLease)
	}
}

func TestMultiIDAllOrNothing(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	ns := "db.c"
	// Tokens before: lock and release 1, 3 once so they have records.
	pre := mustAcquire(t, s, a, ns, ids(t, int32(1), int32(3)), time.Minute, 0)
	if n, err := s.Release(bg, a, namespace.Of(ns), ids(t, int32(1), int32(3)), ""); err != nil || n != 2 {
		t.Fatalf("release: %d %v", n, err)
	}
	mustAcquire(t, s, b, ns, ids(t, int32(2)), time.Minute, 0)
	mustAcquire(t, s, a, ns, ids(t, int32(0)), time.Minute, 0) // already held by a

	_, err := s.Acquire(bg, a, namespace.Of(ns), ids(t, int32(3), int32(2), int32(1), int32(0)), time.Minute, 0)
	he := heldErr(t, err, ErrBusy)
	if he.Holder.App != "b" {
		t.Fatalf("blocking holder %+v, want b", he.Holder)
	}
	st, err := s.Status(bg, a, namespace.Of(ns), ids(t, int32(0), int32(1), int32(2), int32(3)))
	if err != nil {
		t.Fatal(err)
	}
	if !st[0].HeldByYou {
		t.Fatal("rollback released a lock the owner held before the call")
	}
	if st[1].Held || st[3].Held {
		t.Fatalf("rollback left locks taken: %+v %+v", st[1], st[3])
	}
	if !st[2].Held || st[2].HeldByYou {
		t.Fatal("id 2 must still be b's")
	}
	// Tokens of rolled-back keys never go back; the next grant is higher.
	if st[1].Token < pre[0].Token || st[3].Token < pre[1].Token {
		t.Fatalf("rollback lowered tokens: %d<%d or %d<%d", st[1].Token, pre[0].Token, st[3].Token, pre[1].Token)
	}
	l := mustAcquire(t, s, b, ns, ids(t, int32(1), int32(3)), time.Minute, 0)
	if l[0].Token <= st[1].Token || l[1].Token <= st[3].Token {
		t.Fatal("a grant after rollback must have a higher token")
	}
}

func TestCanonicalOrder(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s1 := openStore(t, cfg)
	var mu sync.Mutex
	var tried []string
	s1.testHookTry = func(rid string) { mu.Lock(); tried = append(tried, rid); mu.Unlock() }
	a := newOwner("a")
	mustAcquire(t, s1, a, "db.c", ids(t, "z", int32(5), "a", int32(1)), time.Minute, 0)
	if !slices.IsSorted(tried) || len(tried) != 4 {
		t.Fatalf("keys tried out of canonical order: %q", tried)
	}
	s1.testHookTry = nil

	// Two owners lock overlapping sets in opposite orders, waiting: neither
	// deadlocks within a bounded time, first on one store (FIFO among its
	// waiters), then on two stores (backoff polling). Each round starts
	// once the other owner has finished the round before, so both contend
	// in every round and a fast re-acquirer cannot starve the other
	// store's poller, which no fairness rule prevents across instances.
	s2 := openStore(t, cfg)
	set := ids(t, "k1", "k2", "k3", "k4")
	rev := slices.Clone(set)
	slices.Reverse(rev)
	rounds := 30
	if raceEnabled {
		rounds = 10
	}
	// finished receives once per round an owner finished; it is closed
	// when the owner stops, so that the other never waits for it in vain.
	run := func(s *Store, o Owner, order []docid.ID, finished chan<- struct{}, other <-chan struct{}, done chan<- error) {
		defer close(finished)
		for r := range rounds {
			if r > 0 {
				<-other
			}
			if _, err := s.Acquire(bg, o, namespace.Of("db.o"), order, time.Minute, time.Minute); err != nil {
				done <- err
				return
			}
			if _, err := s.Release(bg, o, namespace.Of("db.o"), order, ""); err != nil {
				done <- err
				return
			}
			finished <- struct{}{}
		}
		done <- nil
	}
	for _, pair := range []struct {
		name   string
		s1, s2 *Store
	}{{"one store", s1, s1}, {"two stores", s1, s2}} {
		start := time.Now()
		done := make(chan error, 2)
		fwd, rv := make(chan struct{}, rounds), make(chan struct{}, rounds)
		go run(pair.s1, newOwner("fwd"), set, fwd, rv, done)
		go run(pair.s2, newOwner("rev"), rev, rv, fwd, done)
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s: %v", pair.name, err)
				}
			case <-time.After(4 * time.Minute):
				// A deadlock ends an Acquire in its minute's wait with an
				// error (above); this catches a locker that never returns.
				// 90 s was overrun by the race detector at load 20.
				t.Fatalf("%s: opposite-order lockers did not finish in 4 minutes", pair.name)
			}
		}
		t.Logf("%s: %d rounds each of opposite-order 4-key locking in %v", pair.name, rounds, time.Since(start))
	}
}

func TestTokensMonotonic(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	cfg := testConfig(t)
	cfg.OpTimeout = 5 * time.Second
	cfg.CleanupAfter = time.Minute
	cfg.CleanupInterval = -1
	s := openStore(t, cfg, WithClock(clk))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "doc")
	var last int64
	check := func(what string, tok int64) {
		t.Helper()
		if tok <= last {
			t.Fatalf("%s: token %d not above %d", what, tok, last)
		}
		last = tok
	}
	for i := range 3 {
		check("a", mustAcquire(t, s, a, "db.c", id, time.Minute, 0)[0].Token)
		if _, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil {
			t.Fatal(err)
		}
		check("b", mustAcquire(t, s, b, "db.c", id, time.Minute, 0)[0].Token)
		if i == 1 {
			// Force release raises the token.
			st, err := s.ForceRelease(bg, namespace.Of("db.c"), id[0], "test")
			if err != nil || !st.Held || st.Holder.App != "b" {
				t.Fatalf("force release: %+v %v", st, err)
			}
			cur, _ := s.Status(bg, a, namespace.Of("db.c"), id)
			check("force", cur[0].Token)
			continue
		}
		if _, err := s.Release(bg, b, namespace.Of("db.c"), id, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Compaction deletes every old claim and keeps the head document; the
	// token goes on from it.
	claims, _ := s.claims.CountDocuments(bg, bson.D{})
	if claims < 11 {
		t.Fatalf("%d claims, want one per change (>= 11)", claims)
	}
	if n, err := s.Cleanup(bg); err != nil || n != 0 {
		t.Fatalf("cleanup of recent claims deleted %d (%v)", n, err)
	}
	clk.Advance(2 * time.Minute)
	n, err := s.Cleanup(bg)
	if err != nil || int64(n) != claims {
		t.Fatalf("cleanup deleted %d (%v), want %d", n, err, claims)
	}
	if c, _ := s.coll.CountDocuments(bg, bson.D{}); c != 1 {
		t.Fatalf("%d head documents after cleanup, want 1", c)
	}
	if c, _ := s.claims.CountDocuments(bg, bson.D{}); c != 0 {
		t.Fatalf("%d claims left after cleanup", c)
	}
	if got := testutil.ToFloat64(s.m.cleaned); got != float64(claims) {
		t.Fatalf("cleaned metric %v", got)
	}
	check("after cleanup", mustAcquire(t, s, a, "db.c", id, time.Minute, 0)[0].Token)
	if _, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil {
		t.Fatal(err)
	}
	// Even if an operator deletes everything, a new history starts above
	// every token handed out (tokens of new keys come from the server clock).
	if _, err := s.coll.DeleteMany(bg, bson.D{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.claims.DeleteMany(bg, bson.D{}); err != nil {
		t.Fatal(err)
	}
	s.cache.remove(ks(t, "db.c", id))
	clk.Advance(time.Second)
	check("after deleting everything", mustAcquire(t, s, b, "db.c", id, time.Minute, 0)[0].Token)
}

func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var expiries []Expiry // the hook runs on the acquiring goroutine
	s := openStore(t, testConfig(t), WithClock(clk), WithExpiryHook(func(e Expiry) { expiries = append(expiries, e) }))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, int32(9))
	la := mustAcquire(t, s, a, "db.c", id, 10*time.Second, 0)
	clk.Advance(9 * time.Second)
	if _, err := s.Acquire(bg, b, namespace.Of("db.c"), id, time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("before expiry: %v", err)
	}
	if ok, _, err := s.Holds(bg, a, namespace.Of("db.c"), id, 0); !ok || err != nil {
		t.Fatalf("holder should hold before expiry: %v", err)
	}
	if ok, _, _ := s.Holds(bg, a, namespace.Of("db.c"), id, 2*time.Second); ok {
		t.Fatal("Holds must honour the margin")
	}
	clk.Advance(time.Second + time.Millisecond)
	if ok, _, _ := s.Holds(bg, a, namespace.Of("db.c"), id, 0); ok {
		t.Fatal("expired lock reported as held")
	}
	st, _ := s.Status(bg, a, namespace.Of("db.c"), id)
	if st[0].Held {
		t.Fatal("status shows an expired lock as held")
	}
	lb := mustAcquire(t, s, b, "db.c", id, 10*time.Second, 0)
	if lb[0].Token <= la[0].Token {
		t.Fatal("takeover must raise the token")
	}
	if got := testutil.ToFloat64(s.m.expired); got != 1 {
		t.Fatalf("expired metric %v, want 1", got)
	}
	// The takeover is reported with the former holder's lease.
	if len(expiries) != 1 {
		t.Fatalf("expiries reported: %+v, want one", expiries)
	}
	e := expiries[0]
	if e.NS.String() != "db.c" || !e.ID.Equal(id[0]) || e.Former.Token != la[0].Token || e.Former.App != "a" ||
		e.Former.SessionPrefix != SessionPrefix(a.Session) || e.Token != lb[0].Token || !e.Former.ExpiresAt.Equal(la[0].ExpiresAt) {
		t.Fatalf("expiry %+v; want the lease of %+v taken over with token %d", e, la[0], lb[0].Token)
	}
	if _, err := s.Renew(bg, a, namespace.Of("db.c"), id, time.Second); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("renew by the expired holder: %v", err)
	}
	if n, err := s.Release(bg, a, namespace.Of("db.c"), id, "late"); n != 0 || err != nil {
		t.Fatalf("release by the expired holder: %d %v", n, err)
	}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	s := openStore(t, testConfig(t), WithClock(clk))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "r")
	l := mustAcquire(t, s, a, "db.c", id, time.Second, 0)
	clk.Advance(800 * time.Millisecond)
	r, err := s.Renew(bg, a, namespace.Of("db.c"), id, 10*time.Second)
	if err != nil || len(r) != 1 || r[0].Token != l[0].Token {
		t.Fatalf("renew: %+v %v", r, err)
	}
	clk.Advance(5 * time.Second)
	if _, err := s.Acquire(bg, b, namespace.Of("db.c"), id, time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("renewed lock taken: %v", err)
	}
	if _, err := s.Renew(bg, b, namespace.Of("db.c"), id, time.Second); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("renew by non-holder: %v", err)
	}
	if _, err := s.Renew(bg, a, namespace.Of("db.c"), id, time.Hour); !errors.Is(err, ErrInvalidLease) {
		t.Fatalf("renew over max lease: %v", err)
	}
	// Partial: one held, one not.
	got, err := s.Renew(bg, a, namespace.Of("db.c"), ids(t, "r", "other"), time.Second)
	var nh *NotHolderError
	if !errors.As(err, &nh) || len(nh.IDs) != 1 || len(got) != 1 {
		t.Fatalf("partial renew: %+v %v", got, err)
	}
}

func TestReleaseByNonOwner(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "x")
	mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	if n, err := s.Release(bg, b, namespace.Of("db.c"), id, "nope"); n != 0 || err != nil {
		t.Fatalf("release by non-owner: %d %v", n, err)
	}
	st, _ := s.Status(bg, b, namespace.Of("db.c"), id)
	if !st[0].Held || st[0].HeldByYou || st[0].LastError != "" {
		t.Fatalf("non-owner release changed the record: %+v", st[0])
	}
	if n, err := s.Release(bg, b, namespace.Of("db.c"), ids(t, "never-locked"), ""); n != 0 || err != nil {
		t.Fatalf("release of an unknown key: %d %v", n, err)
	}
}

func TestLastErrorForNextHolder(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "job")
	mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	if n, err := s.Release(bg, a, namespace.Of("db.c"), id, "disk full"); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	st, _ := s.Status(bg, b, namespace.Of("db.c"), id)
	if st[0].LastError != "disk full" || st[0].Held {
		t.Fatalf("status after failed release: %+v", st[0])
	}
	l := mustAcquire(t, s, b, "db.c", id, time.Minute, 0)
	if l[0].LastError != "disk full" {
		t.Fatalf("next holder sees lastError %q", l[0].LastError)
	}
	if st, _ := s.Status(bg, b, namespace.Of("db.c"), id); st[0].LastError != "disk full" || !st[0].HeldByYou {
		t.Fatalf("status while the next holder works: %+v", st[0])
	}
	if _, err := s.Release(bg, b, namespace.Of("db.c"), id, ""); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Status(bg, b, namespace.Of("db.c"), id); st[0].LastError != "" {
		t.Fatalf("a clean release should clear lastError: %+v", st[0])
	}
}

func TestReleaseAllAndSession(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	mustAcquire(t, s, a, "db.c", ids(t, int32(1), int32(2)), time.Minute, 0)
	mustAcquire(t, s, a, "db.d", ids(t, int32(1)), time.Minute, 0)
	mustAcquire(t, s, b, "db.c", ids(t, int32(3)), time.Minute, 0)
	if n, err := s.ReleaseAll(bg, a, namespace.Of("db.d"), ""); n != 1 || err != nil {
		t.Fatalf("release all in db.d: %d %v", n, err)
	}
	mustAcquire(t, s, a, "db.d", ids(t, int32(1)), time.Minute, 0)
	n, err := s.ReleaseSession(bg, a.Session)
	if n != 3 || err != nil {
		t.Fatalf("release session: %d %v, want 3", n, err)
	}
	mustAcquire(t, s, b, "db.c", ids(t, int32(1), int32(2)), time.Minute, 0)
	mustAcquire(t, s, b, "db.d", ids(t, int32(1)), time.Minute, 0)
	if ok, _, _ := s.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1)), 0); ok {
		t.Fatal("released session still holds")
	}
	if n, _ := s.ReleaseSession(bg, a.Session); n != 0 {
		t.Fatalf("second release session freed %d", n)
	}
	if got := testutil.ToFloat64(s.m.held); got != 4 {
		t.Fatalf("held gauge %v, want 4 (b's)", got)
	}
}

func TestListAndForceRelease(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	mustAcquire(t, s, a, "db.c", ids(t, int32(1), "two"), time.Minute, 0)
	mustAcquire(t, s, b, "db.d", ids(t, int32(1)), time.Minute, 0)
	if _, err := s.Release(bg, b, namespace.Of("db.d"), ids(t, int32(1)), "x"); err != nil {
		t.Fatal(err)
	}
	all, err := s.List(bg, ListOptions{})
	if err != nil || len(all) != 2 {
		t.Fatalf("list: %d %v, want 2 held", len(all), err)
	}
	for _, st := range all {
		if !st.Held || st.Holder.App != "a" || st.Since.IsZero() || st.Token == 0 || st.NS.String() != "db.c" {
			t.Fatalf("list entry %+v", st)
		}
	}
	withFree, _ := s.List(bg, ListOptions{IncludeFree: true})
	if len(withFree) != 3 {
		t.Fatalf("list with free: %d", len(withFree))
	}
	if only, _ := s.List(bg, ListOptions{NS: namespace.Of("db.d"), IncludeFree: true}); len(only) != 1 || only[0].LastError != "x" {
		t.Fatalf("list ns: %+v", only)
	}
	before, _ := s.Status(bg, a, namespace.Of("db.c"), ids(t, "two"))
	st, err := s.ForceRelease(bg, namespace.Of("db.c"), rv(t, "two"), "stuck job")
	if err != nil || !st.Held || st.Holder.App != "a" {
		t.Fatalf("force: %+v %v", st, err)
	}
	after, _ := s.Status(bg, a, namespace.Of("db.c"), ids(t, "two"))
	if after[0].Held || after[0].Token != before[0].Token+1 {
		t.Fatalf("after force: %+v (token before %d)", after[0], before[0].Token)
	}
	if ok, _, _ := s.Holds(bg, a, namespace.Of("db.c"), ids(t, "two"), 0); ok {
		t.Fatal("force release through this store must invalidate the cache")
	}
	if n, _ := s.Release(bg, a, namespace.Of("db.c"), ids(t, "two"), ""); n != 0 {
		t.Fatal("the old holder released a force-released lock")
	}
	if st, err := s.ForceRelease(bg, namespace.Of("db.c"), rv(t, "nothing"), "r"); err != nil || st.Held {
		t.Fatalf("force of unknown key: %+v %v", st, err)
	}
}

func TestHolds(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.CacheTrust = time.Hour
	s1 := openStore(t, cfg)
	s2 := openStore(t, cfg)
	a, b := newOwner("a"), newOwner("b")
	mustAcquire(t, s1, a, "db.c", ids(t, int32(1), int32(2)), time.Minute, 0)

	// From the cache: no round trip.
	finds := func(s *Store) float64 {
		return testutil.ToFloat64(s.m.roundTrips.WithLabelValues(opFind, "ok"))
	}
	f0 := finds(s1)
	ok, missing, err := s1.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1), 2.0), time.Second)
	if !ok || len(missing) != 0 || err != nil {
		t.Fatalf("holds from cache: %v %v %v", ok, missing, err)
	}
	if finds(s1) != f0 {
		t.Fatal("Holds for a lock taken through this store made a round trip")
	}
	// From the database: a lock taken through another instance is honoured.
	f0 = finds(s2)
	if ok, _, err := s2.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1)), time.Second); !ok || err != nil {
		t.Fatalf("holds through the other store: %v %v", ok, err)
	}
	// The head, and the claim after it: a head can be moved back to a
	// hold that has ended (TestHeadMovedBackHoldsNobody).
	if finds(s2) != f0+2 {
		t.Fatalf("Holds for a foreign lock read the database %v times, want twice (its head and the claim after it)", finds(s2)-f0)
	}
	ok, missing, _ = s1.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1), int32(3)), 0)
	if ok || len(missing) != 1 || missing[0].Raw().Int32() != 3 {
		t.Fatalf("holds with one missing: %v %v", ok, missing)
	}
	if ok, _, _ := s1.Holds(bg, b, namespace.Of("db.c"), ids(t, int32(1)), 0); ok {
		t.Fatal("another session holds a's lock")
	}
	// A force release through another instance waits until this
	// instance's cache can no longer trust the lock (TestCacheIsNeverWrongAcrossStores),
	// here as long as s1's trust: s1 refuses once it returns.
	s1.cfg.CacheTrust, s2.cfg.CacheTrust = 50*time.Millisecond, 50*time.Millisecond
	if _, err := s2.ForceRelease(bg, namespace.Of("db.c"), rv(t, int32(2)), "test"); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := s1.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(2)), 0); ok {
		t.Fatal("a force release elsewhere must be seen once it returned")
	}
	s1.cfg.CacheTrust = -1
	if ok, _, _ := s1.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1)), 0); !ok {
		t.Fatal("with the cache disabled, the lock is read")
	}
}

// Not run beside the other tests: it bounds the handoff's p50, which
// their load would decide.
func TestLocalWaiterHandoff(t *testing.T) {
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "hot")
	const n = 30
	lat := make([]time.Duration, 0, n)
	for range n {
		mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			_, err := s.Acquire(bg, b, namespace.Of("db.c"), id, time.Minute, 10*time.Second)
			got <- time.Now()
			errc <- err
		}()
		testkit.Eventually(t, 10*time.Second, "the waiter to try and block", func() bool { return blocked(s, ks(t, "db.c", id)) })
		if _, err := s.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		at := <-got
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		lat = append(lat, at.Sub(released))
		if _, err := s.Release(bg, b, namespace.Of("db.c"), id, ""); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(lat)
	p50, p90 := lat[n/2], lat[n*9/10]
	t.Logf("local handoff (release returned -> waiter holds): p50 %v p90 %v max %v", p50, p90, lat[n-1])
	// The release hands the lock over (or wakes the waiter): far quicker
	// than any poll. The bound is loose because the machine is noisy.
	if p50 > 50*time.Millisecond {
		t.Fatalf("local handoff p50 %v: waiters are not woken by the release", p50)
	}
}

// blocked reports whether the first local waiter for rid has tried and
// found it held: it waits for a release from then on.
func blocked(s *Store, rid string) bool {
	s.wq.mu.Lock()
	defer s.wq.mu.Unlock()
	q := s.wq.q[rid]
	return len(q) > 0 && q[0].blockedOn == rid
}

// ks is the record id of a single id.
func ks(t *testing.T, ns string, id []docid.ID) string {
	k, err := keys(namespace.Of(ns), id)
	if err != nil {
		t.Fatal(err)
	}
	return k[0].rid
}

func TestLocalWaitersFIFO(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MinPoll, cfg.MaxPoll = time.Millisecond, 5*time.Millisecond // polling must not reorder
	s := openStore(t, cfg)
	holder := newOwner("h")
	id := ids(t, "q")
	rid := ks(t, "db.c", id)
	mustAcquire(t, s, holder, "db.c", id, time.Minute, 0)
	const n = 5
	order := make(chan int, n)
	owners := make([]Owner, n)
	var wg sync.WaitGroup
	for i := range n {
		owners[i] = newOwner("w")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Acquire(bg, owners[i], namespace.Of("db.c"), id, time.Minute, 20*time.Second); err != nil {
				t.Error(err)
				return
			}
			order <- i
			if _, err := s.Release(bg, owners[i], namespace.Of("db.c"), id, ""); err != nil {
				t.Error(err)
			}
		}()
		testkit.Eventually(t, 10*time.Second, "the waiter to queue", func() bool { return s.wq.waiting(rid) == i+1 })
	}
	if _, err := s.Release(bg, holder, namespace.Of("db.c"), id, ""); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if !slices.IsSorted(got) || len(got) != n {
		t.Fatalf("local waiters served in order %v, want FIFO", got)
	}
}

// Not run beside the other tests: it bounds how long the wait took.
func TestWaitTimeout(t *testing.T) {
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "t")
	mustAcquire(t, s, a, "db.c", id, time.Minute, 0)
	start := time.Now()
	_, err := s.Acquire(bg, b, namespace.Of("db.c"), id, time.Minute, 150*time.Millisecond)
	took := time.Since(start)
	he := heldErr(t, err, ErrTimeout)
	if errors.Is(err, ErrBusy) {
		t.Fatal("a timeout is not a busy")
	}
	if he.Holder.App != "a" || he.Holder.SessionPrefix == "" {
		t.Fatalf("timeout error lacks the holder: %+v", he.Holder)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Fatalf("timed out after %v, want ~150ms", took)
	}
	if got := testutil.ToFloat64(s.m.acquisitions.WithLabelValues(resultTimeout)); got != 1 {
		t.Fatalf("timeout metric %v", got)
	}
	if testutil.CollectAndCount(s.m.waitSeconds) != 1 {
		t.Fatal("wait histogram missing")
	}
	// Context cancellation ends a wait too.
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, b, namespace.Of("db.c"), id, time.Minute, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

// Not run beside the other tests: it bounds how late the waiter woke.
func TestWaitForLeaseEnd(t *testing.T) {
	s := openStore(t, testConfig(t))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "lease")
	l := mustAcquire(t, s, a, "db.c", id, 300*time.Millisecond, 0)
	got := mustAcquire(t, s, b, "db.c", id, time.Minute, 5*time.Second)
	now, _ := s.clock.Now()
	if now.Before(l[0].ExpiresAt) {
		t.Fatal("took the lock before the lease ended")
	}
	_, unc := s.clock.Now()
	bound := 300*time.Millisecond + 2*unc
	if raceEnabled {
		bound *= 10 // the instrumented upstream answers in tens of milliseconds
	}
	if late := now.Sub(l[0].ExpiresAt); late > bound {
		t.Fatalf("waiter woke %v after the lease ended", late)
	}
	if got[0].Token <= l[0].Token {
		t.Fatal("token did not grow")
	}
}

func TestTwoStores(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s1, s2 := openStore(t, cfg), openStore(t, cfg)
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, "shared")
	mustAcquire(t, s1, a, "db.c", id, time.Minute, 0)
	_, err := s2.Acquire(bg, b, namespace.Of("db.c"), id, time.Minute, 0)
	if he := heldErr(t, err, ErrBusy); he.Holder.App != "a" {
		t.Fatalf("holder through the other store: %+v", he.Holder)
	}
	type res struct {
		at  time.Time
		err error
	}
	done := make(chan res, 1)
	go func() {
		_, err := s2.Acquire(bg, b, namespace.Of("db.c"), id, time.Minute, 10*time.Second)
		done <- res{time.Now(), err}
	}()
	// Released once the waiter has tried and blocked: from then on only
	// its poll, never above the cap, can find the lock free.
	testkit.Eventually(t, 10*time.Second, "the waiter to try and block", func() bool { return blocked(s2, ks(t, "db.c", id)) })
	if _, err := s1.Release(bg, a, namespace.Of("db.c"), id, ""); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	// How soon it came is latency, measured by BenchmarkWakeAcrossLockgates
	// (tests/reliability), not asserted here: the waiter getting the lock
	// well inside its wait is what this test is about.
	t.Logf("cross-store handoff by backoff poll: %v (cap %v)", r.at.Sub(released), s2.cfg.MaxPoll)
}

func TestDuplicateKeyRaceIsBusy(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s1, s2 := openStore(t, cfg), openStore(t, cfg)
	for i := range 30 {
		id := ids(t, int32(i))
		var wg sync.WaitGroup
		var wins atomic.Int32
		start := make(chan struct{})
		for _, s := range []*Store{s1, s2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := s.Acquire(bg, newOwner("r"), namespace.Of("db.race"), id, time.Minute, 0)
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, ErrBusy):
				default:
					t.Errorf("race on a new key: %v (must be busy, never an error)", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d winners", i, wins.Load())
		}
	}
}

// Not run beside the other tests: it bounds how soon the failure came.
func TestUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	s, err := Open(bg, Config{URI: "mongodb://" + addr + "/?directConnection=true", OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("open must not fail for an unreachable store: %v", err)
	}
	defer s.Close(bg)
	a := newOwner("a")
	_, err = s.Acquire(bg, a, namespace.Of("db.c"), ids(t, int32(1)), 0, 0)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire: %v, want ErrUnavailable", err)
	}
	if ok, _, err := s.Holds(bg, a, namespace.Of("db.c"), ids(t, int32(1)), 0); ok || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("holds must fail closed: %v %v", ok, err)
	}
	if err := s.Ping(bg); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ping: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("unavailable reported after %v", took)
	}
}

// TestNoDoubleGrant: 50 goroutines acquire and release 10 keys through two
// stores, five per key at any time; an in-memory holder count per key must
// never exceed one, and tokens per key must grow with every grant. Every
// cycle must complete: the count is fixed, not a time budget (which a
// loaded machine used up whole). By default each goroutine does 20 cycles,
// 1,000 grants with both stores contending on every key; 2 under -race
// (which instruments the embedded FerretDB too). LOCKGATE_STRESS_CYCLES
// sets another count: 200 is the soak form (docs/TESTING.md).
func TestNoDoubleGrant(t *testing.T) {
	t.Parallel()
	workers, cycles := 50, 20
	if raceEnabled {
		cycles = 2
	}
	if s := os.Getenv("LOCKGATE_STRESS_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("LOCKGATE_STRESS_CYCLES=%q: want a whole number of at least 1", s)
		}
		cycles = n
	}
	const nkeys = 10
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	stores := []*Store{openStore(t, cfg), openStore(t, cfg)}
	var holders [nkeys]atomic.Int32
	var lastToken [nkeys]int64 // guarded by the lock itself
	var grants atomic.Int64
	var failed atomic.Bool
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%2]
			o := newOwner("stress")
			for c := range cycles {
				if failed.Load() {
					return
				}
				k := (w*7 + c*3) % nkeys
				id := []docid.ID{rv(t, int32(k))}
				l, err := s.Acquire(bg, o, namespace.Of("db.stress"), id, time.Minute, 90*time.Second)
				if err != nil {
					t.Errorf("worker %d cycle %d: %v", w, c, err)
					failed.Store(true)
					return
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("key %d granted to %d holders at once", k, n)
					failed.Store(true)
				}
				if l[0].Token <= lastToken[k] {
					t.Errorf("key %d token %d after %d", k, l[0].Token, lastToken[k])
					failed.Store(true)
				}
				lastToken[k] = l[0].Token
				grants.Add(1)
				holders[k].Add(-1)
				if n, err := s.Release(bg, o, namespace.Of("db.stress"), id, ""); err != nil || n != 1 {
					t.Errorf("release: %d %v", n, err)
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d workers x %d cycles on %d keys through 2 stores: %d grants in %v (%.0f/s)",
		workers, cycles, nkeys, grants.Load(), took, float64(grants.Load())/took.Seconds())
	if want := int64(workers * cycles); grants.Load() != want && !failed.Load() {
		t.Fatalf("%d grants, want %d", grants.Load(), want)
	}
}

func TestMetricsCollector(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	s := openStore(t, testConfig(t), WithMetrics(m))
	mustAcquire(t, s, newOwner("a"), "db.c", ids(t, int32(1)), 0, 0)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{
		"lockgate_lock_acquisitions_total", "lockgate_lock_wait_seconds", "lockgate_locks_held",
		"lockgate_lockstore_round_trips_total", "lockgate_lockstore_round_trip_seconds",
		"lockgate_lock_expired_total", "lockgate_lock_records_cleaned_total", "lockgate_lock_handoffs_total",
		"lockgate_lock_quiesce_waits_total",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("metric %s missing from %v", want, names)
		}
	}
	if c := testutil.ToFloat64(m.acquisitions.WithLabelValues(resultOK)); c != 1 {
		t.Fatalf("ok acquisitions %v", c)
	}
}
