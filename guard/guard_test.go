package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/testserver/embedded"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// upstream is the embedded FerretDB that the tests needing a real
// database share, started by the first of them (upstreamURI,
// upstreamAddr): the benchmarks and the tests on memstore run without
// it, so that its goroutines, which run by the clock, add nothing to a
// benchmark's counts (embedded.Lazy).
var upstream = embedded.NewLazy(embedded.Options{})

func upstreamServer(tb testing.TB) *embedded.Server {
	tb.Helper()
	srv, err := upstream.Server()
	if err != nil {
		tb.Fatal(err)
	}
	return srv
}

func upstreamURI(tb testing.TB) string  { tb.Helper(); return upstreamServer(tb).URI() }
func upstreamAddr(tb testing.TB) string { tb.Helper(); return upstreamServer(tb).Addr() }

func TestMain(m *testing.M) {
	if uri := os.Getenv("LOCKGATE_HOLDER_URI"); uri != "" {
		holderProcess(uri, os.Getenv("LOCKGATE_HOLDER_COLL"))
		return
	}
	if err := testkit.OnlyRaceScaled(raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(testkit.RunMain(m, func() (func() error, error) { return upstream.Close, nil }))
}

type dialAddr string

func (a dialAddr) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", string(a))
}

var seq atomic.Int64

// stack is one proxy with a guard and its own lock collection.
type stack struct {
	uri     string
	addr    string
	store   *lockstore.Store
	guard   *Guard
	metrics *Metrics
}

// stackOptions vary a test stack.
type stackOptions struct {
	collection string        // lock collection; "" for a fresh one
	storeURI   string        // lock store deployment; "" for the upstream
	policy     config.Policy // zero: everything off
	resolver   func(Resolver) Resolver
	logger     *zap.Logger
	// resolveTimeout and maxResolves: zero keeps the guard's defaults.
	resolveTimeout time.Duration
	maxResolves    int
	// ownerSecret: nil gives every test stack the same one, as proxies
	// that share a lock store must have.
	ownerSecret []byte
	// upstreamAddr replaces the embedded upstream behind the proxy (the
	// lock store stays on it); authRequired is the guard's AuthRequired.
	upstreamAddr string
	authRequired func() bool
	// storeMetrics, when set, are the lock store's collectors.
	storeMetrics *lockstore.Metrics
	// memStore, when set, is the lock store instead of a lockstore.Store
	// on the embedded FerretDB (stack.store stays nil): for tests of the
	// guard's decisions, where the store's own behaviour is not the
	// subject. Stacks given the same memStore share its locks, as proxies
	// on one lock database do; lockstoretest holds both stores to the
	// same contract.
	memStore *memstore.Store
	// noMemoryLocks turns the lock store's memory locks off
	// (NewcomerHorizon negative), so that a second stack on the same
	// collection waits CacheTrust (a second) before its first grant
	// instead of their 3 s horizon: for tests of several stacks that take
	// no implicit locks.
	noMemoryLocks bool
	// opTimeout, when set, is the lock store's OpTimeout.
	opTimeout time.Duration
	// trail, when set, is the guard's audit trail.
	trail AuditTrail
}

// decisionStore is a lock store in memory with the test stacks' leases
// (5 s by default, a minute at most), for the tests whose subject is a
// guard decision, not what reached the lock database: they run without
// the lock store's calls to FerretDB (docs/TESTING.md, issue 25).
func decisionStore() *memstore.Store {
	return memstore.New(memstore.Config{DefaultLease: 5 * time.Second, MaxLease: time.Minute})
}

var testOwnerSecret = []byte("lockgate-test-owner-secret-0123456789")

func startStack(t *testing.T, collection string) *stack {
	return startStackWith(t, stackOptions{collection: collection})
}

func startStackWith(t testing.TB, so stackOptions) *stack {
	t.Helper()
	if so.collection == "" {
		so.collection = fmt.Sprintf("locks_%d", seq.Add(1))
	}
	opTimeout := so.opTimeout // zero: the store's default
	if so.storeURI == "" {
		so.storeURI = upstreamURI(t)
	} else {
		// The only other deployment is an unreachable one: each call
		// fails after this, and a test makes five of them.
		opTimeout = 300 * time.Millisecond
	}
	if so.logger == nil {
		so.logger = zaptest.NewLogger(t)
	}
	ctx := context.Background()
	var store *lockstore.Store
	var lockStore LockStore = so.memStore
	if so.memStore == nil {
		storeOpts := []lockstore.Option{lockstore.WithLogger(so.logger)}
		if so.storeMetrics != nil {
			storeOpts = append(storeOpts, lockstore.WithMetrics(so.storeMetrics))
		}
		cfg := lockstore.Config{
			URI: so.storeURI, Database: "lockgate_guard_test", Collection: so.collection,
			DefaultLease: 5 * time.Second, MaxLease: time.Minute, OpTimeout: opTimeout,
		}
		if so.noMemoryLocks {
			cfg.NewcomerHorizon = -1
		}
		var err error
		store, err = lockstore.Open(ctx, cfg, storeOpts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close(context.Background()) })
		lockStore = store
	}
	rc, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Disconnect(context.Background()) })
	var res Resolver = NewResolver(rc)
	if so.resolver != nil {
		res = so.resolver(res)
	}
	if so.ownerSecret == nil {
		so.ownerSecret = testOwnerSecret
	}
	if so.policy.Default == "" {
		so.policy.Default = config.ModeOff
	}
	if so.policy.MaxCandidates == 0 {
		so.policy.MaxCandidates = 100
	}
	pol, err := policy.Compile(so.policy)
	if err != nil {
		t.Fatal(err)
	}
	metrics := NewMetrics()
	gd := New(Options{
		Store: lockStore, Resolver: res, Metrics: metrics, Logger: so.logger, Trail: so.trail,
		ResolveTimeout: so.resolveTimeout, MaxResolves: so.maxResolves, OwnerSecret: so.ownerSecret,
		AuthRequired:         so.authRequired,
		EndSessionsSupported: func(context.Context) (bool, error) { return false, nil },
	})
	gd.SetPolicy(pol)
	if so.upstreamAddr == "" {
		so.upstreamAddr = upstreamAddr(t)
	}
	srv, err := proxy.New(proxy.Options{
		Upstream:    dialAddr(so.upstreamAddr),
		Interceptor: gd,
		Logger:      so.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { srv.Serve(sctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &stack{uri: "mongodb://" + ln.Addr().String() + "/", addr: ln.Addr().String(), store: store, guard: gd, metrics: metrics}
}

func connect(t testing.TB, uri, app string) *mongo.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetAppName(app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c
}

// run executes cmd in the session sess (nil: implicit session).
func run(t *testing.T, c *mongo.Client, sess mongo.Session, cmd bson.D) (bson.M, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if sess != nil {
		ctx = mongo.NewSessionContext(ctx, sess)
	}
	var out bson.M
	err := c.Database("shop").RunCommand(ctx, cmd).Decode(&out)
	return out, err
}

func session(t testing.TB, c *mongo.Client) mongo.Session {
	t.Helper()
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.EndSession(context.Background()) })
	return s
}

func commandError(t *testing.T, err error) mongo.CommandError {
	t.Helper()
	var ce mongo.CommandError
	if !errors.As(err, &ce) {
		t.Fatalf("want a server error, got %v", err)
	}
	return ce
}

func TestAcquireContendReleaseStatus(t *testing.T) {
	st := startStack(t, "")
	alice := connect(t, st.uri, "alice-app")
	bob := connect(t, st.uri, "bob-app")
	sa, sb := session(t, alice), session(t, bob)

	got, err := run(t, alice, sa, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1, "x"}}, {"leaseMS", 10000}})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	locks := got["locks"].(bson.A)
	if len(locks) != 2 {
		t.Fatalf("locks = %v", locks)
	}
	first := locks[0].(bson.M)
	if first["_id"] != int32(1) || first["token"].(int64) < 1 {
		t.Fatalf("first lock = %v", first)
	}
	if _, ok := first["expiresAt"].(interface{ Time() time.Time }); !ok {
		t.Fatalf("expiresAt is %T, want a date", first["expiresAt"])
	}
	// The reply names the session that now holds the locks (the implicit
	// session trap: docs/LOCKS.md).
	_, lsid := sa.ID().Lookup("id").Binary()
	if want := lockstore.SessionPrefix(lsid); got["session"] != want ||
		!strings.Contains(fmt.Sprint(got["note"]), want) {
		t.Fatalf("acquire reply session %v, note %q; want the caller's session %s named in both", got["session"], got["note"], want)
	}

	// Renew keeps the token and moves the lease; a non-holder cannot renew.
	renewed, err := run(t, alice, sa, bson.D{{"renewLock", "orders"}, {"ids", bson.A{1}}, {"leaseMS", 30000}})
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if rl := renewed["locks"].(bson.A)[0].(bson.M); rl["token"] != first["token"] {
		t.Fatalf("renew changed the token: %v -> %v", first["token"], rl["token"])
	}
	_, err = run(t, bob, sb, bson.D{{"renewLock", "orders"}, {"ids", bson.A{1}}})
	if ce := commandError(t, err); ce.Code != 107 || ce.Name != "LockFailed" {
		t.Fatalf("renew by a non-holder: code %d %s, want 107 LockFailed", ce.Code, ce.Name)
	}

	// Another session, same key as a double: busy, naming the holder.
	_, err = run(t, bob, sb, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1.0}}})
	ce := commandError(t, err)
	if ce.Code != 46 || ce.Name != "LockBusy" {
		t.Fatalf("contended acquire: code %d %s, want 46 LockBusy", ce.Code, ce.Name)
	}
	if !strings.Contains(ce.Message, `"alice-app"`) || !strings.Contains(ce.Message, "waitMS") {
		t.Fatalf("errmsg does not name the holder or say what to do: %q", ce.Message)
	}
	detail, err := run(t, bob, sb, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{int64(1)}}})
	if err == nil {
		t.Fatalf("NumberLong(1) is the same key as 1: acquire must fail, got %v", detail)
	}

	// A string "1" is another key.
	if _, err := run(t, bob, sb, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{"1"}}}); err != nil {
		t.Fatalf(`"1" is not 1: %v`, err)
	}

	status, err := run(t, bob, sb, bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1, "1", 99}}})
	if err != nil {
		t.Fatal(err)
	}
	sl := status["locks"].(bson.A)
	held := func(i int) (bool, bool) {
		m := sl[i].(bson.M)
		return m["held"].(bool), m["heldByYou"].(bool)
	}
	if h, you := held(0); !h || you {
		t.Fatalf("status of 1 for bob: held=%v heldByYou=%v", h, you)
	}
	if h, you := held(1); !h || !you {
		t.Fatalf(`status of "1" for bob: held=%v heldByYou=%v`, h, you)
	}
	if h, _ := held(2); h {
		t.Fatalf("99 was never locked")
	}
	if owner := sl[0].(bson.M)["holder"].(bson.M); owner["app"] != "alice-app" {
		t.Fatalf("owner = %v", owner)
	}

	// Bob cannot release Alice's lock; Alice can, leaving a note.
	if got, err := run(t, bob, sb, bson.D{{"releaseLock", "orders"}, {"ids", bson.A{1}}}); err != nil || got["released"] != int32(0) {
		t.Fatalf("release by a non-holder: %v %v", got, err)
	}
	if got, err := run(t, alice, sa, bson.D{{"releaseLock", "orders"}, {"error", "payment step failed"}}); err != nil || got["released"] != int32(2) {
		t.Fatalf("release all: %v %v", got, err)
	}
	status, err = run(t, bob, sb, bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1}}})
	if err != nil {
		t.Fatal(err)
	}
	if m := status["locks"].(bson.A)[0].(bson.M); m["held"] != false || m["lastError"] != "payment step failed" {
		t.Fatalf("after release: %v", m)
	}
	got, err = run(t, bob, sb, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}})
	if err != nil {
		t.Fatal(err)
	}
	if tok := got["locks"].(bson.A)[0].(bson.M)["token"].(int64); tok <= first["token"].(int64) {
		t.Fatalf("fencing token went from %d to %d, must grow", first["token"], tok)
	}
}

func TestBadArgumentsTakeNothing(t *testing.T) {
	st := startStack(t, "")
	cases := []struct {
		cmd  bson.D
		code int32
		want string
	}{
		{bson.D{{"acquireLock", "orders"}}, 2, "missing ids"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{}}}, 2, "empty"},
		{bson.D{{"acquireLock", "orders"}, {"ids", 1}}, 14, "array"},
		{bson.D{{"acquireLock", 5}, {"ids", bson.A{1}}}, 14, "collection name"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"leaseMS", -1}}, 2, "negative"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"leaseMS", 3_600_000}}, 2, "lease"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"leaseMS", "soon"}}, 14, "milliseconds"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"waitMS", 1.5}}, 14, "milliseconds"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"color", "red"}}, 40415, "unknown field"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{bson.A{1}}}}, 2, "_id"},
		{bson.D{{"renewLock", "orders"}, {"ids", bson.A{1}}, {"waitMS", 5}}, 40415, "unknown field"},
		{bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"bind", 5}}, 14, "bind must be a string"},
		{bson.D{{"releaseLock", "orders"}, {"error", bson.D{}}}, 14, "error must be a string"},
	}
	for _, tc := range cases {
		// Each malformed command doubles the delay before the
		// connection's next lock command (TestThrottleLockCommands):
		// a connection of its own per case keeps the thirteen cases from
		// waiting out 4 s of it, which is not this test's subject.
		c := connect(t, st.uri, "args")
		_, err := run(t, c, session(t, c), tc.cmd)
		ce := commandError(t, err)
		if ce.Code != tc.code || !strings.Contains(ce.Message, tc.want) {
			t.Errorf("%v: got %d %q, want code %d mentioning %q", tc.cmd, ce.Code, ce.Message, tc.code, tc.want)
		}
	}
	all, err := st.store.List(context.Background(), lockstore.ListOptions{IncludeFree: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 0 {
		t.Fatalf("refused commands left lock records: %v", all)
	}
}

func TestWaiterOnSameProxyGetsTheLockOnRelease(t *testing.T) {
	st := startStack(t, "")
	c := connect(t, st.uri, "waiters")
	holder, waiter := session(t, c), session(t, c)
	if _, err := run(t, c, holder, bson.D{{"acquireLock", "jobs"}, {"ids", bson.A{"j1"}}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		_, err := run(t, c, waiter, bson.D{{"acquireLock", "jobs"}, {"ids", bson.A{"j1"}}, {"waitMS", 5000}})
		done <- result{time.Now(), err}
	}()
	j1, _ := docid.Of("j1")
	testkit.Eventually(t, 10*time.Second, "the waiter to queue", func() bool { return st.store.Waiting(namespace.Of("shop.jobs"), j1) == 1 })
	released := time.Now()
	if _, err := run(t, c, holder, bson.D{{"releaseLock", "jobs"}, {"ids", bson.A{"j1"}}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	t.Logf("waiter held the lock %v after the release was sent", r.at.Sub(released))

	// A waiter whose wait runs out gets LockTimeout.
	_, err := run(t, c, holder, bson.D{{"acquireLock", "jobs"}, {"ids", bson.A{"j1"}}, {"waitMS", 100}})
	if ce := commandError(t, err); ce.Code != 24 || ce.Name != "LockTimeout" {
		t.Fatalf("timed-out wait: %d %s, want 24 LockTimeout", ce.Code, ce.Name)
	}
}

func TestEndSessionsReleasesLocks(t *testing.T) {
	st := startStack(t, "")
	c := connect(t, st.uri, "ender")
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, c, s, bson.D{{"acquireLock", "jobs"}, {"ids", bson.A{7}}, {"leaseMS", 60000}}); err != nil {
		t.Fatal(err)
	}
	s.EndSession(context.Background())
	// Disconnect sends endSessions for every pooled session.
	if err := c.Disconnect(context.Background()); err != nil {
		t.Fatal(err)
	}
	other := connect(t, st.uri, "next")
	if _, err := run(t, other, session(t, other), bson.D{{"acquireLock", "jobs"}, {"ids", bson.A{7}}}); err != nil {
		t.Fatalf("lock not freed by endSessions: %v", err)
	}
}

// TestLockCommandNamespaceHints: the namespace mistakes of issue 9 explain
// themselves in the reply: a collection that repeats the database name,
// and a collection that does not exist.
func TestLockCommandNamespaceHints(t *testing.T) {
	st := startStack(t, "")
	c := connect(t, st.uri, "hints")
	s := session(t, c)
	got, err := run(t, c, s, bson.D{{"acquireLock", "shop.orders"}, {"ids", bson.A{1}}})
	if err != nil {
		t.Fatal(err)
	}
	warnings := fmt.Sprint(got["warnings"])
	if !strings.Contains(warnings, "shop.shop.orders") || !strings.Contains(warnings, `{acquireLock: "orders"}`) {
		t.Errorf("warnings %q do not explain the doubled database name", warnings)
	}
	if !strings.Contains(warnings, "does not exist") {
		t.Errorf("warnings %q do not say that shop.shop.orders does not exist", warnings)
	}
	// The README's walk-through: a lock before the collection exists warns;
	// after the first insert creates it, the next lock must not (a cached
	// absence used to outlive the insert by 30 s).
	got, err = run(t, c, s, bson.D{{"acquireLock", "hinted"}, {"ids", bson.A{2}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(got["warnings"]), "shop.hinted does not exist") {
		t.Errorf("acquireLock before the collection exists: warnings %v, want one saying shop.hinted does not exist", got["warnings"])
	}
	if _, err := c.Database("shop").Collection("hinted").InsertOne(context.Background(), bson.D{{"_id", 1}}); err != nil {
		t.Fatal(err)
	}
	got, err = run(t, c, s, bson.D{{"acquireLock", "hinted"}, {"ids", bson.A{1}}})
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := got["warnings"]; ok {
		t.Errorf("a correct lock command got warnings: %v", w)
	}
	// A name that differs from an existing collection's only by case.
	got, err = run(t, c, s, bson.D{{"acquireLock", "Hinted"}, {"ids", bson.A{1}}})
	if err != nil {
		t.Fatal(err)
	}
	if w := fmt.Sprint(got["warnings"]); !strings.Contains(w, "the collection shop.Hinted does not exist, shop.hinted does: names differ only by case") {
		t.Errorf("acquireLock \"Hinted\" where shop.hinted exists: warnings %q, want the case-only difference named", w)
	}
}

// TestEndSessionsWrongTypeIsAnError: {endSessions: 1} used to panic the
// connection handler (recovered, one stack trace per message); it is a
// TypeMismatch like the server's, and the connection stays usable.
func TestEndSessionsWrongTypeIsAnError(t *testing.T) {
	st := startStack(t, "")
	c := connect(t, st.uri, "shapes")
	for i := 0; i < 3; i++ {
		_, err := run(t, c, nil, bson.D{{"endSessions", 1}})
		if ce := commandError(t, err); ce.Code != 14 {
			t.Fatalf("{endSessions: 1}: code %d (%v), want 14 TypeMismatch", ce.Code, err)
		}
	}
	if _, err := run(t, c, nil, bson.D{{"ping", 1}}); err != nil {
		t.Fatalf("the connection after the refusals: %v", err)
	}
}
