package lockstore

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// upstreamURI is the embedded FerretDB shared by the package's tests.
var upstreamURI string

// parallelTests is how many tests of the package run at once unless
// -parallel says otherwise. The tests spend most of their time waiting on
// real time (a second Store's first grant waits CacheTrust or
// NewcomerHorizon, waits and polls run out), not on the CPU: go's default
// of one test per CPU left a 2-core machine mostly idle through them.
const parallelTests = 4

func TestMain(m *testing.M) {
	flag.Parse()
	testkit.DefaultParallel(parallelTests)
	if err := testkit.OnlyRaceScaled(raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(testkit.RunMain(m, func() (func() error, error) {
		// SQLite on tmpfs when there is one: the tests measure the lock
		// store, not fsync.
		opts := embedded.Options{}
		var shmDir string
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			if d, err := os.MkdirTemp("/dev/shm", "lockgate-lockstore-"); err == nil {
				shmDir, opts.Dir = d, d
			}
		}
		srv, err := embedded.Start(opts)
		if err != nil {
			return nil, fmt.Errorf("embedded upstream: %w", err)
		}
		upstreamURI = srv.URI()
		return func() error {
			if shmDir != "" {
				defer os.RemoveAll(shmDir)
			}
			return srv.Close()
		}, nil
	}))
}

var collSeq atomic.Int64

// noMemoryLocks is the NewcomerHorizon of tests that open two Stores on
// one collection and take no implicit (memory) locks: with memory locks
// off, a Store that finds another registered waits CacheTrust (a second
// by default) before its first grant instead of the 3 s horizon that
// memory-locked writes need (memlock.go). The wait itself is still
// there, and still what these tests run through; the memory-lock tests
// (memlock_test.go) keep the default horizon.
const noMemoryLocks = -1

// holdLease is the lease of a hold that a test checks the answers about:
// the longest a Store grants by default, so that a loaded run (tests run
// several at a time) never sees the hold end under its checks, which a
// minute's lease did under -race at a load of 18.
const holdLease = DefaultMaxLease

// testConfig returns a config on a collection of its own, in a database of
// its own: FerretDB keeps each database in one SQLite file, which takes one
// writer at a time, so tests running at once (t.Parallel) on one database
// wait on each other's writes.
func testConfig(t testing.TB) Config {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	seq := collSeq.Add(1)
	return Config{
		URI:          upstreamURI,
		Database:     fmt.Sprintf("lockstore_%d", seq),
		Collection:   fmt.Sprintf("locks_%s_%d", name, seq),
		OpTimeout:    20 * time.Second, // FerretDB under -race can be slow
		CleanupAfter: 5 * time.Minute,
	}
}

func openStore(t testing.TB, cfg Config, opts ...Option) *Store {
	t.Helper()
	if _, ok := t.(*testing.T); ok {
		opts = append([]Option{WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))}, opts...)
	}
	s, err := Open(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

func newOwner(app string) Owner {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return Owner{Session: b, App: app, Client: "127.0.0.1:1"}
}

// rv makes an _id.
func rv(t testing.TB, v any) docid.ID {
	t.Helper()
	id, err := docid.Of(v)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func ids(t testing.TB, vs ...any) []docid.ID {
	out := make([]docid.ID, len(vs))
	for i, v := range vs {
		out[i] = rv(t, v)
	}
	return out
}

// fakeClock is a server clock that tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now().Truncate(time.Millisecond)} }

func (c *fakeClock) Now() (time.Time, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t, 0
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
