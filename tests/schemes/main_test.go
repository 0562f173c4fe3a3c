// Package schemes proves that lockgate enforces the advisory locking
// schemes applications already use (docs/SCHEMES.md), with those
// applications' own code: pymongo scripts that write each scheme's
// acquire/write/release flow as an application would, run as subprocesses
// against a full lockgate (gateway.Start) in front of the embedded FerretDB,
// and, as the control, straight against FerretDB.
package schemes

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/embedded"
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

// leaseMS is the scheme lease of the holderFields and flag rules; the
// scripts' LEASE_S must match.
const leaseMS = 1500

// rules are the namespaces of the tests: database <scheme> enforced
// under that scheme, audit_<scheme> audited under it.
func rules() []config.NamespaceRule {
	hf := &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: leaseMS}
	ld := &config.Scheme{Type: config.SchemeLockDocument}
	fl := &config.Scheme{Type: config.SchemeFlag, LeaseMS: leaseMS}
	return append([]config.NamespaceRule{
		{Match: "holderFields.*", Mode: config.ModeEnforce, Scheme: hf},
		{Match: "lockDocument.*", Mode: config.ModeEnforce, Scheme: ld},
		{Match: "flag.*", Mode: config.ModeEnforce, Scheme: fl},
		{Match: "lockCollection.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: leaseMS}},
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
	},
		// The common libraries' presets (libs_test.go): lib_<library>.*.
		libRules()...)
}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

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
	cfg.Policy.LeaseMarginMS = 200
	cfg.Policy.Namespaces = rules()
	// Both proxies must key lock owners alike.
	dir, err := os.MkdirTemp("", "schemes")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cfg.Lockstore.OwnerSecretFile = dir + "/owner-secret"
	if err := os.WriteFile(cfg.Lockstore.OwnerSecretFile, []byte("0123456789abcdef0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "test config:", err)
		return 1
	}
	baseCfg = cfg
	ctx, cancel := context.WithCancel(context.Background())
	core, logs := observer.New(zap.InfoLevel)
	auditLog = logs
	log := zap.New(core)
	if os.Getenv("SCHEMES_TEST_LOG") != "" {
		dev, _ := zap.NewDevelopment()
		log = zap.New(zapcore.NewTee(core, dev.Core()))
	}
	g, err := gateway.Start(ctx, cfg, log)
	gw = g
	if err != nil {
		cancel()
		srv.Close()
		fmt.Fprintln(os.Stderr, "starting the gateway:", err)
		return 1
	}
	proxyURI = "mongodb://" + g.ProxyAddr().String() + "/"
	ctx2, cancel2 := context.WithCancel(context.Background())
	g2, err := gateway.Start(ctx2, cfg, zap.NewNop())
	if err != nil {
		cancel2()
		cancel()
		<-g.Done()
		srv.Close()
		fmt.Fprintln(os.Stderr, "starting the second gateway:", err)
		return 1
	}
	proxy2URI = "mongodb://" + g2.ProxyAddr().String() + "/"
	code := m.Run()
	cancel2()
	<-g2.Done()
	cancel()
	select {
	case <-g.Done():
		if err := g.Wait(); err != nil {
			fmt.Fprintln(os.Stderr, "gateway stopped with errors:", err)
			code = 1
		}
	case <-time.After(15 * time.Second):
		fmt.Fprintln(os.Stderr, "gateway did not stop within 15s")
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
