package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/upstream"
)

// sharedPoolSize bounds the pool of the one driver client per deployment
// (the driver's default, which the resolver and the lock store had when
// each had its own client).
const sharedPoolSize = 100

// assembly is a gateway while Start builds it, one named step at a time.
// Every step adds components; whatever a step opened is closed again by
// undo when a later step fails.
type assembly struct {
	ctx     context.Context
	cfg     *config.Config
	log     *zap.Logger
	cleanup []func() error

	// callerMetrics are Start's caller's series, registered with the
	// gateway's own.
	callerMetrics []prometheus.Collector

	tls          *tls.Config
	reg          *prometheus.Registry
	proxyMetrics *proxy.Metrics
	proxyLn      net.Listener
	adminLn      net.Listener
	up           *upstream.Upstream
	pol          *policy.Policy
	token        string
	ownerSecret  []byte
	store        *lockstore.Store
	lsMetrics    *lockstore.Metrics
	// authRequired: whether the upstream refuses unauthenticated clients,
	// probed at start and every minute (run); until the first answer,
	// false.
	authRequired atomic.Bool
	guard        *guard.Guard
	guardMetrics *guard.Metrics
	reloads      *prometheus.CounterVec
	srv          *proxy.Server
	adm          *admin.Server
	trail        *audittrail.Trail // nil unless audit.enabled
	// auditClient, auditColl: the trail's collection sink, if any.
	auditClient   *mongo.Client
	auditColl     *mongo.Collection
	auditInstance string
}

func (a *assembly) undo() {
	for i := len(a.cleanup) - 1; i >= 0; i-- {
		a.cleanup[i]()
	}
}

func (a *assembly) serverTLS() (err error) {
	a.tls, err = ServerTLS(a.cfg.TLS)
	return err
}

func (a *assembly) registerMetrics() error {
	a.reg = prometheus.NewRegistry()
	a.proxyMetrics = proxy.NewMetrics()
	return a.register(append([]prometheus.Collector{
		collectors.NewGoCollector(),
		// go_build_info: which build is running, for rollouts.
		collectors.NewBuildInfoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		a.proxyMetrics,
	}, a.callerMetrics...)...)
}

func (a *assembly) register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := a.reg.Register(c); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

func (a *assembly) listen() (err error) {
	if a.proxyLn, err = net.Listen("tcp", a.cfg.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	a.cleanup = append(a.cleanup, a.proxyLn.Close)
	if a.adminLn, err = net.Listen("tcp", a.cfg.Admin); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	a.cleanup = append(a.cleanup, a.adminLn.Close)
	return nil
}

// openUpstream starts monitoring the deployment. Its client is the
// proxy's one client of that deployment, so its pool is sized for the
// resolver and the lock store too, and its server selection fails as fast
// as a lock store round trip may take.
func (a *assembly) openUpstream() (err error) {
	a.up, err = upstream.New(a.ctx, upstream.Options{
		URI:                    a.cfg.Upstream.URI,
		DialTimeout:            a.cfg.Upstream.DialTimeout.D(),
		Logger:                 a.log,
		MaxPoolSize:            sharedPoolSize,
		ServerSelectionTimeout: lockstore.DefaultOpTimeout,
		AppName:                "lockgate",
	})
	if err != nil {
		return err
	}
	a.cleanup = append(a.cleanup, a.up.Close)
	return nil
}

// readSecrets compiles the policy and reads the operator token and the
// owner secret.
func (a *assembly) readSecrets() (err error) {
	if a.pol, err = policy.CompileWithLease(a.cfg.Policy, a.cfg.Lockstore.DefaultLeaseMS); err != nil {
		return err
	}
	if a.token, err = adminToken(a.cfg.AdminAuth); err != nil {
		return err
	}
	if a.ownerSecret, err = readOwnerSecret(a.cfg.Lockstore); err != nil {
		return err
	}
	if a.ownerSecret == nil {
		a.log.Warn("neither lockstore.ownerSecretFile nor LOCKGATE_OWNER_SECRET is set: lock owners are hashed with a random secret of this process; " +
			"locks taken through it are not recognised as their holder's by other lockgate instances or after a restart " +
			"(they stay exclusive and expire with their leases). Give every instance that shares the lock store the same secret file.")
	}
	return nil
}

// sameDeployment reports whether the lock store lives on the upstream
// deployment: lockstore.uri empty or the upstream's own.
func sameDeployment(c *config.Config) bool {
	return c.Lockstore.URI == "" || c.Lockstore.URI == c.Upstream.URI
}

func (a *assembly) openLockStore() (err error) {
	cfg := a.cfg
	lockURI := cfg.Lockstore.URI
	opts := []lockstore.Option{lockstore.WithLogger(a.log)}
	if sameDeployment(cfg) {
		lockURI = cfg.Upstream.URI
		opts = append(opts, lockstore.WithClient(a.up.Client()))
	}
	a.lsMetrics = lockstore.NewMetrics()
	opts = append(opts, lockstore.WithMetrics(a.lsMetrics))
	if hook := a.expiries(); hook != nil {
		opts = append(opts, lockstore.WithExpiryHook(hook))
	}
	a.store, err = lockstore.Open(a.ctx, lockstore.Config{
		URI:          lockURI,
		Database:     cfg.Lockstore.Database,
		Collection:   cfg.Lockstore.Collection,
		DefaultLease: time.Duration(cfg.Lockstore.DefaultLeaseMS) * time.Millisecond,
		MaxLease:     time.Duration(cfg.Lockstore.MaxLeaseMS) * time.Millisecond,
		MaxWaiters:   cfg.Limits.MaxWaitersPerLock,

		TakeoverGrace:      time.Duration(cfg.Lockstore.TakeoverGraceMS) * time.Millisecond,
		NewcomerHorizon:    time.Duration(cfg.Lockstore.NewcomerHorizonMS) * time.Millisecond,
		WakeListen:         cfg.Lockstore.WakeListen,
		MaxLocksPerSession: cfg.Limits.MaxLocksPerSession,
	}, opts...)
	if err != nil {
		return err
	}
	a.cleanup = append(a.cleanup, func() error { return a.store.Close(context.Background()) })
	return nil
}

// newGuard builds the interceptor. Writes whose filter does not pin _id
// are resolved with the proxy's own client to the upstream, never over a
// client's connection.
func (a *assembly) newGuard() error {
	cfg, up := a.cfg, a.up
	a.guardMetrics = guard.NewMetrics()
	var store guard.LockStore = a.store
	var trail guard.AuditTrail
	if a.trail != nil {
		store, trail = &auditedStore{Store: a.store, trail: a.trail}, a.trail
	}
	a.guard = guard.New(guard.Options{
		Store:          store,
		Trail:          trail,
		AuditRequired:  trail != nil && cfg.Audit.Mode == config.AuditRequired,
		Reserved:       auditReserved(reservedNamespaces(cfg.Lockstore), cfg),
		OwnerSecret:    a.ownerSecret,
		AuthRequired:   a.authRequired.Load,
		Resolver:       guard.NewResolver(up.Client()),
		ResolveTimeout: time.Duration(cfg.Limits.ResolveTimeoutMS) * time.Millisecond,
		MaxLockIDs:     cfg.Limits.MaxLockIDs,
		MaxResolves:    cfg.Limits.MaxConcurrentResolves,
		MaxMessageSize: cfg.Limits.MaxMessageSizeBytes,
		EndSessionsSupported: func(ctx context.Context) (bool, error) {
			return up.Supports(ctx, bson.D{{Key: "endSessions", Value: bson.A{}}})
		},
		Logger:       a.log,
		DecisionSink: decisionSink(a.log),
		Metrics:      a.guardMetrics,

		MaxInFlight:   time.Duration(cfg.Lockstore.MaxLeaseMS) * time.Millisecond,
		ImplicitLease: time.Duration(cfg.Lockstore.DefaultLeaseMS) * time.Millisecond,
	})
	a.guard.SetPolicy(a.pol)
	a.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockgate_policy_reloads_total",
		Help: "Policy reloads by result: applied, or refused (the policy in force stayed).",
	}, []string{"result"})
	// At zero from the start, so that the alert on a refused reload sees
	// the first one (docs/OPERATIONS.md).
	a.reloads.WithLabelValues("applied")
	a.reloads.WithLabelValues("refused")
	return a.register(a.lsMetrics, a.guardMetrics, a.reloads, connectionLimit(cfg.Limits.MaxConnections))
}

func (a *assembly) newProxy() (err error) {
	cfg := a.cfg
	proxyGrace, _ := splitShutdown(cfg.ShutdownTimeout.D())
	// The request path: the guard's stages in their order (boundary, lock
	// commands, sessions, enforcement; docs/ARCHITECTURE.md).
	a.srv, err = proxy.New(proxy.Options{
		TLS:              a.tls,
		Upstream:         a.up,
		Interceptor:      proxy.Chain(a.guard.Stages()),
		MaxMessageSize:   cfg.Limits.MaxMessageSizeBytes,
		ShutdownGrace:    proxyGrace,
		MaxConnections:   cfg.Limits.MaxConnections,
		HandshakeTimeout: time.Duration(cfg.Limits.HandshakeTimeoutMS) * time.Millisecond,
		Logger:           a.log, // the proxy names itself
		Metrics:          a.proxyMetrics,
	})
	return err
}

func (a *assembly) newAdmin() (err error) {
	_, adminGrace := splitShutdown(a.cfg.ShutdownTimeout.D())
	a.adm, err = admin.New(admin.Options{
		Registry:        a.reg,
		Logger:          a.log.Named("admin"),
		ShutdownTimeout: adminGrace,
	})
	if err != nil {
		return err
	}
	return a.register(admin.ReadinessCollector(a.adm))
}

// run mounts the readiness checks and views and starts serving: the
// proxy, the policy check, the authentication probe and the admin
// listener, and the shutdown that closes everything once they are done.
func (a *assembly) run() *Gateway {
	ctx, logger, up, store, gd, srv, adm := a.ctx, a.log, a.up, a.store, a.guard, a.srv, a.adm
	// runCtx ends on the caller's cancel or on a fatal serve error. The
	// admin listener outlives it until the proxy has drained, so probes and
	// metrics stay observable during the drain.
	runCtx, stop := context.WithCancel(ctx)
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))

	// Readiness checks, in the order /readyz lists them.
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
	token := a.token
	mountViews(adm, store, gd.Policy, func() []string { return g.PolicyWarnings() }, token, logger.Named("admin"), gd.BeginForceRelease, a.forceReleases())
	rates := mountConsole(adm, store, gd.Policy, a.reg, token != "", a.trail != nil, time.Now)
	if a.trail != nil {
		mountAuditHistory(adm, a.historyQuery())
	}

	g = &Gateway{
		logger:   logger,
		reg:      a.reg,
		proxyLn:  a.proxyLn,
		adminLn:  a.adminLn,
		upstream: up,
		admin:    adm,
		guard:    gd,
		store:    a.store,
		reloads:  a.reloads,
		nsClient: up.Client(),
		trail:    a.trail,
		done:     make(chan struct{}),
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		defer stopAdmin()
		err := srv.Serve(runCtx, a.proxyLn)
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
		g.checkPolicy(cctx, a.pol)
	})
	wg.Go(func() { a.probeAuth(runCtx) })
	wg.Go(func() { rates.run(runCtx, 5*time.Second) })
	wg.Go(func() {
		if err := adm.Serve(adminCtx, a.adminLn); err != nil {
			g.fail(err)
			stop()
		}
	})
	go func() {
		wg.Wait()
		stop()
		// The lock store first: it may share the upstream's client, which
		// closing the upstream disconnects.
		if err := store.Close(context.Background()); err != nil {
			g.fail(fmt.Errorf("lockstore close: %w", err))
		}
		if err := up.Close(); err != nil {
			g.fail(fmt.Errorf("upstream close: %w", err))
		}
		// Last: the releases of the shutdown are in the trail before
		// its stop record.
		if err := a.closeAudit(); err != nil {
			g.fail(fmt.Errorf("audit trail close: %w", err))
		}
		close(g.done)
	}()
	return g
}

// probeAuth keeps authRequired current: at start, then every minute.
func (a *assembly) probeAuth(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, err := a.up.RequiresAuth(pctx)
		cancel()
		if err == nil && req != a.authRequired.Load() {
			a.authRequired.Store(req)
			a.log.Info("upstream authentication requirement", zap.Bool("required", req))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
