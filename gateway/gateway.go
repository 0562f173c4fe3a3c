package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/mongo"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/upstream"
)

// Gateway is a running lockgate: both listeners bound, serving until the
// context given to Start is done.
type Gateway struct {
	logger   *zap.Logger
	reg      *prometheus.Registry
	proxyLn  net.Listener
	adminLn  net.Listener
	upstream *upstream.Upstream
	admin    *admin.Server
	guard    *guard.Guard
	// store is the lock store the guard and the admin views use; kept
	// for tests that take locks as the guard does (memory locks).
	store   *lockstore.Store
	reloads *prometheus.CounterVec
	trail   *audittrail.Trail // nil unless audit.enabled

	// nsClient lists databases and collections for the policy check;
	// policyWarnings holds its latest result.
	nsClient       *mongo.Client
	policyWarnings atomic.Pointer[[]string]

	done chan struct{}
	mu   sync.Mutex
	errs []error

	drain sync.Once // BeginDrain
}

// Start validates cfg, builds every component, binds the client and admin
// listeners and starts serving; it returns once both listeners accept
// connections, so ":0" addresses can be read back with ProxyAddr and
// AdminAddr. Cancelling ctx starts a graceful shutdown that Wait observes.
//
// Start does not wait for the upstream to answer: a gateway whose database
// is down still starts, reports not ready on /readyz, and recovers by
// itself when the database comes back.
//
// The proxy's own queries to the upstream deployment (the resolver, the
// policy check, and the lock store when lockstore.uri is empty or the
// upstream's) share the upstream monitor's driver client: one monitor and
// one pool per deployment. A lock store on another deployment has a
// client of its own.
//
// metrics are the caller's own series (the binary's lockgate_build_info),
// registered with the gateway's before either listener accepts, so that
// the first scrape already has them: registered after Start, they were
// missing from a scrape that came between.
func Start(ctx context.Context, cfg *config.Config, logger *zap.Logger, metrics ...prometheus.Collector) (_ *Gateway, err error) {
	if cfg == nil {
		return nil, errors.New("gateway: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: invalid config:\n%w", err)
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	a := &assembly{ctx: ctx, cfg: cfg, log: logger, callerMetrics: metrics}
	defer func() {
		if err != nil {
			a.undo()
		}
	}()
	for _, step := range []func() error{
		a.serverTLS,
		a.registerMetrics,
		a.listen,
		a.openUpstream,
		a.readSecrets,
		a.openAudit,
		a.openLockStore,
		a.newGuard,
		a.newProxy,
		a.newAdmin,
	} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	g := a.run()
	logger.Info("lockgate started",
		zap.Stringer("listen", a.proxyLn.Addr()),
		zap.Stringer("admin", a.adminLn.Addr()),
		zap.Bool("tls", a.tls != nil),
		zap.String("policyDefault", string(cfg.Policy.Default)),
		zap.Int("policyRules", len(cfg.Policy.Namespaces)),
		zap.String("policyVersion", a.pol.Version()),
	)
	return g, nil
}

// Reload applies the reloadable part of a new configuration, the policy,
// to the running gateway without touching connections. An invalid
// configuration is refused and the policy in force stays.
func (g *Gateway) Reload(cfg *config.Config) error {
	if err := cfg.Validate(); err != nil {
		g.CountReload(false)
		return fmt.Errorf("reload refused: %w", err)
	}
	pol, err := policy.CompileWithLease(cfg.Policy, cfg.Lockstore.DefaultLeaseMS)
	if err != nil {
		g.CountReload(false)
		return fmt.Errorf("reload refused: %w", err)
	}
	g.CountReload(true)
	old := g.guard.Policy()
	g.guard.SetPolicy(pol)
	g.logger.Info("policy reloaded", zap.String("version", pol.Version()), zap.String("previous", old.Version()))
	if g.trail != nil {
		g.trail.Append(audittrail.Event{Kind: audittrail.KindReload, Policy: pol.Version(), Detail: "previous " + old.Version()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.checkPolicy(ctx, pol)
	return nil
}

// CountReload counts a reload attempt, for refusals found before Reload
// (a file that does not parse).
func (g *Gateway) CountReload(applied bool) {
	if applied {
		g.reloads.WithLabelValues("applied").Inc()
	} else {
		g.reloads.WithLabelValues("refused").Inc()
	}
}

// readOwnerSecret reads the owner secret, from LOCKGATE_OWNER_SECRET or
// else the file; nil when none is configured.
func readOwnerSecret(c config.Lockstore) ([]byte, error) {
	if v := strings.TrimSpace(c.OwnerSecret); v != "" {
		if len(v) < guard.MinOwnerSecret {
			return nil, fmt.Errorf("%s: the secret is %d bytes, at least %d are needed (e.g. openssl rand -hex 32)",
				config.EnvOwnerSecretValue, len(v), guard.MinOwnerSecret)
		}
		return []byte(v), nil
	}
	path := c.OwnerSecretFile
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("lockstore.ownerSecretFile: %w", err)
	}
	b = []byte(strings.TrimSpace(string(b)))
	if len(b) < guard.MinOwnerSecret {
		return nil, fmt.Errorf("lockstore.ownerSecretFile: the secret in %s is %d bytes, at least %d are needed (e.g. openssl rand -hex 32 > %s)",
			path, len(b), guard.MinOwnerSecret, path)
	}
	return b, nil
}

// adminToken reads the operator token; "" when none is configured.
func adminToken(a config.AdminAuth) (string, error) {
	if a.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return "", fmt.Errorf("adminAuth.tokenFile: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < minAdminToken {
		return "", fmt.Errorf("adminAuth.tokenFile: the token in %s is shorter than %d characters (generate one with `openssl rand -hex 32`)", a.TokenFile, minAdminToken)
	}
	return t, nil
}

// minAdminToken is the shortest operator token accepted; config.example.yaml
// and docs/OPERATIONS.md state it, so that operators learn it before a
// start fails (a test keeps them in step).
const minAdminToken = 16

// splitShutdown divides the shutdown budget: most of it for draining
// client connections, a small tail for the admin listener, so the whole
// shutdown ends within total.
func splitShutdown(total time.Duration) (proxyGrace, adminGrace time.Duration) {
	adminGrace = min(2*time.Second, total/4)
	return total - adminGrace, adminGrace
}

func (g *Gateway) fail(err error) {
	g.logger.Error("gateway component failed", zap.Error(err))
	g.mu.Lock()
	g.errs = append(g.errs, err)
	g.mu.Unlock()
}

// ProxyAddr is the bound address of the client listener.
func (g *Gateway) ProxyAddr() net.Addr { return g.proxyLn.Addr() }

// AdminAddr is the bound address of the admin HTTP listener.
func (g *Gateway) AdminAddr() net.Addr { return g.adminLn.Addr() }

// Registry is the gateway's own Prometheus registry (never the global one).
func (g *Gateway) Registry() *prometheus.Registry { return g.reg }

// Admin is the admin server, for mounting read-only views.
func (g *Gateway) Admin() *admin.Server { return g.admin }

// Done is closed when the gateway has stopped.
func (g *Gateway) Done() <-chan struct{} { return g.done }

// Wait blocks until the gateway has stopped: after the context given to
// Start is done and every connection has drained, or after a component
// failed (which also stops the others). It returns nil after a clean
// shutdown and the component errors otherwise. Safe to call many times.
func (g *Gateway) Wait() error {
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(g.errs...)
}

// ServerTLS builds the client listener's TLS configuration; nil when TLS is
// off. Errors name the config key whose file is at fault.
func ServerTLS(t config.TLS) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.certFile/tls.keyFile: %w", err)
	}
	c := &tls.Config{
		Certificates: []tls.Certificate{cert},
		// MongoDB 4.0+ and every supported driver speak TLS 1.2.
		MinVersion: tls.VersionTLS12,
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.caFile: no PEM certificate in %s", t.CAFile)
		}
		c.ClientCAs = pool
	}
	switch t.ClientAuth {
	case config.ClientAuthNone, "":
		c.ClientAuth = tls.NoClientCert
	case config.ClientAuthRequest:
		c.ClientAuth = tls.RequestClientCert
		if c.ClientCAs != nil {
			c.ClientAuth = tls.VerifyClientCertIfGiven
		}
	case config.ClientAuthRequireAndVerify:
		if c.ClientCAs == nil {
			return nil, errors.New("tls.caFile: required when tls.clientAuth is require-and-verify")
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	default:
		return nil, fmt.Errorf("tls.clientAuth: unknown value %q", t.ClientAuth)
	}
	return c, nil
}

// reservedNamespaces are the lock store's namespaces, sealed against
// client requests. They are sealed even when lockstore.uri names another
// deployment: two URIs may reach the same servers, and the names belong to
// lockgate either way.
func reservedNamespaces(c config.Lockstore) guard.Reserved {
	db, coll := c.Database, c.Collection
	if db == "" {
		db = lockstore.DefaultDatabase
	}
	if coll == "" {
		coll = lockstore.DefaultCollection
	}
	return guard.ReservedFor(db, coll)
}
