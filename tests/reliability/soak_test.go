package reliability

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/wire"
)

// rawConn is a minimal MongoDB client speaking OP_MSG by hand with a
// session id of its own: 500 of them cost far less than 500 driver
// clients (each with its own monitor connection), so the proxy's cost is
// what the soak measures.
type rawConn struct {
	c    net.Conn
	r    *bufio.Reader
	lsid bson.D
	id   int32
}

func dialRawConn(addr string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return &rawConn{c: c, r: bufio.NewReaderSize(c, 512), lsid: bson.D{{"id", primitive.Binary{Subtype: 4, Data: u[:]}}}}, nil
}

// run sends cmd (with $db and, when session is true, lsid) and returns the
// reply body. Any error is a transport or framing failure.
func (rc *rawConn) run(db string, cmd bson.D, session bool) (bson.Raw, error) {
	if session {
		cmd = append(cmd, bson.E{"lsid", rc.lsid})
	}
	cmd = append(cmd, bson.E{"$db", db})
	body, err := bson.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	rc.id++
	rc.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := rc.c.Write(wire.AppendMsg(nil, rc.id, 0, 0, body)); err != nil {
		return nil, err
	}
	raw, err := wire.ReadMessage(rc.r, nil, wire.Limits{})
	if err != nil {
		return nil, err
	}
	m, err := wire.Parse(raw.Bytes, wire.Limits{})
	if err != nil {
		return nil, err
	}
	msg, ok := m.(*wire.OpMsg)
	if !ok {
		return nil, fmt.Errorf("reply in %v", m.Header().OpCode)
	}
	if msg.Header().ResponseTo != rc.id {
		return nil, fmt.Errorf("reply to %d, want %d", msg.Header().ResponseTo, rc.id)
	}
	return bson.Raw(msg.Body), nil
}

// replyCode returns 0 for {ok:1} without write errors, else the error code.
func replyCode(r bson.Raw) int32 {
	if v, err := r.LookupErr("ok"); err == nil {
		if f, ok := v.AsInt64OK(); ok && f == 1 {
			if we, err := r.LookupErr("writeErrors"); err == nil {
				vals, _ := we.Array().Values()
				if len(vals) > 0 {
					if c, ok := vals[0].Document().Lookup("code").AsInt64OK(); ok {
						return int32(c)
					}
					return -1
				}
			}
			return 0
		}
	}
	if c, ok := r.Lookup("code").AsInt64OK(); ok {
		return int32(c)
	}
	return -1
}

// memSample is the process's memory and goroutines after a full GC.
type memSample struct {
	heapStack  uint64 // HeapInuse + StackInuse
	live       uint64 // heap bytes marked live by the last GC
	rss        uint64 // VmRSS, bytes
	goroutines int
}

func sampleMem() memSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	return memSample{heapStack: ms.HeapInuse + ms.StackInuse, live: live[0].Value.Uint64(), rss: vmRSS(), goroutines: runtime.NumGoroutine()}
}

// vmRSS reads the resident set size from /proc/self/status; 0 where there
// is none.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// raiseFDLimit makes room for n sockets. Go already raises the soft
// RLIMIT_NOFILE to the hard limit at start-up on Linux; this is for
// environments where that is not enough to be obvious.
func raiseFDLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Logf("getrlimit: %v", err)
		return
	}
	if lim.Cur >= n {
		return
	}
	want := min(max(n, lim.Cur), lim.Max)
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Logf("setrlimit: %v", err)
	}
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	t.Logf("file descriptor limit raised to %d (hard limit %d)", lim.Cur, lim.Max)
	if lim.Cur < n {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs %d file descriptors; the hard limit is %d (CI is set, so this is a failure: raise the limit)", n, lim.Max)
		}
		t.Skipf("this test needs %d file descriptors; the hard limit is %d", n, lim.Max)
	}
}

// openIdle opens n raw connections to addr, each answering one ping.
func openIdle(t *testing.T, addr string, n int) []*rawConn {
	t.Helper()
	conns := make([]*rawConn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			rc, err := dialRawConn(addr)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = rc
			r, err := rc.run("admin", bson.D{{"ping", 1}}, false)
			if err != nil || replyCode(r) != 0 {
				errs <- fmt.Errorf("ping on connection %d: %v %v", i, r, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		closeAll(conns)
		t.Fatal(err)
	}
	return conns
}

func closeAll(conns []*rawConn) {
	for _, c := range conns {
		if c != nil {
			c.c.Close()
		}
	}
}

// mixStats counts the outcomes of a mixed-traffic run.
type mixStats struct {
	reads, inserts, lockedWrites, busy, refused, otherErrs, unlockedLanded atomic.Int64
	// storeDown counts refusals that name the lock store as unreachable:
	// lockgate failing closed when a loaded machine's FerretDB answers it
	// after the store's operation timeout, which is the designed answer,
	// not a fault of the proxy under test.
	storeDown        atomic.Int64
	ioErr, lastOther atomic.Value
	peakGoroutines   int
	peakRSS          uint64
}

func (m *mixStats) ops() int64 {
	return m.reads.Load() + m.inserts.Load() + m.lockedWrites.Load() + m.busy.Load() + m.refused.Load() + m.otherErrs.Load() + m.storeDown.Load()
}

// storeUnavailable reports whether a reply is lockgate's refusal for a
// lock store it could not reach (reason lockstore_unavailable, in the
// command's or a write error's details).
func storeUnavailable(r bson.Raw) bool {
	return bytes.Contains(r, []byte(`lockstore_unavailable`))
}

// runMixed drives every connection with mixed traffic until duration
// passes: 40% finds on the enforced collection, 20% inserts elsewhere, 25%
// acquireLock (fail-fast) + locked $inc + releaseLock, 15% unlocked $inc on
// the enforced collection in a session that holds nothing (must be
// refused). Each connection pauses 50-250 ms between operations.
func runMixed(ctx context.Context, conns []*rawConn, collName string, keys int, duration time.Duration, round int) *mixStats {
	st := &mixStats{}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for i, rc := range conns {
		wg.Add(1)
		go func(i int, rc *rawConn) {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(i), uint64(round)))
			fail := func(err error) { st.ioErr.Store(fmt.Sprintf("connection %d: %v", i, err)) }
			other := func(what string, r bson.Raw) {
				if storeUnavailable(r) {
					st.storeDown.Add(1)
					return
				}
				st.otherErrs.Add(1)
				st.lastOther.Store(fmt.Sprintf("%s: %v", what, r))
			}
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
				k := rng.IntN(keys)
				switch p := rng.IntN(100); {
				case p < 40:
					r, err := rc.run(relDB, bson.D{{"find", collName}, {"filter", bson.D{{"_id", k}}}}, true)
					if err != nil {
						fail(err)
						return
					}
					if replyCode(r) != 0 {
						other("find", r)
						continue
					}
					st.reads.Add(1)
				case p < 60:
					r, err := rc.run(relDB, bson.D{{"insert", collName + "_free"}, {"documents", bson.A{bson.D{{"_id", fmt.Sprintf("r%d-c%d-%d", round, i, n)}}}}}, true)
					if err != nil {
						fail(err)
						return
					}
					if replyCode(r) != 0 {
						other("insert", r)
						continue
					}
					st.inserts.Add(1)
				case p < 85:
					// A lease no loaded machine outlasts between the
					// acquire and the write: 500 clients queue on one
					// FerretDB, and a 10 s lease ran out under a load
					// average of 15 (the write refused, not_holder).
					// Every client releases, so the length costs nothing.
					r, err := rc.run(relDB, bson.D{{"acquireLock", collName}, {"ids", bson.A{k}}, {"leaseMS", 120000}}, true)
					if err != nil {
						fail(err)
						return
					}
					switch replyCode(r) {
					case 0:
					case 46:
						if !storeUnavailable(r) {
							st.busy.Add(1)
							continue
						}
						// Failing closed on a slow lock store, lockgate cannot
						// say whether the lock was taken: the store may still
						// grant it after the refusal. The client releases, as
						// one that does not know must; without it such a lock
						// stayed held for its 120 s lease, its session's
						// state kept in memory past the round's sample, and
						// a round with more of them than the other retained
						// more (docs/TESTING.md, eighth round).
						st.storeDown.Add(1)
						if _, err := rc.run(relDB, bson.D{{"releaseLock", collName}, {"ids", bson.A{k}}}, true); err != nil {
							fail(err)
							return
						}
						continue
					default:
						other("acquireLock", r)
						continue
					}
					r, err = rc.run(relDB, bson.D{{"update", collName}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", k}}}, {"u", bson.D{{"$inc", bson.D{{"n", int64(1)}}}}}}}}}, true)
					if err != nil {
						fail(err)
						return
					}
					if replyCode(r) == 0 {
						st.lockedWrites.Add(1)
					} else {
						other("locked update", r)
					}
					r, err = rc.run(relDB, bson.D{{"releaseLock", collName}, {"ids", bson.A{k}}}, true)
					if err != nil {
						fail(err)
						return
					}
					if replyCode(r) != 0 {
						other("releaseLock", r)
					}
				default:
					r, err := rc.run(relDB, bson.D{{"update", collName}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", k}}}, {"u", bson.D{{"$inc", bson.D{{"n", int64(1000000)}}}}}}}}}, true)
					if err != nil {
						fail(err)
						return
					}
					switch replyCode(r) {
					case 46:
						if storeUnavailable(r) {
							st.storeDown.Add(1)
						} else {
							st.refused.Add(1)
						}
					case 0:
						st.unlockedLanded.Add(1)
					default:
						other("unlocked update", r)
					}
				}
			}
		}(i, rc)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return st
		case <-time.After(500 * time.Millisecond):
			st.peakGoroutines = max(st.peakGoroutines, runtime.NumGoroutine())
			st.peakRSS = max(st.peakRSS, vmRSS())
		}
	}
}

// lockgateGoroutines counts the process's goroutines except FerretDB's:
// the upstream runs in this process only because the tests embed it. Its
// per-connection goroutines serve connections that lockgate's own driver
// pools (lock store, resolver) keep open by design, up to their pool size.
func lockgateGoroutines() (ours, ferret int) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.TrimSpace(g) == "" {
			continue
		}
		if strings.Contains(g, "FerretDB/FerretDB/") {
			ferret++
		} else {
			ours++
		}
	}
	return ours, ferret
}

// settleGoroutines waits until the process's goroutine counts (lockgate's
// and FerretDB's) read the same twice in a row, one poll apart: the
// goroutines of connections just opened or closed have started or ended,
// so that a memory sample taken next sees them. It is how the soak orders
// its memory samples after the connections they measure.
func settleGoroutines(t *testing.T, what string) {
	t.Helper()
	var last [2]int
	testkit.Eventually(t, 10*time.Second, "the goroutine counts to settle "+what, func() bool {
		o, f := lockgateGoroutines()
		same := last == [2]int{o, f}
		last = [2]int{o, f}
		return same
	})
}

// TestSoak500Connections is item 5 of issue 5. It measures the memory an
// idle connection costs lockgate (500 idle connections through lockgate
// minus 500 idle connections straight to FerretDB, which runs in this
// process too, so that the client sockets and FerretDB's own per-connection
// state cancel out). Then, twice, 500 connections run mixed traffic for a
// bounded time (reads, inserts, lock/write/unlock cycles on an enforced
// collection, and unlocked writes on it that must all be refused) and
// disconnect. After each round lockgate_client_connections returns to 0
// and the goroutine count (FerretDB's own excluded) returns to its
// baseline; the second round must not leave more memory behind than the
// first (what the first leaves is pools and caches warmed up, which a leak
// would add to in every round). The enforced counters must equal exactly
// the number of acknowledged locked writes.
func TestSoak500Connections(t *testing.T) {
	conns, duration := 500, 12*time.Second
	if raceEnabled {
		conns, duration = 100, 5*time.Second
	}
	const (
		keys           = 50
		goroutineSlack = 10
	)
	// Per connection: the client socket, lockgate's two, FerretDB's one.
	raiseFDLimit(t, uint64(4*conns+512))
	if os.Getenv("LOCKGATE_SOAK_HEAPPROFILE_DIR") != "" {
		// Fine-grained profiles for attribution; slows the run down.
		runtime.MemProfileRate = 4096
	}

	ctx := testCtx(t, 3*time.Minute)
	collName := uniq("soak")
	ns := relDB + "." + collName
	g := startGatewayLogging(t, gatewayConfig(upstream.URI(), uniq("locks"), ns), zapcore.FatalLevel)
	direct := connect(t, upstream.URI(), "soak-direct")
	dcoll := direct.Database(relDB).Collection(collName)
	var seed []any
	for i := 0; i < keys; i++ {
		seed = append(seed, counterDoc{ID: i})
	}
	if _, err := dcoll.InsertMany(ctx, seed); err != nil {
		t.Fatal(err)
	}
	// Warm the gateway and FerretDB up (pools, caches), so that the
	// baseline includes what a first connection starts lazily.
	closeAll(openIdle(t, g.Addr, 4))
	closeAll(openIdle(t, upstream.Addr(), 4))
	testkit.Eventually(t, 10*time.Second, "lockgate_client_connections 0 after the warm-up", func() bool {
		return g.metric(t, "lockgate_client_connections", nil) == 0
	})
	settleGoroutines(t, "after the warm-up")
	base := sampleMem()
	baseOurs, ferret0 := lockgateGoroutines()

	// Idle cost: direct first, then through lockgate. FerretDB serves each
	// connection with goroutines of its own: the direct connections are
	// measured once it serves them all, and the baseline again once it has
	// let them all go.
	dconns := openIdle(t, upstream.Addr(), conns)
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("FerretDB to serve the %d direct connections", conns), func() bool {
		_, f := lockgateGoroutines()
		return f >= ferret0+conns
	})
	withDirect := sampleMem()
	closeAll(dconns)
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("FerretDB to let the %d direct connections go", conns), func() bool {
		_, f := lockgateGoroutines()
		return f <= ferret0+goroutineSlack
	})
	base2 := sampleMem()
	pconns := openIdle(t, g.Addr, conns)
	defer func() { closeAll(pconns) }()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("lockgate_client_connections = %d", conns), func() bool {
		return g.metric(t, "lockgate_client_connections", nil) == float64(conns)
	})
	settleGoroutines(t, fmt.Sprintf("with %d idle proxied connections", conns))
	withProxy := sampleMem()
	idleOurs, _ := lockgateGoroutines()
	directPer := (float64(withDirect.heapStack) - float64(base.heapStack)) / float64(conns)
	proxyPer := (float64(withProxy.heapStack) - float64(base2.heapStack)) / float64(conns)
	lockgatePer := proxyPer - directPer
	t.Logf("idle connections: %d direct cost %.1f KiB each (client socket + FerretDB), through lockgate %.1f KiB each: lockgate's own %.1f KiB per idle connection (HeapInuse+StackInuse)",
		conns, directPer/1024, proxyPer/1024, lockgatePer/1024)
	t.Logf("goroutines outside FerretDB: baseline %d, %d with %d idle proxied connections (%.2f per connection)",
		baseOurs, idleOurs, conns, float64(idleOurs-baseOurs)/float64(conns))
	t.Logf("RSS: baseline %.1f MiB, %.1f MiB with %d idle proxied connections (%.1f KiB per connection, client sockets and FerretDB included)",
		mib(base2.rss), mib(withProxy.rss), conns, (float64(withProxy.rss)-float64(base2.rss))/float64(conns)/1024)
	// DESIGN.md's target: an idle client connection costs at most 64 KiB.
	if lockgatePer > 64<<10 {
		t.Errorf("an idle connection costs lockgate %.1f KiB, over the 64 KiB target", lockgatePer/1024)
	}

	var lockedTotal int64
	var retained []memSample
	// limit is how much more live heap a later round may leave than the
	// first: a leak of even 2 KiB per connection served would add 1 MB
	// per round of 500, while pools and caches are warm after the first.
	limit := float64(conns)*2048 + 2<<20
	rounds := 2
	for round := 0; round < rounds; round++ {
		if round > 0 {
			pconns = openIdle(t, g.Addr, conns)
		}
		st := runMixed(ctx, pconns, collName, keys, duration, round)
		ops := st.ops()
		t.Logf("round %d: %d connections, %v of mixed traffic: %d operations (%.0f/s): %d reads, %d inserts, %d locked writes, %d LockBusy on acquire, %d unlocked writes refused, %d refused failing closed on a slow lock store, %d other errors (last: %v); peak %d goroutines, RSS %.1f MiB",
			round+1, conns, duration, ops, float64(ops)/duration.Seconds(), st.reads.Load(), st.inserts.Load(), st.lockedWrites.Load(),
			st.busy.Load(), st.refused.Load(), st.storeDown.Load(), st.otherErrs.Load(), st.lastOther.Load(), st.peakGoroutines, mib(st.peakRSS))
		if e := st.ioErr.Load(); e != nil {
			t.Errorf("round %d: a client connection failed under load: %v", round+1, e)
		}
		if st.unlockedLanded.Load() != 0 {
			t.Errorf("round %d: UNLOCKED WRITES LANDED: %d unlocked updates on the enforced collection were acknowledged", round+1, st.unlockedLanded.Load())
		}
		if st.lockedWrites.Load() == 0 || st.refused.Load() == 0 || st.reads.Load() == 0 || st.inserts.Load() == 0 {
			t.Errorf("round %d: the mix did not exercise every kind of operation", round+1)
		}
		if st.otherErrs.Load() > ops/100 {
			t.Errorf("round %d: %d of %d operations failed with unexpected errors (last: %v)", round+1, st.otherErrs.Load(), ops, st.lastOther.Load())
		}
		lockedTotal += st.lockedWrites.Load()

		closeAll(pconns)
		testkit.Eventually(t, 30*time.Second, "lockgate_client_connections to return to 0", func() bool {
			return g.metric(t, "lockgate_client_connections", nil) == 0
		})
		var ours, ferret int
		back := testkit.Within(30*time.Second, func() bool {
			ours, ferret = lockgateGoroutines()
			return ours <= baseOurs+goroutineSlack
		})
		debug.FreeOSMemory()
		retained = append(retained, sampleMem())
		a := retained[round]
		if dir := os.Getenv("LOCKGATE_SOAK_HEAPPROFILE_DIR"); dir != "" {
			writeHeapProfile(t, fmt.Sprintf("%s/soak_heap_round%d.pb.gz", dir, round+1))
		}
		t.Logf("round %d, after disconnect: %d goroutines outside FerretDB (baseline %d); FerretDB still serves %d goroutines for the connections lockgate's lock-store and resolver pools keep; HeapInuse+StackInuse %.1f MiB (cold baseline %.1f), RSS %.1f MiB (baseline %.1f)",
			round+1, ours, baseOurs, ferret, mib(a.heapStack), mib(base2.heapStack), mib(a.rss), mib(base2.rss))
		if !back {
			t.Errorf("round %d: goroutines did not return to the baseline: %d, baseline %d; live goroutines by creator:\n%s", round+1, ours, baseOurs, goroutineSummary())
		}
		if round == 1 && float64(a.live)-float64(retained[0].live) > limit {
			// One sample over the limit is not yet a leak: on a loaded
			// machine a sample can catch megabytes that are only passing
			// through (a CI run once saw 3.8 MiB after round 2 that no
			// run here repeats). What a leak keeps, every round keeps
			// again, so a third round must confirm it.
			t.Logf("round 2 left %.1f MiB more live heap than round 1: a third round confirms or refutes a leak",
				(float64(a.live)-float64(retained[0].live))/(1<<20))
			rounds = 3
		}
	}
	if got := sumCounters(t, ctx, dcoll); got != lockedTotal {
		t.Errorf("enforced counters sum to %d, want exactly the %d acknowledged locked writes", got, lockedTotal)
	}
	// Live heap (what the last GC marked) is compared, not HeapInuse,
	// whose span fragmentation varies by megabytes from run to run. (This
	// check found the test's own log observer holding every audit line;
	// the gateway here records no log lines for that reason.) A leak grows
	// with every round, so the least any later round left is judged: a
	// third round runs only when the second was over the limit.
	grown := float64(retained[1].live) - float64(retained[0].live)
	t.Logf("live heap after round 1 %.1f MiB, after round 2 %.1f MiB (cold baseline %.1f): round 2 retained %.2f MiB more (%.2f KiB per connection served); HeapInuse+StackInuse %.1f -> %.1f MiB",
		mib(retained[0].live), mib(retained[1].live), mib(base2.live), grown/(1<<20), grown/float64(conns)/1024, mib(retained[0].heapStack), mib(retained[1].heapStack))
	if len(retained) > 2 {
		third := float64(retained[2].live) - float64(retained[0].live)
		t.Logf("live heap after round 3 %.1f MiB: %.2f MiB more than after round 1", mib(retained[2].live), third/(1<<20))
		grown = min(grown, third)
	}
	if grown > limit {
		t.Errorf("every round after the first left at least %.1f MiB more than the first: memory grows with connections served", grown/(1<<20))
	}
}

// goroutineSummary groups the live goroutines by the function that created
// them, most numerous first, for failure messages.
func goroutineSummary() string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	counts := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(strings.TrimSpace(g), "\n")
		key := "?"
		for i, l := range lines {
			if strings.HasPrefix(l, "created by ") {
				key = trimFrame(strings.TrimPrefix(l, "created by "))
				if i >= 2 {
					key = trimFrame(lines[1]) + " <- " + key
				}
				break
			}
		}
		counts[key]++
	}
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range counts {
		all = append(all, kv{k, n})
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[j].n > all[i].n {
				all[i], all[j] = all[j], all[i]
			}
		}
	}
	var sb strings.Builder
	for i, e := range all {
		if i == 15 {
			break
		}
		fmt.Fprintf(&sb, "  %5d  %s\n", e.n, e.k)
	}
	return sb.String()
}

// trimFrame drops the arguments and goroutine number of a stack line.
func trimFrame(l string) string {
	if i := strings.Index(l, " in goroutine "); i >= 0 {
		l = l[:i]
	}
	if i := strings.LastIndex(l, "("); i > 0 && strings.HasSuffix(l, ")") {
		l = l[:i]
	}
	return l
}

// writeHeapProfile writes the in-use heap profile to path, to attribute
// retained memory with `go tool pprof -sample_index=inuse_space
// -diff_base round1 round2`. Set LOCKGATE_SOAK_HEAPPROFILE_DIR to use it.
func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Logf("heap profile: %v", err)
		return
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Logf("heap profile: %v", err)
	}
	t.Logf("heap profile written to %s", path)
}
