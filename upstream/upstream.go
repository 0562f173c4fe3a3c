package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/lockgate/lockgate/mongoerr"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/description"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
	"go.uber.org/zap"
)

// ErrNoPrimary is returned by Dial when no writable server is known before
// the dial's deadline.
var ErrNoPrimary = errors.New("upstream: no primary available")

// Options configure the upstream deployment.
type Options struct {
	// URI is a MongoDB connection string. Its hosts, replicaSet,
	// directConnection, heartbeatFrequencyMS, connectTimeoutMS and TLS
	// options decide where and how client connections are dialed.
	URI string
	// DialTimeout bounds one Dial, including the wait for a primary to be
	// known. Zero means 10s.
	DialTimeout time.Duration
	Logger      *zap.Logger
	// MaxPoolSize bounds the pool of the monitoring client (Client); 0
	// keeps it at 2, for monitoring alone. Raise it when the client also
	// serves other work (the gateway's resolver and lock store).
	MaxPoolSize uint64
	// ServerSelectionTimeout, unless the URI sets serverSelectionTimeoutMS,
	// bounds the wait for a suitable server in the
	// client's operations; 0 keeps the driver's default or the URI's.
	ServerSelectionTimeout time.Duration
	// AppName is the client's application name unless the URI names one.
	AppName string
}

// Upstream dials connections to the deployment's writable server: the
// primary of a replica set, a mongos of a sharded cluster, or the one
// server of a standalone. It follows elections through the driver's own
// server discovery and monitoring, so the proxy never re-implements SDAM.
//
// Upstream is safe for concurrent use.
type Upstream struct {
	log         *zap.Logger
	client      *mongo.Client
	tls         *tls.Config
	dialer      net.Dialer
	dialTimeout time.Duration

	mu      sync.Mutex
	target  string        // address that Dial uses; "" while unknown
	last    string        // the latest non-empty target, kept when usable
	changed chan struct{} // closed, and replaced, whenever target changes

	// testHookWaiting, when set, runs each time Dial, knowing no writable
	// server, starts waiting for one.
	testHookWaiting func()
}

// New parses the URI and starts monitoring the deployment. It does not wait
// for the deployment to answer: Dial and Ping do.
func New(ctx context.Context, opts Options) (*Upstream, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	co := options.Client().ApplyURI(opts.URI)
	if err := co.Validate(); err != nil {
		return nil, fmt.Errorf("upstream.uri: %w", err)
	}
	if co.LoadBalanced != nil && *co.LoadBalanced {
		return nil, errors.New("upstream.uri: loadBalanced deployments are not supported: point lockgate at the mongos or replica set members directly")
	}
	u := &Upstream{
		log:         opts.Logger.Named("upstream"),
		tls:         co.TLSConfig,
		dialTimeout: opts.DialTimeout,
		changed:     make(chan struct{}),
	}
	if co.ConnectTimeout != nil {
		u.dialer.Timeout = *co.ConnectTimeout
	}
	u.dialer.KeepAlive = 30 * time.Second

	// Polling keeps the monitor on plain hello round trips; streaming
	// monitoring needs topologyVersion support that buys nothing here.
	co.SetServerMonitoringMode(options.ServerMonitoringModePoll)
	if co.HeartbeatInterval == nil {
		co.SetHeartbeatInterval(2 * time.Second)
	}
	co.SetServerMonitor(&event.ServerMonitor{
		TopologyDescriptionChanged: func(e *event.TopologyDescriptionChangedEvent) {
			u.follow(e.NewDescription)
		},
	})
	// The monitoring client runs no client traffic; its pool only serves
	// the proxy's own queries (pings, probes, and whatever shares it).
	pool := opts.MaxPoolSize
	if pool == 0 {
		pool = 2
	}
	co.SetMaxPoolSize(pool).SetMinPoolSize(0)
	// The URI's serverSelectionTimeoutMS, when it names one, is the
	// operator's: it wins over the default the caller passes.
	if opts.ServerSelectionTimeout > 0 && co.ServerSelectionTimeout == nil {
		co.SetServerSelectionTimeout(opts.ServerSelectionTimeout)
	}
	if opts.AppName != "" && co.AppName == nil {
		co.SetAppName(opts.AppName)
	}
	client, err := mongo.Connect(ctx, co)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u.client = client
	return u, nil
}

// writable picks the server that takes writes: the replica set primary,
// otherwise a standalone or a mongos. Among several mongos it keeps the
// current one while it stays usable: switching would retire every healthy
// client connection to it for nothing (after a blip of another router, the
// first in the list, came back).
func writable(t description.Topology, current string) string {
	var fallback string
	keep := false
	for _, s := range t.Servers {
		addr := s.Addr.String()
		switch s.Kind {
		case description.RSPrimary:
			return addr
		case description.Standalone, description.Mongos:
			if addr == current {
				keep = true
			}
			if fallback == "" {
				fallback = addr
			}
		}
	}
	if keep {
		return current
	}
	return fallback
}

// follow moves the target to the topology's writable server.
func (u *Upstream) follow(t description.Topology) {
	u.mu.Lock()
	defer u.mu.Unlock()
	addr := writable(t, u.last)
	if addr == u.target {
		return
	}
	if addr == "" {
		// A primary that merely stops answering heartbeats keeps its
		// connections: they fail on their own if it is gone, and an
		// election that names a new primary retires them below.
		u.log.Warn("no writable upstream server known", zap.String("previous", u.target))
		u.target = ""
		return
	}
	prev := u.target
	u.target, u.last = addr, addr
	close(u.changed)
	u.changed = make(chan struct{})
	u.log.Info("writable upstream server", zap.String("addr", addr), zap.String("previous", prev))
}

// Target returns the address Dial currently uses, "" while none is known.
func (u *Upstream) Target() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.target
}

// current returns the target and a channel closed when it changes.
func (u *Upstream) current() (string, <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.target, u.changed
}

// Dial opens a new connection to the current writable server, waiting for
// one to be discovered within the dial timeout. The returned connection
// reports through Retired when another server has become the primary, so
// the proxy can move its client over.
func (u *Upstream) Dial(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, u.dialTimeout)
	defer cancel()
	for {
		addr, changed := u.current()
		if addr != "" {
			c, err := u.dialAddr(ctx, addr)
			if err != nil {
				return nil, err
			}
			return &Conn{Conn: c, addr: addr, up: u}, nil
		}
		if u.testHookWaiting != nil {
			u.testHookWaiting()
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w within %s", ErrNoPrimary, u.dialTimeout)
		}
	}
}

func (u *Upstream) dialAddr(ctx context.Context, addr string) (net.Conn, error) {
	c, err := u.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: dial %s: %w", addr, err)
	}
	if u.tls == nil {
		return c, nil
	}
	cfg := u.tls.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err == nil {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("upstream: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}

// Ping checks that a writable server answers; used by /readyz.
func (u *Upstream) Ping(ctx context.Context) error {
	return u.client.Ping(ctx, readpref.Primary())
}

// Client is the driver client that monitors the deployment. Others may
// run their own operations on it (one monitor and pool per deployment
// instead of one per purpose); Close disconnects it, so they must be done
// with it first.
func (u *Upstream) Client() *mongo.Client { return u.client }

// Close stops monitoring. Connections already dialed stay open.
func (u *Upstream) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return u.client.Disconnect(ctx)
}

// Conn is a connection to one upstream server.
type Conn struct {
	net.Conn
	addr string
	up   *Upstream
}

// WaitRetired blocks until another server has become the deployment's
// writable server (true) or ctx ends (false). The connection still works
// once retired, but writes sent over it will be refused, so the proxy moves
// its client to a new connection.
func (c *Conn) WaitRetired(ctx context.Context) bool {
	for {
		target, changed := c.up.current()
		if target != "" && target != c.addr {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// Addr is the server address this connection was dialed to.
func (c *Conn) Addr() string { return c.addr }

// Supports reports whether the deployment knows a command, by running it on
// the admin database: CommandNotFound means no, success or any other server
// error means yes. Only harmless commands may be probed this way.
func (u *Upstream) Supports(ctx context.Context, cmd bson.D) (bool, error) {
	err := u.client.Database("admin").RunCommand(ctx, cmd).Err()
	var ce mongo.CommandError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ce) && ce.Code == int32(mongoerr.CommandNotFound):
		return false, nil
	case errors.As(err, &ce):
		return true, nil
	}
	return false, err
}
