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
	"fmt"
	"os"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
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
	os.Exit(testkit.RunMain(m, func() (func() error, error) {
		srv, err := embedded.Start(embedded.Options{})
		if err != nil {
			return nil, fmt.Errorf("starting the embedded upstream: %w", err)
		}
		directURI = srv.URI()
		cfg := gatewaytest.Config(directURI)
		cfg.Policy.Default = config.ModeOff
		cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.protected", Mode: config.ModeEnforce}}
		for _, db := range clientDBs {
			cfg.Policy.Namespaces = append(cfg.Policy.Namespaces, config.NamespaceRule{Match: db + ".*", Mode: config.ModeEnforce})
		}
		g, stop, err := gatewaytest.Run(cfg, nil)
		if err != nil {
			srv.Close()
			return nil, err
		}
		gw, proxyURI = g.Gateway, g.URI
		return func() error {
			defer srv.Close()
			return stop()
		}, nil
	}))
}
