// Package schemes proves that lockgate enforces the advisory locking
// schemes applications already use (docs/SCHEMES.md), with those
// applications' own code: pymongo scripts that write each scheme's
// acquire/write/release flow as an application would, run as subprocesses
// against a full lockgate (gateway.Start) in front of the embedded FerretDB,
// and, as the control, straight against FerretDB.
package schemes

import (
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
)

var (
	directURI string
	proxyURI  string
	// proxy2URI is a second lockgate in front of the same database and
	// lock store: scheme locks must hold across proxies.
	proxy2URI string
	gw        *gateway.Gateway
	// baseCfg is the first gateway's configuration, for reload tests.
	baseCfg *config.Config
	// auditLog holds the first gateway's decision log lines.
	auditLog *observer.ObservedLogs
)

// baseLeaseMS is the scheme lease of the holderFields, flag and
// lockCollection rules on a machine with a core to spare.
const baseLeaseMS = 1500

// leaseMS is that lease as this run uses it: baseLeaseMS times
// testkit.LeaseScale, so that a loaded machine makes the package slower
// instead of failing it (a worker's write arriving after its own 1.5 s
// lock ended). setup sets it before any test runs; the scripts get it as
// LOCKGATE_TEST_LEASE_MS (runScript), so the rules and the clients never
// disagree. lease is the same as a duration.
var (
	leaseMS int64
	lease   time.Duration
)

// rules are the namespaces of the tests: database <scheme> enforced
// under that scheme, audit_<scheme> audited under it.
func rules() []config.NamespaceRule {
	hf := &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: leaseMS}
	ld := &config.Scheme{Type: config.SchemeLockDocument}
	fl := &config.Scheme{Type: config.SchemeFlag, LeaseMS: leaseMS}
	rs := []config.NamespaceRule{
		{Match: "holderFields.*", Mode: config.ModeEnforce, Scheme: hf},
		{Match: "lockDocument.*", Mode: config.ModeEnforce, Scheme: ld},
		{Match: "flag.*", Mode: config.ModeEnforce, Scheme: fl},
		{Match: "lockCollection.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: leaseMS}},
		// TestSchemeModel, with the unscaled lease (modelLease).
		{Match: "model_holderFields.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: baseLeaseMS}},
		{Match: "model_lockDocument.*", Mode: config.ModeEnforce, Scheme: ld},
		{Match: "model_flag.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, LeaseMS: baseLeaseMS}},
		{Match: "model_lockCollection.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: baseLeaseMS}},
		{Match: "audit_holderFields.*", Mode: config.ModeAudit, Scheme: hf},
		{Match: "audit_lockDocument.*", Mode: config.ModeAudit, Scheme: ld},
		{Match: "audit_flag.*", Mode: config.ModeAudit, Scheme: fl},
		{Match: "audit_lockCollection.*", Mode: config.ModeAudit, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: leaseMS}},
		// BenchmarkSchemeWriteCost: long leases, so that the timed
		// writes run under one lock each.
		{Match: "benchown.*", Mode: config.ModeEnforce},
		{Match: "benchhf.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 600000}},
		{Match: "benchld.*", Mode: config.ModeEnforce, Scheme: ld},
		{Match: "benchflag.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, LeaseMS: 600000}},
		{Match: "benchlc.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 600000}},
		// A lock record that outlives a loaded machine's pauses, for the
		// tests that are about who may write, not about the lease's end
		// (TestSchemeLockThenCreate: a 1.5 s lease ran out between two
		// inserts under load and let the other client's insert through).
		{Match: "lockCollectionLong.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 600000}},
		// TestRegressFlagNonHolder's held flag, for the same reason.
		{Match: "flagLong.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, LeaseMS: 600000}},
		// lockcoll_test.go: named lock records with an absolute expiry, as
		// alistairjevans/mongodb-locks keeps them.
		{Match: "lockcoll2.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection,
			Collection: "resourceLocks", RecordID: "lock_{_id}", ExpiresField: "ExpireAt"}},
		// Rollout: enforced for one application, audited for the rest.
		{Match: "narrow.*", Mode: config.ModeEnforce, Scheme: fl, Clients: &config.Clients{AppNames: []string{"narrow-app"}}},
		{Match: "narrowown.*", Mode: config.ModeEnforce, Clients: &config.Clients{AppNames: []string{"own-app"}}, OtherClients: config.ModeAudit},
		// regress_test.go: a lease long enough to renew within, and
		// Tharga.MongoDB's lock sub-document.
		{Match: "regress_hf.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 3000}},
		{Match: "regress_tharga.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockDocument,
			Field: "Lock", ActorField: "Actor", ExpiresField: "ExpireTime", HolderField: "LockKey"}},
	}
	// TestSchemeTakeover's and the flag workload's later attempts: each
	// scheme again, in databases of their own, under a lease leaseScales
	// times as long.
	for _, k := range leaseScales[1:] {
		for _, scheme := range schemeNames {
			sch := &config.Scheme{Type: config.SchemeType(scheme), LeaseMS: leaseMS * k}
			if scheme == "lockDocument" {
				sch = ld // the script's own expiry is its lease
			}
			rs = append(rs, config.NamespaceRule{Match: scaledDB(scheme, k) + ".*", Mode: config.ModeEnforce, Scheme: sch})
		}
	}
	return rs
}

// TestMain lets the tests that mostly wait run at once (testkit.
// DefaultParallel, unless -parallel says otherwise): the four models'
// seeds (two each in the short form), the eight takeover cases (four
// schemes by two drivers), the two lock-collection tests that wait out
// leases, and TestSchemeWorkload, which holds its slot while it waits for
// them (waitPhase). The workloads, CPU, then stay one per CPU, go's
// default (testkit.CPUSlots).
func TestMain(m *testing.M) {
	flag.Parse()
	testkit.DefaultParallel(len(schemeNames)*len(shortSeeds) + len(schemeNames)*len(drivers) + 2 + 1)
	os.Exit(testkit.RunMain(m, setup))
}

// setup starts the embedded upstream and the two gateways in front of it.
func setup() (func() error, error) {
	core, logs := observer.New(zap.InfoLevel)
	auditLog = logs
	loggers := [2]*zap.Logger{zap.New(core), nil}
	if os.Getenv("SCHEMES_TEST_LOG") != "" {
		dev, _ := zap.NewDevelopment()
		loggers = [2]*zap.Logger{zap.New(zapcore.NewTee(core, dev.Core())), dev.Named("gw2")}
	}
	set, stop, err := twoproxies.Start(twoproxies.Options{Name: "tests/schemes", BaseLeaseMS: baseLeaseMS, Loggers: loggers,
		Rules: func(ms int64) []config.NamespaceRule {
			// The rules read it.
			leaseMS, lease = ms, time.Duration(ms)*time.Millisecond
			return rules()
		}})
	if err != nil {
		return nil, err
	}
	directURI, proxyURI, proxy2URI = set.DirectURI, set.ProxyURI, set.Proxy2URI
	gw, baseCfg = set.Gateway, set.Config
	return stop, nil
}

// waitPhase lets the tests that mostly wait out leases and clocks (the
// model's clock steps, the takeovers, the lock-collection tests that wait
// two leases) run beside each other, before the workloads, which keep the
// cores busy: each such test calls waitPhase.join before t.Parallel (go
// runs every top-level test up to its t.Parallel before it resumes any of
// them, so every member has joined before a workload can look), and
// TestSchemeWorkload waits for them all after its t.Parallel. A test left
// out by -run never joins, so nothing waits for it.
var waitPhase = phase{done: make(chan struct{})}

type phase struct {
	mu      sync.Mutex
	members int
	done    chan struct{}
}

// join makes t a member until it ends (its subtests too).
func (p *phase) join(t *testing.T) {
	p.mu.Lock()
	p.members++
	p.mu.Unlock()
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.members--; p.members == 0 {
			close(p.done)
			p.done = make(chan struct{}) // for -count's next round
		}
	})
}

// wait returns once every member has ended (at once when none joined).
func (p *phase) wait() {
	p.mu.Lock()
	n, done := p.members, p.done
	p.mu.Unlock()
	if n > 0 {
		<-done
	}
}
