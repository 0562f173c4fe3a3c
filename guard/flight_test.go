package guard

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// leaseStore holds every lock with a fixed lease left and counts renewals.
type leaseStore struct {
	unavailableStore
	left    time.Duration
	renews  atomic.Int32
	release atomic.Int32
	txns    *memstore.Store // transaction records only
}

func (s *leaseStore) RecordTxn(ctx context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error {
	return s.txns.RecordTxn(ctx, session, txn, needs)
}

func (s *leaseStore) BeginCommit(ctx context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error) {
	return s.txns.BeginCommit(ctx, session, txn)
}

func (s *leaseStore) EndTxn(ctx context.Context, session []byte, txn int64) error {
	return s.txns.EndTxn(ctx, session, txn)
}

func (s *leaseStore) HeldTokens(_ context.Context, _ lockstore.Owner, _ namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error) {
	if s.left <= margin {
		return nil, 0, ids, nil
	}
	return make([]int64, len(ids)), s.left, nil, nil
}

func (s *leaseStore) Renew(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) ([]lockstore.Lock, error) {
	s.renews.Add(1)
	return nil, nil
}

func (s *leaseStore) Release(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, string) (int, error) {
	s.release.Add(1)
	return 1, nil
}

func flightGuard(t *testing.T, left time.Duration) (*Guard, *leaseStore) {
	t.Helper()
	return flightGuardOrder(t, left, 300*time.Millisecond)
}

// flightGuardOrder is flightGuard whose releases wait up to order for the
// session's writes in flight. A test that must see a release wait until a
// reply it sends gives a long one (a wait it ends itself), and bounds a
// wait it wants to see refused with the context it passes: on a loaded
// machine a 300 ms wait ran out between the test's seeing the release
// parked and its sending the reply.
func flightGuardOrder(t *testing.T, left, order time.Duration) (*Guard, *leaseStore) {
	t.Helper()
	pol, err := policy.Compile(config.Policy{Default: config.ModeEnforce, MaxCandidates: 10, LeaseMarginMS: 100})
	if err != nil {
		t.Fatal(err)
	}
	st := &leaseStore{left: left, txns: memstore.New(memstore.Config{})}
	g := New(Options{Store: st, OrderTimeout: order})
	g.SetPolicy(pol)
	return g, st
}

var flightLSID = bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()

func flightRequest(t *testing.T, extra func(*bsoncore.DocumentBuilder)) *proxy.Request {
	t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendString("update", "orders").
		AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("a", 1).Build()).Build()).
			Build()).Build())
	if extra != nil {
		extra(b)
	}
	b.AppendDocument("lsid", flightLSID).AppendString("$db", "shop")
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.Build()), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
}

func maxTimeOf(t *testing.T, b []byte) int64 {
	t.Helper()
	msg, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := wire.CommandOf(msg)
	ms, ok := cmd.Body.Lookup("maxTimeMS").AsInt64OK()
	if !ok {
		t.Fatalf("no maxTimeMS in %v", cmd.Body)
	}
	return ms
}

// TestEnforcedWriteCarriesLeaseBoundMaxTime: the forwarded write carries
// maxTimeMS no greater than the lease left minus the margin, keeps a
// smaller client value, and is answered by the proxy, not forwarded, once
// its deadline has passed.
func TestEnforcedWriteCarriesLeaseBoundMaxTime(t *testing.T) {
	g, _ := flightGuard(t, 2*time.Second)
	d := g.Intercept(context.Background(), flightRequest(t, nil))
	if d.Action != proxy.Rewrite {
		t.Fatalf("decision %v, want a rewrite carrying maxTimeMS", d.Action)
	}
	if ms := maxTimeOf(t, d.Message); ms > 1900 || ms < 1500 {
		t.Errorf("maxTimeMS %d, want at most lease left (2 s) minus margin (100 ms)", ms)
	}
	if until := time.Until(d.Deadline); until > 1900*time.Millisecond || until < 1500*time.Millisecond {
		t.Errorf("deadline in %v, want about 1.9 s", until)
	}
	if d.LateReply == nil || d.OnReply == nil {
		t.Fatal("no late reply or no flight hook")
	}
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())

	d = g.Intercept(context.Background(), flightRequest(t, func(b *bsoncore.DocumentBuilder) { b.AppendInt32("maxTimeMS", 20) }))
	if d.Action != proxy.Forward {
		t.Errorf("a smaller client maxTimeMS: decision %v, want the request forwarded unchanged", d.Action)
	}
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())

	// In a transaction the statement gets no maxTimeMS of its own.
	d = g.Intercept(context.Background(), flightRequest(t, func(b *bsoncore.DocumentBuilder) {
		b.AppendInt64("txnNumber", 1).AppendBoolean("autocommit", false)
	}))
	if d.Action != proxy.Forward {
		t.Errorf("in a transaction: decision %v, want forwarded unchanged", d.Action)
	}
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
}

// TestFlightEndIsTheEarliestLease: a write's deadline is when the
// earliest of its locks' leases surely ends, each counted from when its
// check started (v.Now, read again after a resolution), less the largest
// margin. A later check whose lease ends later moves nothing; one whose
// lease ends earlier brings the deadline forward.
func TestFlightEndIsTheEarliestLease(t *testing.T) {
	t0 := time.Now()
	ids := lockstoretest.IDs(int32(1))
	short, wide := &policy.Rule{LeaseMargin: 100 * time.Millisecond}, &policy.Rule{LeaseMargin: 300 * time.Millisecond}
	v := &verdict{}
	v.Now = t0
	v.flightLocksSince(&lockstore.Owner{}, short, namespace.Of("shop.a"), ids, 10*time.Second, false, 0)
	v.Now = t0.Add(3 * time.Second) // a resolution ran meanwhile
	v.flightLocksSince(&lockstore.Owner{}, short, namespace.Of("shop.b"), ids, 8*time.Second, false, 0)
	if got, want := v.flight.deadline(), t0.Add(10*time.Second-100*time.Millisecond); !got.Equal(want) {
		t.Errorf("a later check of a lease ending later: deadline %v after the first check, want %v", got.Sub(t0), want.Sub(t0))
	}
	v.flightLocksSince(&lockstore.Owner{}, wide, namespace.Of("shop.c"), ids, 5*time.Second, false, 0)
	if got, want := v.flight.deadline(), t0.Add(8*time.Second-300*time.Millisecond); !got.Equal(want) {
		t.Errorf("a later check of a lease ending earlier: deadline %v after the first check, want %v", got.Sub(t0), want.Sub(t0))
	}
	if v.flight.Left != 5*time.Second || len(v.flight.Locks) != 3 {
		t.Errorf("left %v, locks %v; want 5s and the three namespaces", v.flight.Left, v.flight.Locks)
	}
}

// TestReleaseWaitsForWritesInFlight: a release of the session, from any
// connection, waits for its enforced writes in flight; the flight renews
// the locks meanwhile; once answered, the release goes through.
func TestReleaseWaitsForWritesInFlight(t *testing.T) {
	g, st := flightGuardOrder(t, 200*time.Millisecond, time.Minute)
	d := g.Intercept(context.Background(), flightRequest(t, nil))
	if d.OnReply == nil {
		t.Fatal("no flight")
	}
	release := func(ctx context.Context) bsoncore.Document {
		b := bsoncore.NewDocumentBuilder().AppendString("releaseLock", "orders").
			AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(1).Build()).
			AppendDocument("lsid", flightLSID).AppendString("$db", "shop").Build()
		msg, _ := wire.Parse(wire.AppendMsg(nil, 2, 0, 0, b), wire.Limits{})
		cmd, _ := wire.CommandOf(msg)
		// Another connection of the same session: nothing of its own in flight.
		return g.Intercept(ctx, &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 2, Addr: "other"}}).Reply
	}
	// A release whose wait ends (its connection's context, here, as
	// OrderTimeout would) before the reply is refused.
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if r := release(short); st.release.Load() != 0 {
		t.Fatalf("released while the write was in flight: %v", r)
	} else if reason, _ := r.Lookup("lockgate", "reason").StringValueOK(); reason != refuse.ReasonInFlight {
		t.Errorf("release during the flight: %v, want reason %s", r, refuse.ReasonInFlight)
	}
	// The renewal is due at half the lease, 100 ms after the write left;
	// on a loaded machine its timer ran after the release's 300 ms wait
	// had ended, so it is waited for, the write still in flight (it lands
	// only by its reply, below).
	if !testkit.Within(10*time.Second, func() bool { return st.renews.Load() > 0 }) {
		t.Error("the locks of a write in flight past half its lease were not renewed")
	}
	done := make(chan bsoncore.Document)
	go func() { done <- release(context.Background()) }()
	testkit.Eventually(t, 10*time.Second, "the release to wait for the flight", func() bool { return parked("guard/inflight.(*Tracker).WaitSession") })
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
	r := <-done
	if st.release.Load() != 1 {
		t.Errorf("release after the reply: %v, want it released", r)
	}
}

// TestForceReleaseWaitsForWritesInFlight: an operator's force-release of a
// lock first waits for the writes this proxy forwarded under it.
func TestForceReleaseWaitsForWritesInFlight(t *testing.T) {
	g, _ := flightGuardOrder(t, 5*time.Second, time.Minute)
	d := g.Intercept(context.Background(), flightRequest(t, nil))
	if d.OnReply == nil {
		t.Fatal("no flight")
	}
	one := lockstoretest.ID(int64(1)) // NumberLong(1) is _id 1
	two := lockstoretest.ID(int32(2))
	if err := g.WaitWritesOn(context.Background(), namespace.Of("shop.orders"), two); err != nil {
		t.Errorf("a lock with no write in flight waited: %v", err)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := g.WaitWritesOn(short, namespace.Of("shop.orders"), one); err == nil {
		t.Error("force-release did not wait for the write in flight under the lock")
	}
	go func() {
		testkit.Eventually(t, 10*time.Second, "the force-release to wait for the flight", func() bool { return parked("guard/inflight.(*Tracker).WaitKey") })
		d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
	}()
	if err := g.WaitWritesOn(context.Background(), namespace.Of("shop.orders"), one); err != nil {
		t.Errorf("after the reply: %v", err)
	}
}

// TestShortLeaseFlightRenewedFirst: the flights share one renewal timer;
// a write whose lease is shorter than that of a write already in flight
// must bring the timer forward, or its locks would lapse while the longer
// lease's renewal is still far off.
func TestShortLeaseFlightRenewedFirst(t *testing.T) {
	g, st := flightGuard(t, 20*time.Second) // first renewal due in 10 s
	long := g.Intercept(context.Background(), flightRequest(t, nil))
	if long.OnReply == nil {
		t.Fatal("no flight")
	}
	st.left = 200 * time.Millisecond // the next check answers 200 ms: due in 100 ms
	short := g.Intercept(context.Background(), flightRequest(t, nil))
	if short.OnReply == nil {
		t.Fatal("no flight")
	}
	ok := bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build()
	defer long.OnReply.Reply(context.Background(), ok)
	defer short.OnReply.Reply(context.Background(), ok)
	// Renewed in 100 ms; the longer lease's timer would wait 10 s.
	testkit.Eventually(t, 3*time.Second, "the write with the shorter lease to be renewed", func() bool { return st.renews.Load() > 0 })
}

// parked reports whether a goroutine is blocked in a select in fn, a
// function named with its package path from lockgate's root: the event
// that a waiter has started to wait, seen without a hook in the code
// under test.
func parked(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte(" [select")) && bytes.Contains(g, []byte("/"+fn+"(")) {
			return true
		}
	}
	return false
}
