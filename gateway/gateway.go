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
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
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
	reloads  *prometheus.CounterVec

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
func Start(ctx context.Context, cfg *config.Config, logger *zap.Logger) (_ *Gateway, err error) {
	if cfg == nil {
		return nil, errors.New("gateway: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: invalid config:\n%w", err)
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	tlsCfg, err := ServerTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	// Everything opened below is closed again if a later step fails.
	var cleanup []func() error
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	reg := prometheus.NewRegistry()
	metrics := proxy.NewMetrics()
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		// go_build_info: which build is running, for rollouts.
		collectors.NewBuildInfoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: registering metrics: %w", err)
		}
	}

	proxyLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen: %w", err)
	}
	cleanup = append(cleanup, proxyLn.Close)
	adminLn, err := net.Listen("tcp", cfg.Admin)
	if err != nil {
		return nil, fmt.Errorf("gateway: admin: %w", err)
	}
	cleanup = append(cleanup, adminLn.Close)

	up, err := upstream.New(ctx, upstream.Options{
		URI:         cfg.Upstream.URI,
		DialTimeout: cfg.Upstream.DialTimeout.D(),
		Logger:      logger,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	cleanup = append(cleanup, up.Close)

	pol, err := policy.CompileWithLease(cfg.Policy, cfg.Lockstore.DefaultLeaseMS)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	token, err := adminToken(cfg.AdminAuth)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	ownerSecret, err := readOwnerSecret(cfg.Lockstore)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if ownerSecret == nil {
		logger.Warn("neither lockstore.ownerSecretFile nor LOCKGATE_OWNER_SECRET is set: lock owners are hashed with a random secret of this process; " +
			"locks taken through it are not recognised as their holder's by other lockgate instances or after a restart " +
			"(they stay exclusive and expire with their leases). Give every instance that shares the lock store the same secret file.")
	}
	lockURI := cfg.Lockstore.URI
	if lockURI == "" {
		lockURI = cfg.Upstream.URI
	}
	lsMetrics := lockstore.NewMetrics()
	store, err := lockstore.Open(ctx, lockstore.Config{
		URI:          lockURI,
		Database:     cfg.Lockstore.Database,
		Collection:   cfg.Lockstore.Collection,
		DefaultLease: time.Duration(cfg.Lockstore.DefaultLeaseMS) * time.Millisecond,
		MaxLease:     time.Duration(cfg.Lockstore.MaxLeaseMS) * time.Millisecond,
		MaxWaiters:   cfg.Limits.MaxWaitersPerLock,

		TakeoverGrace:      time.Duration(cfg.Lockstore.TakeoverGraceMS) * time.Millisecond,
		MaxLocksPerSession: cfg.Limits.MaxLocksPerSession,
	}, lockstore.WithLogger(logger), lockstore.WithMetrics(lsMetrics))
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	cleanup = append(cleanup, func() error { return store.Close(context.Background()) })
	// Writes whose filter does not pin _id are resolved with the proxy's
	// own client to the upstream, never over a client's connection.
	resolverClient, err := mongo.Connect(ctx, options.Client().ApplyURI(cfg.Upstream.URI).SetAppName("lockgate-resolver"))
	if err != nil {
		return nil, fmt.Errorf("gateway: upstream.uri: %w", err)
	}
	cleanup = append(cleanup, func() error { return resolverClient.Disconnect(context.Background()) })
	// Whether the upstream refuses unauthenticated clients, probed at
	// start and every minute (below); until the first answer, false.
	var authRequired atomic.Bool
	guardMetrics := guard.NewMetrics()
	gd := guard.New(guard.Options{
		Store:          store,
		Reserved:       reservedNamespaces(cfg.Lockstore),
		OwnerSecret:    ownerSecret,
		AuthRequired:   authRequired.Load,
		Resolver:       guard.NewResolver(resolverClient),
		ResolveTimeout: time.Duration(cfg.Limits.ResolveTimeoutMS) * time.Millisecond,
		MaxLockIDs:     cfg.Limits.MaxLockIDs,
		MaxResolves:    cfg.Limits.MaxConcurrentResolves,
		MaxMessageSize: cfg.Limits.MaxMessageSizeBytes,
		EndSessionsSupported: func(ctx context.Context) (bool, error) {
			return up.Supports(ctx, bson.D{{Key: "endSessions", Value: bson.A{}}})
		},
		Logger:  logger,
		Metrics: guardMetrics,

		MaxInFlight: time.Duration(cfg.Lockstore.MaxLeaseMS) * time.Millisecond,
	})
	gd.SetPolicy(pol)
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockgate_policy_reloads_total",
		Help: "Policy reloads by result: applied, or refused (the policy in force stayed).",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{lsMetrics, guardMetrics, reloads, connectionLimit(cfg.Limits.MaxConnections)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: registering metrics: %w", err)
		}
	}

	proxyGrace, adminGrace := splitShutdown(cfg.ShutdownTimeout.D())
	srv, err := proxy.New(proxy.Options{
		TLS:              tlsCfg,
		Upstream:         up,
		Interceptor:      gd,
		MaxMessageSize:   cfg.Limits.MaxMessageSizeBytes,
		ShutdownGrace:    proxyGrace,
		MaxConnections:   cfg.Limits.MaxConnections,
		HandshakeTimeout: time.Duration(cfg.Limits.HandshakeTimeoutMS) * time.Millisecond,
		Logger:           logger, // the proxy names itself
		Metrics:          metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	adm, err := admin.New(admin.Options{
		Registry:        reg,
		Logger:          logger.Named("admin"),
		ShutdownTimeout: adminGrace,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := reg.Register(admin.ReadinessCollector(adm)); err != nil {
		return nil, fmt.Errorf("gateway: registering metrics: %w", err)
	}

	// runCtx ends on the caller's cancel or on a fatal serve error. The
	// admin listener outlives it until the proxy has drained, so probes and
	// metrics stay observable during the drain.
	runCtx, stop := context.WithCancel(ctx)
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))

	// Readiness checks, in the order /readyz lists them. Later components
	// (lockstore, policy) add theirs here.
	adm.AddCheck("serving", func(context.Context) error {
		if runCtx.Err() != nil {
			return errors.New("shutting down: draining client connections")
		}
		return nil
	})
	adm.AddCheck("upstream", up.Ping)
	adm.AddCheck("lockstore", store.Ping)
	adm.AddCheck("policy", func(context.Context) error {
		if gd.Policy() == nil {
			return errors.New("no policy loaded")
		}
		return nil
	})
	adm.AddCheck("connections", func(context.Context) error {
		if srv.AtLimit() {
			return errors.New("limits.maxConnections client connections are open: new clients are turned away")
		}
		return nil
	})
	var g *Gateway
	mountViews(adm, store, gd.Policy, func() []string { return g.PolicyWarnings() }, token, logger.Named("admin"), gd.WaitWritesOn)
	mountConsole(adm, store, gd.Policy, reg, token != "")

	g = &Gateway{
		logger:   logger,
		reg:      reg,
		proxyLn:  proxyLn,
		adminLn:  adminLn,
		upstream: up,
		admin:    adm,
		guard:    gd,
		reloads:  reloads,
		nsClient: resolverClient,
		done:     make(chan struct{}),
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		defer stopAdmin()
		err := srv.Serve(runCtx, proxyLn)
		switch {
		case runCtx.Err() != nil && errors.Is(err, context.Canceled):
			err = nil // the shutdown we asked for
		case err == nil && runCtx.Err() == nil:
			err = errors.New("stopped accepting connections unexpectedly")
		}
		if err != nil {
			g.fail(fmt.Errorf("proxy: %w", err))
			stop()
		}
	})
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
		defer cancel()
		g.checkPolicy(cctx, pol)
	})
	wg.Go(func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			pctx, cancel := context.WithTimeout(runCtx, 10*time.Second)
			req, err := up.RequiresAuth(pctx)
			cancel()
			if err == nil && req != authRequired.Load() {
				authRequired.Store(req)
				logger.Info("upstream authentication requirement", zap.Bool("required", req))
			}
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Go(func() {
		if err := adm.Serve(adminCtx, adminLn); err != nil {
			g.fail(err)
			stop()
		}
	})
	go func() {
		wg.Wait()
		stop()
		resolverClient.Disconnect(context.Background())
		if err := store.Close(context.Background()); err != nil {
			g.fail(fmt.Errorf("lockstore close: %w", err))
		}
		if err := up.Close(); err != nil {
			g.fail(fmt.Errorf("upstream close: %w", err))
		}
		close(g.done)
	}()

	logger.Info("lockgate started",
		zap.Stringer("listen", proxyLn.Addr()),
		zap.Stringer("admin", adminLn.Addr()),
		zap.Bool("tls", tlsCfg != nil),
		zap.String("policyDefault", string(cfg.Policy.Default)),
		zap.Int("policyRules", len(cfg.Policy.Namespaces)),
		zap.String("policyVersion", pol.Version()),
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
