// Package enforcement proves lockgate's enforcement with real client drivers
// that nobody on the team wrote: pymongo and the Node.js driver (and
// mongosh), run as subprocesses against a full lockgate (gateway.Start) in
// front of the embedded FerretDB.
//
// Each driver has a script (pymongo/enforce.py, node/enforce.js,
// node/enforce_mongosh.js) that seeds its collections through a DIRECT
// connection to FerretDB, exercises every write API through the PROXY, and
// prints one JSON line per check: what the driver returned (result or
// error, with the lockgate detail) and the whole collection read directly
// before and after the operation, as canonical extended JSON. The scripts
// judge nothing; enforce_test.go holds the expectations and checks every
// named case (a missing or unexpected case is a failure).
//
// Cases, per driver: "nolock/<api>" (no lock, implicit session: refused
// with LockBusy, collection byte-for-byte unchanged), "nolock/
// unacknowledged_update_one" (w:0: nothing written, client recovers),
// "other/<api>" (locked by another application's session: refused, the
// holder named), "own/<api>" (locked by the caller's session and written in
// it: applied exactly), "pin/..." (a matching document that is not locked
// makes a resolved write refused whole), the lock commands around them, and
// "direct/..." (a reference sent straight to the server).
package enforcement

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/embedded"
)

// Databases the scripts work in, one per client so that they can run in
// parallel; every collection of each is enforced.
var clientDBs = []string{"enf_pymongo", "enf_node", "enf_mongosh"}

var (
	// directURI reaches FerretDB without the proxy (seeding, snapshots).
	directURI string
	// proxyURI reaches the gateway.
	proxyURI string
	// gw is the gateway, for its metrics.
	gw *gateway.Gateway
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded upstream:", err)
		return 1
	}
	directURI = srv.URI()

	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.Upstream.URI = directURI
	cfg.Upstream.DialTimeout = config.Duration(5 * time.Second)
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	cfg.Policy.Default = config.ModeOff
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.protected", Mode: config.ModeEnforce}}
	for _, db := range clientDBs {
		cfg.Policy.Namespaces = append(cfg.Policy.Namespaces, config.NamespaceRule{Match: db + ".*", Mode: config.ModeEnforce})
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, err := gateway.Start(ctx, cfg, zap.NewNop())
	gw = g
	if err != nil {
		cancel()
		srv.Close()
		fmt.Fprintln(os.Stderr, "starting the gateway:", err)
		return 1
	}
	proxyURI = "mongodb://" + g.ProxyAddr().String() + "/"

	code := m.Run()

	cancel()
	select {
	case <-g.Done():
		if err := g.Wait(); err != nil {
			fmt.Fprintln(os.Stderr, "gateway stopped with errors:", err)
			code = 1
		}
	case <-time.After(15 * time.Second):
		fmt.Fprintln(os.Stderr, "gateway did not stop within 15s of its context being cancelled")
		code = 1
	}
	srv.Close()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked by the tests:", err)
		return 1
	}
	return 0
}
