package reliability

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// TestUpstreamDownTellsTheDriver: a client that connects through lockgate
// while the upstream is down gets an error that says so, through the Go
// driver's own error, instead of only a reset connection (issue 9).
func TestUpstreamDownTellsTheDriver(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp(tmpfsDir(), "lockgate-down-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := gatewayConfig(srv.URI(), uniq("locks"), relDB+"."+uniq("down"))
	// Once the upstream's monitor has noticed the server is gone, a dial
	// waits for a writable server to appear, up to the dial timeout; keep
	// that well inside the driver's server selection timeout below, so the
	// driver hears lockgate's answer in either case.
	cfg.Upstream.DialTimeout = config.Duration(time.Second)
	// The lock store stays on the package's upstream, which stays up: on
	// the stopped one, the gateway's stop waited out its lock store's
	// time-out to deregister (10 s), which is not what this test is about.
	cfg.Lockstore.URI = upstream.URI()
	g := startGateway(t, cfg)
	srv.Close()

	c := connect(t, g.URI, "down-client", options.Client().SetServerSelectionTimeout(5*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Database("admin").RunCommand(ctx, bson.D{{"ping", 1}}).Err()
	if err == nil {
		t.Fatal("ping with the upstream down succeeded")
	}
	if !strings.Contains(err.Error(), "cannot reach the upstream database") {
		t.Errorf("ping with the upstream down: %v, want the driver's error to say lockgate cannot reach the upstream", err)
	}
}
