package tests

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/embedded"
)

// upstream is the embedded FerretDB shared by every test of the package;
// tests that stop their upstream (restart_test.go) start their own.
var upstream *embedded.Server

var verboseProxyLogs = flag.Bool("proxylogs", false, "log the gateways' zap output through t.Log")

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	var err error
	upstream, err = embedded.Start(embedded.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded upstream:", err)
		return 1
	}
	code := m.Run()
	upstream.Close()
	if code != 0 {
		return code
	}
	if err := goleak.Find(leakIgnores()...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked by the tests:", err)
		return 1
	}
	return 0
}

// leakIgnores are the goroutines allowed to outlive a clean shutdown of
// everything the tests start, each with the reason it is not ours to stop.
// None today: FerretDB, the driver clients and the gateways all stop every
// goroutine they start. (An earlier guard used golang-lru's expirable
// cache, whose cleanup goroutine can never be stopped; the leak check
// caught it.)
func leakIgnores() []goleak.Option {
	return nil
}

// gw is a gateway under test with the URIs to reach it and what it fronts.
type gw struct {
	*gateway.Gateway
	// URI is the proxy's connection string.
	URI string
	// Direct is the upstream's connection string, for comparisons.
	Direct string
}

// startGateway starts a gateway in front of upstreamURI on free ports and
// stops it when the test ends, failing the test if it does not stop cleanly
// within the shutdown budget.
func startGateway(t testing.TB, upstreamURI string) *gw {
	t.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.Upstream.URI = upstreamURI
	cfg.Upstream.DialTimeout = config.Duration(5 * time.Second)
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	logger := zap.NewNop()
	if *verboseProxyLogs {
		logger = zaptest.NewLogger(t, zaptest.Level(zap.DebugLevel))
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, err := gateway.Start(ctx, cfg, logger)
	if err != nil {
		cancel()
		t.Fatalf("gateway.Start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-g.Done():
			if err := g.Wait(); err != nil {
				t.Errorf("gateway stopped with errors: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("gateway did not stop within 15s of its context being cancelled")
		}
	})
	return &gw{Gateway: g, URI: "mongodb://" + g.ProxyAddr().String() + "/", Direct: upstreamURI}
}

// connect returns a Go driver client for uri, disconnected at the end of the
// test.
func connect(t testing.TB, uri string, opts ...*options.ClientOptions) *mongo.Client {
	t.Helper()
	// No client-wide Timeout: it makes the driver add maxTimeMS, which
	// FerretDB refuses on some commands (distinct). Tests bound their work
	// with contexts instead.
	o := options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second)
	c, err := mongo.Connect(context.Background(), append([]*options.ClientOptions{o}, opts...)...)
	if err != nil {
		t.Fatalf("connect %s: %v", uri, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Disconnect(ctx); err != nil {
			t.Errorf("disconnect %s: %v", uri, err)
		}
	})
	return c
}

// testCtx bounds one test's database work; every wait in this package is
// bounded by it or by a shorter deadline.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dbName is a database name unique to the test, valid for MongoDB.
func dbName(t testing.TB) string {
	r := strings.NewReplacer("/", "_", " ", "_", ".", "_", "$", "_")
	n := strings.ToLower(r.Replace(t.Name()))
	if len(n) > 60 {
		n = n[:60]
	}
	return n
}

// metricValue scrapes the gateway's admin /metrics endpoint and returns the
// sample of the counter or gauge name whose labels include labels. A series
// not exported yet reads as 0; a metric family that is missing altogether
// fails the test, because it means the metric was renamed.
func (g *gw) metricValue(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + g.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping /metrics: status %s, %v", resp.Status, err)
	}
	family := false
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "# TYPE "+name+" ") {
			family = true
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		metric, labelText, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		have := map[string]string{}
		for _, m := range labelRE.FindAllStringSubmatch(labelText, -1) {
			have[m[1]] = m[2]
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if match {
			f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				t.Fatalf("/metrics: %q: %v", line, err)
			}
			return f
		}
	}
	if !family {
		t.Fatalf("/metrics has no metric family %s", name)
	}
	return 0
}

// labelRE matches one label of a series in the Prometheus text format.
var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// waitFor polls cond until it holds or d passes, then fails with what.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
