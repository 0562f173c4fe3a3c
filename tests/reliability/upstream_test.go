package reliability

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestUpstreamRestartMidTraffic is item 3 (restart) of issue 5: FerretDB is
// stopped and started again on the same address and data directory while
// four clients insert documents and run locked increments through one
// lockgate. Operations fail or wait while it is down (never acknowledged,
// never hanging past their deadline), then the clients recover through the
// SAME lockgate (never restarted) and the same driver client; every write
// acknowledged before, during or after the restart is in the database, and
// the locked counters hold at least every acknowledged increment and at
// most every attempted one.
func TestUpstreamRestartMidTraffic(t *testing.T) {
	t.Parallel()
	const workers = 4
	dir, err := os.MkdirTemp(tmpfsDir(), "lockgate-restart-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	t.Cleanup(func() {
		if srv != nil {
			srv.Close()
		}
	})
	ctx := testCtx(t, 3*time.Minute)
	collName := uniq("restart")
	ns := relDB + "." + collName
	g := startGateway(t, gatewayConfig(srv.URI(), uniq("locks"), ns))
	c := connect(t, g.URI, "restart-client", options.Client().SetServerSelectionTimeout(3*time.Second))
	coll := c.Database(relDB).Collection(collName)
	for w := 0; w < workers; w++ {
		if _, err := coll.InsertOne(ctx, counterDoc{ID: w}); err != nil {
			t.Fatal(err)
		}
	}

	var (
		phase        atomic.Int32 // 0 before, 1 stopping, 2 down, 3 starting or back
		errsAfter    atomic.Int64 // errors of operations that ended after the stop began
		overlapped   atomic.Int64 // operations in flight at some moment while the upstream was down
		okWhileDown  atomic.Int64 // operations acknowledged while it was down: must be 0
		slowest      atomic.Int64 // longest operation that ended after the stop began, ns
		okBefore     [workers]atomic.Int64
		failedDown   [workers]atomic.Int64 // errors of operations begun and ended while it was down
		okAfter      [workers]atomic.Int64
		ackedIncs    [workers]atomic.Int64
		triedIncs    [workers]atomic.Int64
		ackedInserts sync.Map
		lastErr      atomic.Value
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The workers stop before the test ends, also when a wait below fails
	// it: stopWorkers runs once, here or at cleanup.
	stopWorkers := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(func() {
		stopWorkers()
		if t.Failed() {
			t.Logf("last client error: %v", lastErr.Load())
		}
	})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			s, err := c.StartSession()
			if err != nil {
				t.Error(err)
				return
			}
			defer s.EndSession(context.Background())
			db := c.Database(relDB)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				startPhase := phase.Load()
				began := time.Now()
				opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				sctx := mongo.NewSessionContext(opCtx, s)
				var err error
				if i%2 == 0 {
					id := fmt.Sprintf("w%d-%d", w, i)
					_, err = db.Collection(collName).InsertOne(sctx, bson.D{{"_id", id}})
					if err == nil {
						ackedInserts.Store(id, true)
					}
				} else {
					err = db.RunCommand(sctx, bson.D{{"acquireLock", collName}, {"ids", bson.A{w}}, {"leaseMS", 5000}}).Err()
					if err == nil {
						triedIncs[w].Add(1)
						_, err = db.Collection(collName).UpdateOne(sctx, bson.D{{"_id", w}}, bson.D{{"$inc", bson.D{{"n", int64(1)}}}})
						if err == nil {
							ackedIncs[w].Add(1)
							err = db.RunCommand(sctx, bson.D{{"releaseLock", collName}, {"ids", bson.A{w}}}).Err()
						}
					}
				}
				cancel()
				p := phase.Load()
				if startPhase <= 2 && p >= 2 {
					overlapped.Add(1)
				}
				if p > 0 {
					if d := int64(time.Since(began)); d > slowest.Load() {
						slowest.Store(d)
					}
				}
				if err != nil {
					if p == 0 {
						t.Errorf("worker %d failed before the restart: %v", w, err)
						return
					}
					errsAfter.Add(1)
					if startPhase == 2 && p == 2 {
						failedDown[w].Add(1)
					}
					lastErr.Store(err.Error())
					// A client's pause before it tries again, as an
					// application's retry loop makes: pacing, not an
					// order of events.
					time.Sleep(50 * time.Millisecond)
					continue
				}
				switch {
				case p == 0:
					okBefore[w].Add(1)
				case startPhase == 2 && p == 2:
					// Begun after FerretDB had stopped and ended before
					// it was started again: no database could have
					// acknowledged it. (An operation begun before the
					// stop may have been acknowledged before it, the
					// phase read here after a pause of this goroutine;
					// CI saw one so counted once.)
					okWhileDown.Add(1)
				case p == 3:
					okAfter[w].Add(1)
				}
			}
		}(w)
	}

	// Every worker at work through the gateway before the stop, and every
	// one refused by the stopped upstream (an operation begun and failed
	// while it was down) before it comes back.
	allAtLeast := func(cs *[workers]atomic.Int64, n int64) func() bool {
		return func() bool {
			for w := range cs {
				if cs[w].Load() < n {
					return false
				}
			}
			return true
		}
	}
	testkit.Eventually(t, time.Minute, "five operations of every worker", allAtLeast(&okBefore, 5))
	phase.Store(1)
	srv.Close()
	srv = nil
	phase.Store(2) // FerretDB has stopped: nothing may be acknowledged now
	stopped := time.Now()
	testkit.Eventually(t, time.Minute, "every worker to be refused while the upstream is down", allAtLeast(&failedDown, 1))
	down := time.Since(stopped)
	phase.Store(3)
	srv, err = embedded.Start(embedded.Options{Addr: addr, Dir: dir})
	if err != nil {
		t.Fatalf("restarting the upstream on %s: %v", addr, err)
	}
	back := time.Now()
	testkit.Eventually(t, time.Minute, "five operations of every worker through the same lockgate after the upstream's return", allAtLeast(&okAfter, 5))
	recoveredIn := time.Since(back)
	stopWorkers()
	// Errors are what clients may see; what they must never see is an
	// acknowledgement while the database is down, or a hang: every
	// operation is bounded by its 5 s context, and the restart must have
	// happened under traffic. (lockgate holds a new client connection
	// until an upstream connection can be dialed, within
	// upstream.dialTimeout, so an operation started during a short
	// outage may simply wait for the upstream instead of failing.)
	if okWhileDown.Load() != 0 {
		t.Errorf("%d operations were acknowledged while the upstream was stopped", okWhileDown.Load())
	}
	if overlapped.Load() == 0 {
		t.Fatalf("no operation was in flight while the upstream was down: the restart did not happen under traffic")
	}
	t.Logf("upstream down %v: %d operations in flight while it was down, %d client errors from the stop on (last: %v), none acknowledged while down; slowest operation %v; every worker made 5 operations within %v of the upstream's return",
		down.Round(time.Millisecond), overlapped.Load(), errsAfter.Load(), lastErr.Load(), time.Duration(slowest.Load()).Round(time.Millisecond), recoveredIn.Round(time.Millisecond))

	// Every acknowledged write is there.
	direct := connect(t, srv.URI(), "direct-check")
	dcoll := direct.Database(relDB).Collection(collName)
	missing, acked := 0, 0
	ackedInserts.Range(func(k, _ any) bool {
		acked++
		if n, err := dcoll.CountDocuments(ctx, bson.D{{"_id", k}}); err != nil || n != 1 {
			missing++
			t.Errorf("acknowledged insert %v is missing after the restart (count %d, %v)", k, n, err)
		}
		return true
	})
	for w := 0; w < workers; w++ {
		var d counterDoc
		if err := dcoll.FindOne(ctx, bson.D{{"_id", w}}).Decode(&d); err != nil {
			t.Fatal(err)
		}
		if d.N < ackedIncs[w].Load() || d.N > triedIncs[w].Load() {
			t.Errorf("counter %d = %d: want between %d acknowledged and %d attempted locked increments", w, d.N, ackedIncs[w].Load(), triedIncs[w].Load())
		}
	}
	t.Logf("%d acknowledged inserts all present (%d missing); locked counters consistent", acked, missing)
}

// slowUpstream is a scripted standalone server whose "find" replies take
// delay; everything else is answered at once.
func slowUpstream(t *testing.T, delay time.Duration) (*scripted.Server, *atomic.Int64) {
	t.Helper()
	done := make(chan struct{})
	var finds atomic.Int64
	s, err := scripted.Start(func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil {
			return nil
		}
		switch cmd.Name {
		case "hello", "isMaster", "ismaster":
			return s.Reply(req, mustDoc(t, bson.D{
				{"helloOk", true}, {"ismaster", true}, {"isWritablePrimary", true},
				{"maxBsonObjectSize", int32(16 << 20)}, {"maxMessageSizeBytes", int32(48000000)},
				{"maxWriteBatchSize", int32(100000)}, {"localTime", time.Now()},
				{"logicalSessionTimeoutMinutes", int32(30)}, {"connectionId", int32(1)},
				{"minWireVersion", int32(0)}, {"maxWireVersion", int32(17)}, {"ok", 1.0},
			}))
		case "find":
			finds.Add(1)
			select {
			case <-time.After(delay):
			case <-done:
			}
			ns := cmd.DB + "." + "slow"
			return s.Reply(req, mustDoc(t, bson.D{
				{"cursor", bson.D{{"id", int64(0)}, {"ns", ns}, {"firstBatch", bson.A{bson.D{{"_id", 1}}}}}},
				{"ok", 1.0},
			}))
		}
		return s.Reply(req, mustDoc(t, bson.D{{"ok", 1.0}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(done)
		s.Close()
	})
	return s, &finds
}

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// proxyGoroutines counts the process's goroutines except the scripted
// upstream's: its handler sleeps through the delay whatever happens to the
// connection, and those goroutines belong to the test's fake server, not
// to lockgate. Everything else (gateway, proxy pumps, lock store, driver)
// is counted.
func proxyGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.TrimSpace(g) != "" && !strings.Contains(g, "lockgate/testserver/scripted.") {
			n++
		}
	}
	return n
}

// settledGoroutines waits for proxyGoroutines to stop falling and returns
// it. It is a measurement, not a wait for an event: goroutines of closed
// connections end at their own pace, and a reading is taken once two
// readings 50 ms apart no longer fall (at most a second).
func settledGoroutines() int {
	n := proxyGoroutines()
	for i := 0; i < 20; i++ {
		time.Sleep(50 * time.Millisecond)
		m := proxyGoroutines()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}

// TestSlowUpstreamTimeouts is item 3 (slow upstream) of issue 5: the
// upstream (a scripted server, since FerretDB cannot be made slow) takes
// 1.5 s to answer find. A client with a 200 ms operation timeout gets a
// timeout error from its driver for each of 60 finds (6 at a time); a
// client with a longer timeout gets the slow answer, so lockgate adds no
// timeout of its own. While the client stays connected the goroutine count
// stays bounded by its pool, not by the number of timed-out requests; once
// it disconnects (and the upstream's slow handlers have finished) the
// process is back to its goroutine baseline and
// lockgate_client_connections is 0.
func TestSlowUpstreamTimeouts(t *testing.T) {
	const (
		delay     = 1500 * time.Millisecond
		timeout   = 200 * time.Millisecond
		parallel  = 6
		perWorker = 10
		// slack absorbs background goroutines that come and go (driver
		// monitors, timers), not one per request.
		slack = 8
	)
	up, finds := slowUpstream(t, delay)
	g := startGateway(t, gatewayConfig("mongodb://"+up.Addr()+"/?directConnection=true", uniq("locks"), ""))
	// Warm-up: one connection through and back, so that lazily started
	// goroutines of the gateway exist before the baseline.
	warm := connect(t, g.URI, "warm")
	if err := warm.Ping(testCtx(t, 10*time.Second), nil); err != nil {
		t.Fatalf("ping through lockgate to the scripted upstream: %v", err)
	}
	warm.Disconnect(context.Background())
	testkit.Eventually(t, 10*time.Second, "lockgate_client_connections to return to 0 after the warm-up", func() bool {
		return g.metric(t, "lockgate_client_connections", nil) == 0
	})
	baseline := settledGoroutines()

	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(g.URI).SetAppName("impatient").SetMaxPoolSize(parallel))
	if err != nil {
		t.Fatal(err)
	}
	coll := c.Database("slowdb").Collection("slow")
	var timeouts, others atomic.Int64
	var otherErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				err := coll.FindOne(ctx, bson.D{{"_id", 1}}).Err()
				cancel()
				switch {
				case err != nil && mongo.IsTimeout(err):
					timeouts.Add(1)
				default:
					others.Add(1)
					otherErr.Store(fmt.Sprint(err))
				}
			}
		}()
	}
	wg.Wait()
	// Measured once the count stops falling: connections the driver just
	// closed after a timeout are still being torn down for a moment.
	during := settledGoroutines()
	t.Logf("%d finds with a %v timeout against a %v upstream: %d timed out, %d other outcomes (%v); upstream saw %d finds; goroutines baseline %d, %d with the client still connected",
		parallel*perWorker, timeout, delay, timeouts.Load(), others.Load(), otherErr.Load(), finds.Load(), baseline, during)
	if timeouts.Load() != parallel*perWorker {
		t.Errorf("%d of %d operations did not end in a timeout error (last: %v)", others.Load(), parallel*perWorker, otherErr.Load())
	}
	if finds.Load() == 0 {
		t.Fatalf("no find reached the upstream: the timeouts happened somewhere else")
	}
	// Each pooled connection costs a few goroutines (driver side, the
	// proxy's two pumps and its retirement watcher): bounded by the pool
	// (4 per connection), far below one per timed-out request.
	if during-baseline > 4*parallel+slack {
		t.Errorf("goroutines grew by %d during %d timed-out requests on a pool of %d (bound %d): pile-up", during-baseline, parallel*perWorker, parallel, 4*parallel+slack)
	}

	// A patient client gets the slow answer through the same proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := coll.FindOne(ctx, bson.D{{"_id", 1}}).Err(); err != nil {
		t.Errorf("a find with a 10s timeout on a %v upstream failed: %v", delay, err)
	}
	cancel()

	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	c.Disconnect(dctx)
	dcancel()
	testkit.Eventually(t, 15*time.Second, "lockgate_client_connections to return to 0", func() bool {
		return g.metric(t, "lockgate_client_connections", nil) == 0
	})
	var after int
	t.Cleanup(func() {
		if t.Failed() && after > baseline+slack {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Logf("goroutines: %d now, %d before (slack %d)\n%s", after, baseline, slack, buf[:n])
		}
	})
	testkit.Eventually(t, 15*time.Second, "the goroutines to return to the baseline", func() bool {
		after = settledGoroutines()
		return after <= baseline+slack
	})
	t.Logf("after disconnect: %d goroutines (baseline %d), lockgate_client_connections 0", after, baseline)
}
