// Package schemes proves that lockgate enforces the advisory locking
// schemes applications already use (docs/SCHEMES.md), with those
// applications' own code: pymongo scripts that write each scheme's
// acquire/write/release flow as an application would, run as subprocesses
// against a full lockgate (gateway.Start) in front of the embedded FerretDB,
// and, as the control, straight against FerretDB.
package schemes

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
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
	return []config.NamespaceRule{
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
}

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, setup)) }

// setup starts the embedded upstream and the two gateways in front of it.
func setup() (func() error, error) {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		return nil, fmt.Errorf("starting the embedded upstream: %w", err)
	}
	directURI = srv.URI()
	scale, why, err := testkit.LeaseScale()
	if err != nil {
		srv.Close()
		return nil, err
	}
	leaseMS = baseLeaseMS * int64(scale)
	lease = time.Duration(leaseMS) * time.Millisecond
	fmt.Fprintf(os.Stderr, "tests/schemes: leases scaled by %d (%s): leaseMS %d\n", scale, why, leaseMS)
	dir, err := os.MkdirTemp("", "schemes")
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
	cfg.Policy.Namespaces = rules()
	// Both proxies must key lock owners alike.
	cfg.Lockstore.OwnerSecretFile = dir + "/owner-secret"
	if err := os.WriteFile(cfg.Lockstore.OwnerSecretFile, []byte("0123456789abcdef0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		return fail(err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(fmt.Errorf("test config: %w", err))
	}
	baseCfg = cfg
	core, logs := observer.New(zap.InfoLevel)
	auditLog = logs
	log := zap.New(core)
	if os.Getenv("SCHEMES_TEST_LOG") != "" {
		dev, _ := zap.NewDevelopment()
		log = zap.New(zapcore.NewTee(core, dev.Core()))
	}
	g, stop, err := gatewaytest.Run(cfg, log)
	if err != nil {
		return fail(err)
	}
	gw, proxyURI = g.Gateway, g.URI
	var log2 *zap.Logger
	if os.Getenv("SCHEMES_TEST_LOG") != "" {
		dev, _ := zap.NewDevelopment()
		log2 = dev.Named("gw2")
	}
	g2, stop2, err := gatewaytest.Run(cfg, log2)
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
