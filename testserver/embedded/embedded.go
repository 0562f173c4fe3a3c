// Package embedded runs FerretDB v1.24 with its SQLite backend inside the
// current process, as the real MongoDB-compatible upstream of the dev stack
// and of the integration tests.
//
// It must never be imported by cmd/proxy: the production binary talks to a
// real deployment and stays free of FerretDB and SQLite.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// Options configure an embedded upstream.
type Options struct {
	// Addr is the TCP address to listen on; "127.0.0.1:0" picks a free port.
	Addr string
	// Dir holds the SQLite files. Empty means a new temporary directory that
	// Close removes.
	Dir string
	// Logger receives FerretDB's own logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running embedded upstream.
type Server struct {
	uri     string
	addr    string
	dir     string
	tempDir bool
	cancel  context.CancelFunc
	done    chan error
}

// Shared is the setup of a test package whose tests share one server
// (testkit.RunMain's): it starts the server with opts into *srv and
// returns its Close as the teardown.
func Shared(srv **Server, opts Options) func() (func() error, error) {
	return func() (func() error, error) {
		s, err := Start(opts)
		if err != nil {
			return nil, fmt.Errorf("starting the embedded upstream: %w", err)
		}
		*srv = s
		return s.Close, nil
	}
}

// Start starts FerretDB and returns once it accepts connections.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{dir: opts.Dir}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "lockgate-ferretdb-")
		if err != nil {
			return nil, err
		}
		s.dir, s.tempDir = d, true
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(s.dir)
	if err != nil {
		return nil, err
	}
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: opts.Addr},
		Handler:   "sqlite",
		SQLiteURL: "file:" + abs + "/",
		Logger:    logger,
	})
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("embedded upstream: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan error, 1)
	go func() { s.done <- f.Run(ctx) }()

	// MongoDBURI is only meaningful once the listener is bound; Run binds it
	// asynchronously, so wait until a TCP dial succeeds.
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := f.MongoDBURI()
		if pu, err := url.Parse(u); err == nil && !strings.HasSuffix(pu.Host, ":0") {
			if c, err := net.DialTimeout("tcp", pu.Host, time.Second); err == nil {
				c.Close()
				s.uri, s.addr = u, pu.Host
				return s, nil
			}
		}
		select {
		case err := <-s.done:
			s.cleanup()
			return nil, fmt.Errorf("embedded upstream exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, errors.New("embedded upstream did not start within 30s")
		}
	}
}

// URI is the upstream's connection string.
func (s *Server) URI() string { return s.uri }

// Addr is the upstream's host:port.
func (s *Server) Addr() string { return s.addr }

// Dir is where the SQLite files live.
func (s *Server) Dir() string { return s.dir }

// Close stops FerretDB, waits for it, and removes a temporary data directory.
func (s *Server) Close() error {
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
	s.cleanup()
	return nil
}

func (s *Server) cleanup() {
	if s.tempDir {
		os.RemoveAll(s.dir)
	}
}
