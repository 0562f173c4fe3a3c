package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"go.uber.org/zap"
)

// Dialer opens one upstream connection for one client connection.
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
	// MaxMessageSize bounds a message from a client or the upstream; 0 means
	// MongoDB's 48 MB.
	MaxMessageSize int
	// ShutdownGrace bounds how long Serve waits for in-flight requests after
	// its context is cancelled.
	ShutdownGrace time.Duration
	Logger        *zap.Logger
	Metrics       *Metrics
}

// Server accepts client connections and relays them to the upstream.
type Server struct{}

// New checks the options and returns a Server ready to Serve.
func New(opts Options) (*Server, error) { panic("todo") }

// Serve accepts connections on ln until ctx is cancelled, then stops
// accepting, lets in-flight requests finish within ShutdownGrace, closes
// every connection and returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error { panic("todo") }

// Interceptor is the seam for lock commands and enforcement.
type Interceptor interface{}

// Metrics are the proxy's Prometheus collectors.
type Metrics struct{}

// NewMetrics creates the proxy's collectors; register them with
// (*Metrics).Register or use them as a prometheus.Collector.
func NewMetrics() *Metrics { panic("todo") }
