package tests

import (
	"context"
	"flag"
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
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// upstream is the embedded FerretDB shared by every test of the package;
// tests that stop their upstream (restart_test.go) start their own.
var upstream *embedded.Server

var verboseProxyLogs = flag.Bool("proxylogs", false, "log the gateways' zap output through t.Log")

func TestMain(m *testing.M) {
	flag.Parse()
	// The parallel tests (the compatibility clients, the upstream
	// restart) mostly wait for child processes and deadlines: all four at
	// once, unless -parallel says otherwise.
	testkit.DefaultParallel(4)
	os.Exit(testkit.RunMain(m, embedded.Shared(&upstream, embedded.Options{Addr: "127.0.0.1:0"})))
}

// gw is a gateway under test with the upstream it fronts.
type gw struct {
	*gatewaytest.Gateway
	// Direct is the upstream's connection string, for comparisons.
	Direct string
}

// startGateway starts a gateway in front of upstreamURI, logging through
// t.Log with -proxylogs.
func startGateway(t testing.TB, upstreamURI string) *gw {
	t.Helper()
	logger := zap.NewNop()
	if *verboseProxyLogs {
		logger = zaptest.NewLogger(t, zaptest.Level(zap.DebugLevel))
	}
	return &gw{Gateway: gatewaytest.Start(t, gatewaytest.Config(upstreamURI), logger), Direct: upstreamURI}
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
