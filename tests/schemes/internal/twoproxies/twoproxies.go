// Package twoproxies starts what the scheme tests (tests/schemes and
// tests/schemes/libs) run against: the embedded FerretDB and two
// lockgates in front of it that share its lock store and key lock owners
// alike, so that a scheme lock taken through one holds through the
// other. Each package's TestMain starts one set with its own rules and
// leases. It is for those tests only.
package twoproxies

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// Options are what the two packages set differently.
type Options struct {
	// Name names the package in the log line about the leases and in its
	// temporary directory.
	Name string
	// BaseLeaseMS is the rules' lease on a machine with a core to spare;
	// Start scales it with the load (testkit.LeaseScale).
	BaseLeaseMS int64
	// Rules are the namespaces' rules under the scaled lease leaseMS.
	Rules func(leaseMS int64) []config.NamespaceRule
	// Loggers of the first and the second lockgate (nil: none).
	Loggers [2]*zap.Logger
}

// Set is a running upstream with the two lockgates in front of it.
type Set struct {
	// DirectURI reaches the upstream without lockgate; ProxyURI and
	// Proxy2URI the two lockgates.
	DirectURI, ProxyURI, Proxy2URI string
	// Gateway is the first lockgate, Config the configuration both run.
	Gateway *gateway.Gateway
	Config  *config.Config
	// LeaseMS is BaseLeaseMS as scaled for this run: one number for the
	// rules and for the scripts the tests run (LOCKGATE_TEST_LEASE_MS).
	LeaseMS int64
}

// ownerSecret is the key both lockgates hash lock owners with: a lock
// taken through one must be its owner's through the other.
const ownerSecret = "0123456789abcdef0123456789abcdef0123456789abcdef"

// LeaseMarginMS is the gateways' policy.leaseMarginMS: the lease a lock
// must have left for a write to pass. RunScript gives it to the scripts
// (LOCKGATE_TEST_LEASE_MARGIN_MS), which tell a refusal that came while a
// holder's lock surely lived from one that came after it may have ended.
const LeaseMarginMS = 200

// Start starts the upstream and the two lockgates; stop ends them.
func Start(o Options) (_ *Set, stop func() error, err error) {
	scale, why, err := testkit.LeaseScale()
	if err != nil {
		return nil, nil, err
	}
	s := &Set{LeaseMS: o.BaseLeaseMS * int64(scale)}
	fmt.Fprintf(os.Stderr, "%s: leases scaled by %d (%s): leaseMS %d\n", o.Name, scale, why, s.LeaseMS)
	dir, err := os.MkdirTemp(tmpfsDir(), "twoproxies")
	if err != nil {
		return nil, nil, err
	}
	srv, err := embedded.Start(embedded.Options{Dir: filepath.Join(dir, "ferretdb")})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("starting the embedded upstream: %w", err)
	}
	s.DirectURI = srv.URI()
	var stops []func() error
	// done stops whatever started, the last first.
	done := func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		srv.Close()
		os.RemoveAll(dir)
		return errors.Join(errs...)
	}
	fail := func(err error) (*Set, func() error, error) {
		done()
		return nil, nil, err
	}
	cfg := gatewaytest.Config(s.DirectURI)
	cfg.Policy.Default = config.ModeOff
	cfg.Policy.LeaseMarginMS = LeaseMarginMS
	cfg.Policy.Namespaces = o.Rules(s.LeaseMS)
	cfg.Lockstore.OwnerSecretFile = dir + "/owner-secret"
	if err := os.WriteFile(cfg.Lockstore.OwnerSecretFile, []byte(ownerSecret), 0o600); err != nil {
		return fail(err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(fmt.Errorf("test config: %w", err))
	}
	s.Config = cfg
	for i, log := range o.Loggers {
		g, stopG, err := gatewaytest.Run(cfg, log)
		if err != nil {
			return fail(fmt.Errorf("starting lockgate %d: %w", i+1, err))
		}
		stops = append(stops, stopG)
		if i == 0 {
			s.Gateway, s.ProxyURI = g.Gateway, g.URI
		} else {
			s.Proxy2URI = g.URI
		}
	}
	return s, done, nil
}

// tmpfsDir is where the upstream's SQLite files go: tmpfs when there is
// one. On disk every write the scripts make waits for the SQLite WAL's
// fsync, and the workloads' lock calls, one write each, waited seconds in
// all for the disk (docs/TESTING.md, eighth round).
func tmpfsDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}

// RunScript runs a client script (argv, then args) with the lease it
// must use in LOCKGATE_TEST_LEASE_MS (and the gateways' margin in
// LOCKGATE_TEST_LEASE_MARGIN_MS), and returns what it printed; the
// error carries what it wrote on stderr.
func RunScript(ctx context.Context, leaseMS int64, argv []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], args...)...)
	cmd.Env = append(os.Environ(), "LOCKGATE_TEST_LEASE_MS="+strconv.FormatInt(leaseMS, 10),
		"LOCKGATE_TEST_LEASE_MARGIN_MS="+strconv.FormatInt(LeaseMarginMS, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %v: %w\n%s", argv[len(argv)-1], args, err, stderr.String())
	}
	return out, nil
}

// Turns make parallel cases take their CPU slots in a fixed order, the
// longest case first: go resumes parallel cases in no set order, and a
// long case that took its slot last ran alone at the end. Turn i is taken
// once the case before it holds its slot. A case waiting for its turn
// holds one of go's parallel slots (-parallel): with fewer of those than
// cases, the case whose turn it is might never get one, so then there are
// no turns and the cases take their CPU slots in go's order.
type Turns []chan struct{}

// NewTurns is n turns, the first open; nil (no turns) when -parallel is
// less than n.
func NewTurns(n int) Turns {
	if f := flag.Lookup("test.parallel"); f == nil || f.Value.(flag.Getter).Get().(int) < n {
		return nil
	}
	tu := make(Turns, n+1)
	for i := range tu {
		tu[i] = make(chan struct{})
	}
	close(tu[0])
	return tu
}

// Take waits for turn i, takes a slot of slots until t ends, and passes
// the turn on. Call it after t.Parallel.
func (tu Turns) Take(t testing.TB, i int, slots testkit.Slots) {
	if tu == nil {
		slots.Take(t)
		return
	}
	<-tu[i]
	slots.Take(t)
	close(tu[i+1])
}

// Pass passes turn i on once it comes, for a case that does not run
// (left out by -run).
func (tu Turns) Pass(i int) {
	if tu == nil {
		return
	}
	go func() {
		<-tu[i]
		close(tu[i+1])
	}()
}
