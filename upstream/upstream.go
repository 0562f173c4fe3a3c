package upstream

import (
	"context"
	"net"

	"go.uber.org/zap"
)

// Options configure the upstream deployment.
type Options struct {
	// URI is a MongoDB connection string. Its hosts, replicaSet, directConnection
	// and TLS options decide where and how client connections are dialed.
	URI    string
	Logger *zap.Logger
}

// Upstream dials connections to the deployment's primary.
type Upstream struct{}

// New parses the URI and starts monitoring the deployment.
func New(ctx context.Context, opts Options) (*Upstream, error) { panic("todo") }

// Dial opens a new connection to the current primary.
func (u *Upstream) Dial(ctx context.Context) (net.Conn, error) { panic("todo") }

// Ping checks that the primary answers a hello; used by /readyz.
func (u *Upstream) Ping(ctx context.Context) error { panic("todo") }

// Close stops monitoring.
func (u *Upstream) Close() error { panic("todo") }
