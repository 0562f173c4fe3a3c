// Package reliability holds the proofs of issue 5: lost updates prevented
// across two proxies, crash recovery of a killed proxy, upstream faults,
// hostile input, a 500-connection soak and TLS on both legs. Every test
// drives the real lockgate (gateway.Start) in front of the real embedded
// FerretDB, except where FerretDB cannot produce the situation (a slow
// upstream), which a scripted server plays. docs/RELIABILITY.md reports
// what each test showed and how to run it.
package reliability

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// Environment of the child-process mode (crash_test.go): when
// envChildUpstream is set, TestMain runs one gateway instead of the tests,
// prints "ADDR <host:port>" on stdout, and serves until it is killed.
const (
	envChildUpstream   = "LOCKGATE_RELIABILITY_CHILD_UPSTREAM"
	envChildLockColl   = "LOCKGATE_RELIABILITY_CHILD_LOCKCOLL"
	envChildEnforceNS  = "LOCKGATE_RELIABILITY_CHILD_ENFORCE"
	childAddrLinePrefx = "ADDR "
)

// upstream is the embedded FerretDB shared by the tests that do not stop
// their upstream.
var upstream *embedded.Server

var verboseLogs = flag.Bool("gatewaylogs", false, "print the gateways' warnings and errors on stderr")

func TestMain(m *testing.M) {
	if uri := os.Getenv(envChildUpstream); uri != "" {
		os.Exit(runChildGateway(uri, os.Getenv(envChildLockColl), os.Getenv(envChildEnforceNS)))
	}
	flag.Parse()
	testkit.DefaultParallel(parallelCases)
	os.Exit(testkit.RunMain(m, startUpstream))
}

// parallelCases is how many of the package's parallel tests (t.Parallel)
// run at once unless -parallel says otherwise: more than go's default of
// one per CPU, since they mostly wait (for leases to run out, for a
// relay's injected delay, for a child process). Not parallel, so that go
// runs them first and alone: the tests that count the process's
// goroutines or memory (the soak, TestSlowUpstreamTimeouts), the crash
// test whose takeover bound is a time, and the paused proxy, whose 500 ms
// lease must end while a relay holds the write. Child gateways get their
// settings in their own environment, never this process's, so that the
// tests that start them can be parallel.
const parallelCases = 6

// startUpstream starts the shared upstream, its SQLite files on tmpfs.
func startUpstream() (func() error, error) {
	dir, err := os.MkdirTemp(tmpfsDir(), "lockgate-reliability-")
	if err != nil {
		return nil, err
	}
	upstream, err = embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the embedded upstream: %w", err)
	}
	return func() error {
		defer os.RemoveAll(dir)
		return upstream.Close()
	}, nil
}

// tmpfsDir keeps SQLite on tmpfs where there is one: FerretDB's write
// throughput is bounded by it.
func tmpfsDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}

// runChildGateway is the child process of TestProxyKilledMidTraffic: one
// gateway enforcing locks on enforceNS, sharing the lock collection
// lockColl, in front of uri. It prints its address and serves until
// killed (or until its stdin closes, so it never outlives a crashed
// parent).
func runChildGateway(uri, lockColl, enforceNS string) int {
	cfg := gatewayConfig(uri, lockColl, enforceNS)
	childStaleConfig(cfg)
	childLegacyConfig(cfg)
	childAuditConfig(cfg)
	g, err := gateway.Start(context.Background(), cfg, zap.NewNop())
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println(childAddrLinePrefx + g.ProxyAddr().String())
	go func() {
		// The parent holds our stdin open; when it dies we exit.
		bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(3)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	return 0
}

// gatewayConfig is the configuration every gateway of this package runs
// with: enforce on enforceNS (if any), everything else off.
func gatewayConfig(uri, lockColl, enforceNS string) *config.Config {
	cfg := gatewaytest.Config(uri)
	if lockColl != "" {
		cfg.Lockstore.Collection = lockColl
	}
	cfg.Policy.Default = config.ModeOff
	if enforceNS != "" {
		cfg.Policy.Namespaces = []config.NamespaceRule{{Match: enforceNS, Mode: config.ModeEnforce}}
	}
	return cfg
}

// gw is a gateway under test with the log lines it wrote.
type gw struct {
	*gatewaytest.Gateway
	Logs *observer.ObservedLogs
}

var seq atomic.Int64

// uniq returns a name unique in this process.
func uniq(prefix string) string { return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), seq.Add(1)) }

// startGateway starts a gateway with cfg, recording its logs at info level
// and above.
func startGateway(t testing.TB, cfg *config.Config) *gw {
	t.Helper()
	return startGatewayLogging(t, cfg, zapcore.InfoLevel)
}

// startGatewayLogging is startGateway recording log lines at level and
// above only: the soak records none, since the observer keeps every line
// (one audit line per decision) in memory.
func startGatewayLogging(t testing.TB, cfg *config.Config, level zapcore.Level) *gw {
	t.Helper()
	core, logs := observer.New(level)
	logger := zap.New(core)
	if *verboseLogs {
		stderr := zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.WarnLevel)
		logger = zap.New(zapcore.NewTee(core, stderr))
	}
	return &gw{Gateway: gatewaytest.Start(t, cfg, logger), Logs: logs}
}

// connect returns a Go driver client for uri, disconnected at the end of
// the test. No client-wide Timeout: it adds maxTimeMS, which FerretDB
// refuses on some commands; tests bound their work with contexts.
func connect(t testing.TB, uri, app string, opts ...*options.ClientOptions) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).SetAppName(app).SetServerSelectionTimeout(10 * time.Second)
	c, err := mongo.Connect(context.Background(), append([]*options.ClientOptions{o}, opts...)...)
	if err != nil {
		t.Fatalf("connect %s: %v", uri, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Disconnect(ctx)
	})
	return c
}

// testCtx bounds one test's database work.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// metric reads one sample of a gateway's registry: the counter or gauge
// named name whose labels include labels, summed over every matching
// series. A family that is not registered fails the test (renamed metric).
func (g *gw) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := g.Registry().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		sum := 0.0
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
		return sum
	}
	if name == "lockgate_client_connections" || name == "lockgate_errors_total" {
		t.Fatalf("metric %s is not registered", name)
	}
	return 0
}

// decisions lists a gateway's lockgate_decisions_total series that are
// not zero, for a failure's message.
func (g *gw) decisions(t testing.TB) []string {
	t.Helper()
	fams, err := g.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != "lockgate_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
				out = append(out, fmt.Sprintf("{%s} %v", strings.Join(ls, ","), v))
			}
		}
	}
	return out
}

// errorsByKind returns lockgate_errors_total per kind.
func (g *gw) errorsByKind(t testing.TB) map[string]float64 {
	t.Helper()
	fams, err := g.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "lockgate_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// inSession is a context that carries the session s.
func inSession(s mongo.Session) context.Context {
	return mongo.NewSessionContext(context.Background(), s)
}

// commandCode returns the server error code of err, 0 if it has none.
func commandCode(err error) int32 {
	switch e := err.(type) {
	case mongo.CommandError:
		return e.Code
	case mongo.WriteException:
		if len(e.WriteErrors) > 0 {
			return int32(e.WriteErrors[0].Code)
		}
		if e.WriteConcernError != nil {
			return int32(e.WriteConcernError.Code)
		}
	case mongo.ServerError:
		for _, c := range []int32{46, 24, 11000} {
			if e.HasErrorCode(int(c)) {
				return c
			}
		}
	}
	return 0
}

// sumCounters returns the sum of field n over every document of coll.
func sumCounters(t testing.TB, ctx context.Context, coll *mongo.Collection) int64 {
	t.Helper()
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatalf("reading the counters: %v", err)
	}
	var docs []struct {
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("reading the counters: %v", err)
	}
	var sum int64
	for _, d := range docs {
		sum += d.N
	}
	return sum
}

// containsAny reports whether s contains one of subs.
func containsAny(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}
