package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.uber.org/zap"
)

// Dialer opens one upstream connection for one client connection. A
// connection that also has a WaitRetired(ctx) bool method is closed, once
// idle, when that method reports that its server is no longer the one that
// takes writes (see package upstream).
type Dialer interface {
	Dial(ctx context.Context) (net.Conn, error)
}

// Options configure a Server.
type Options struct {
	// TLS, when set, makes the listener speak TLS to clients.
	TLS *tls.Config
	// Upstream dials the deployment.
	Upstream Dialer
	// Interceptor sees every decoded client request; nil forwards everything.
	Interceptor Interceptor
	// MaxMessageSize bounds a message from a client; 0 means MongoDB's
	// 48 MB.
	MaxMessageSize int
	// MessageTimeout bounds how long a client may take to send one message
	// once its first byte has arrived; 0 means 2 minutes. Idle connections
	// are never timed out.
	MessageTimeout time.Duration
	// WriteTimeout bounds one write to a client that does not read its
	// replies; 0 means 2 minutes.
	WriteTimeout time.Duration
	// ShutdownGrace bounds how long Serve waits for in-flight requests after
	// its context is cancelled; 0 means 15 seconds.
	ShutdownGrace time.Duration
	// MaxConnections bounds the open client connections; a client beyond
	// it is closed at once and counted. 0 derives it from the process's
	// file descriptor limit (DefaultMaxConnections).
	MaxConnections int
	// HandshakeTimeout closes a client that sends nothing for this long
	// after connecting; 0 means 10 seconds.
	HandshakeTimeout time.Duration
	Logger           *zap.Logger
	Metrics          *Metrics
}

// Server accepts client connections and relays each to its own upstream
// connection. It is safe for concurrent use; Serve may be called once.
type Server struct {
	opts    Options
	log     *zap.Logger
	metrics *Metrics
	pool    *wire.BufferPool

	nextConn atomic.Uint64
	open     atomic.Int64 // len(conns), read on every accept
	mu       sync.Mutex
	conns    map[*conn]struct{}
	wg       sync.WaitGroup
}

// New checks the options and returns a Server ready to Serve.
func New(opts Options) (*Server, error) {
	if opts.Upstream == nil {
		return nil, errors.New("proxy: no upstream dialer")
	}
	if opts.MaxMessageSize <= 0 {
		opts.MaxMessageSize = wire.DefaultMaxMessageSize
	}
	if opts.MessageTimeout <= 0 {
		opts.MessageTimeout = 2 * time.Minute
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 2 * time.Minute
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 15 * time.Second
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections()
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	return &Server{
		opts:    opts,
		log:     opts.Logger.Named("proxy"),
		metrics: opts.Metrics,
		pool:    wire.NewBufferPool(),
		conns:   make(map[*conn]struct{}),
	}, nil
}

// Serve accepts connections on ln until ctx is cancelled, then stops
// accepting, lets in-flight requests finish within ShutdownGrace, closes
// every connection and returns nil. An accept error other than the
// listener closing is returned after the same drain.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	// Connections get their own context: cancelling ctx starts a graceful
	// drain, cancelling connCtx ends whatever is left after the grace.
	connCtx, cancelConns := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelConns()

	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	watchdogDone := make(chan struct{})
	go s.watchdog(connCtx, watchdogDone)
	defer func() { cancelConns(); <-watchdogDone }()

	var serveErr error
	var delay time.Duration
	var lastLog time.Time
	suppressed := 0
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if temporaryAcceptError(err) {
				// Out of file descriptors and the like: back off, as
				// net/http does, instead of spinning or giving up. The
				// connections already open keep being served, and closing
				// them frees descriptors for the next accept.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.metrics.acceptErrors.Inc()
				if time.Since(lastLog) >= 10*time.Second {
					s.log.Warn("accept failed; retrying with backoff", zap.Error(err), zap.Duration("delay", delay), zap.Int("suppressed", suppressed))
					lastLog, suppressed = time.Now(), 0
				} else {
					suppressed++
				}
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				continue
			}
			serveErr = err
			break
		}
		delay = 0
		if s.open.Load() >= int64(s.opts.MaxConnections) {
			// Closed before it costs anything more: no goroutine, no
			// upstream connection, no buffers.
			s.metrics.connsRefused.Inc()
			nc.Close()
			continue
		}
		c := s.newConn(connCtx, nc, s.nextConn.Add(1))
		s.track(c, true)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.track(c, false)
			s.metrics.connsOpen.Inc()
			s.metrics.connsTotal.Inc()
			defer s.metrics.connsOpen.Dec()
			c.log.Debug("client connected")
			c.serve()
		}()
	}
	ln.Close()
	s.shutdown(cancelConns)
	return serveErr
}

// watchdog closes connections whose client trickles a message or stops
// reading its replies. One goroutine for the whole server keeps socket
// deadlines off every request's path.
func (s *Server) watchdog(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	every := min(s.opts.MessageTimeout, s.opts.WriteTimeout, s.opts.HandshakeTimeout) / 4
	every = max(every, 20*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		var stuck []*conn
		var reasons []string
		s.mu.Lock()
		for c := range s.conns {
			if why := c.stuck(now, s.opts.MessageTimeout, s.opts.WriteTimeout, s.opts.HandshakeTimeout); why != "" {
				stuck = append(stuck, c)
				reasons = append(reasons, why)
			}
		}
		s.mu.Unlock()
		for i, c := range stuck {
			s.metrics.error(errSlowClient)
			c.log.Warn("closing client connection: " + reasons[i])
			c.close()
		}
	}
}

func (s *Server) track(c *conn, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.conns[c] = struct{}{}
		s.open.Add(1)
	} else {
		delete(s.conns, c)
		s.open.Add(-1)
	}
}

// AtLimit reports whether the open client connections have reached
// MaxConnections, so that new clients are being turned away (a readiness
// check: a load balancer should send them elsewhere).
func (s *Server) AtLimit() bool { return s.open.Load() >= int64(s.opts.MaxConnections) }

// DefaultMaxConnections derives the connection limit from the process's
// file descriptor limit: each client costs two descriptors (its socket and
// its upstream connection), and a reserve is kept for listeners, the lock
// store's and resolver's pools, logs and config files.
func DefaultMaxConnections() int {
	const reserve = 128
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == rl.Max && rl.Cur > 1<<30 {
		return 10000
	}
	n := (int64(rl.Cur) - reserve) / 2
	return int(max(n, 16))
}

// temporaryAcceptError reports whether an accept failure will likely pass:
// the process or system is out of descriptors or buffers, or one
// connection was aborted before it was accepted. Only a closed or broken
// listener ends Serve.
func temporaryAcceptError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EPROTO, syscall.EPERM, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// shutdown drains every connection, waits up to the grace period, then
// closes what is left.
func (s *Server) shutdown(cancelConns context.CancelFunc) {
	s.mu.Lock()
	n := len(s.conns)
	for c := range s.conns {
		c.drain()
	}
	s.mu.Unlock()
	s.log.Info("draining client connections", zap.Int("connections", n), zap.Duration("grace", s.opts.ShutdownGrace))

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(s.opts.ShutdownGrace):
	}
	s.mu.Lock()
	left := len(s.conns)
	s.mu.Unlock()
	s.log.Warn("shutdown grace elapsed: closing connections with requests in flight", zap.Int("connections", left))
	cancelConns()
	s.mu.Lock()
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	<-done
}
