package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
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
	Logger        *zap.Logger
	Metrics       *Metrics
}

// Server accepts client connections and relays each to its own upstream
// connection. It is safe for concurrent use; Serve may be called once.
type Server struct {
	opts    Options
	log     *zap.Logger
	metrics *Metrics
	pool    *wire.BufferPool

	nextConn atomic.Uint64
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
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: back off, as
				// net/http does, instead of spinning or giving up.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration("delay", delay))
				time.Sleep(delay)
				continue
			}
			serveErr = err
			break
		}
		delay = 0
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
	every := min(s.opts.MessageTimeout, s.opts.WriteTimeout) / 4
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
			if why := c.stuck(now, s.opts.MessageTimeout, s.opts.WriteTimeout); why != "" {
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
	} else {
		delete(s.conns, c)
	}
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
