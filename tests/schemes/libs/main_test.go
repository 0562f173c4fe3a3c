// Package libs proves that lockgate enforces the locks of five common
// MongoDB locking libraries (docs/SCHEMES.md, "Common libraries") with
// those libraries' own flows, translated call for call into pymongo and
// the Node.js driver, run as subprocesses against two lockgates in front
// of the embedded FerretDB and, as the control, straight against it. It is
// its own package, beside tests/schemes, so that go test runs the two
// beside each other.
package libs

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
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

// TestMain runs every library's case at once, both drivers' takeovers
// too (testkit.DefaultParallel, unless -parallel says otherwise): a
// takeover is mostly its scripts waiting out leases, so the ten wait
// together instead of two at a time.
// The workloads keep go's default of one per CPU (testkit.CPUSlots): their
// workers spin through lock calls, and more of them beside each other
// would only stretch each worker's hold towards its lease.
func TestMain(m *testing.M) {
	flag.Parse()
	testkit.DefaultParallel(len(libNames) * len(libDrivers()))
	os.Exit(testkit.RunMain(m, setup))
}

// setup starts the embedded upstream and the two gateways in front of it.
func setup() (func() error, error) {
	set, stop, err := twoproxies.Start(twoproxies.Options{Name: "tests/schemes/libs", BaseLeaseMS: baseLibLeaseMS,
		Rules: func(ms int64) []config.NamespaceRule {
			// The rules read it.
			libLeaseMS = ms
			return libRules()
		}})
	if err != nil {
		return nil, err
	}
	directURI, proxyURI, proxy2URI = set.DirectURI, set.ProxyURI, set.Proxy2URI
	return stop, nil
}

// scriptTimeout bounds one script run: 90 s on an idle machine, scaled
// with the leases the scripts wait out.
func scriptTimeout() time.Duration {
	return 90 * time.Second * time.Duration(libLeaseMS/baseLibLeaseMS)
}
