// Package libs proves that lockgate enforces the locks of five common
// MongoDB locking libraries (docs/SCHEMES.md, "Common libraries") with
// those libraries' own flows, translated call for call into pymongo and
// the Node.js driver, run as subprocesses against two lockgates in front
// of the embedded FerretDB and, as the control, straight against it. It is
// its own package, beside tests/schemes, so that go test runs the two
// beside each other.
package libs

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

var (
	directURI string
	proxyURI  string
	// proxy2URI is a second lockgate in front of the same database and
	// lock store: the libraries' locks must hold across proxies.
	proxy2URI string
)

// baseLibLeaseMS is the lease of the library rules on a machine with a
// core to spare: longer than tests/schemes' 1.5 s, so that a worker does
// not outlive its lock between two of its library's calls.
const baseLibLeaseMS = 3000

// libLeaseMS is baseLibLeaseMS times testkit.LeaseScale, set by setup
// before any test runs: the rules' lease, and the scripts' (runScript
// passes it as LOCKGATE_TEST_LEASE_MS), so the two never disagree.
var libLeaseMS int64

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, setup)) }

// setup starts the embedded upstream and the two gateways in front of it.
func setup() (func() error, error) {
	scale, why, err := testkit.LeaseScale()
	if err != nil {
		return nil, err
	}
	libLeaseMS = baseLibLeaseMS * int64(scale)
	fmt.Fprintf(os.Stderr, "tests/schemes/libs: leases scaled by %d (%s): %d ms\n", scale, why, libLeaseMS)
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		return nil, fmt.Errorf("starting the embedded upstream: %w", err)
	}
	directURI = srv.URI()
	dir, err := os.MkdirTemp("", "schemelibs")
	if err != nil {
		srv.Close()
		return nil, err
	}
	fail := func(err error) (func() error, error) {
		srv.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	cfg := gatewaytest.Config(directURI)
	cfg.Policy.Default = config.ModeOff
	cfg.Policy.LeaseMarginMS = 200
	cfg.Policy.Namespaces = libRules()
	// Both proxies must key lock owners alike.
	cfg.Lockstore.OwnerSecretFile = dir + "/owner-secret"
	if err := os.WriteFile(cfg.Lockstore.OwnerSecretFile, []byte("0123456789abcdef0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		return fail(err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(fmt.Errorf("test config: %w", err))
	}
	g, stop, err := gatewaytest.Run(cfg, nil)
	if err != nil {
		return fail(err)
	}
	proxyURI = g.URI
	g2, stop2, err := gatewaytest.Run(cfg, nil)
	if err != nil {
		stop()
		return fail(fmt.Errorf("starting the second gateway: %w", err))
	}
	proxy2URI = g2.URI
	return func() error {
		defer os.RemoveAll(dir)
		defer srv.Close()
		return errors.Join(stop2(), stop())
	}, nil
}

// scriptTimeout bounds one script run: 90 s on an idle machine, scaled
// with the leases the scripts wait out.
func scriptTimeout() time.Duration {
	return 90 * time.Second * time.Duration(libLeaseMS/baseLibLeaseMS)
}
