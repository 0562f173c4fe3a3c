// Package embedded runs FerretDB v1.24 with its SQLite backend inside the
// current process, as the real MongoDB-compatible upstream of the dev stack
// and of the integration tests.
//
// It must never be imported by cmd/proxy: the production binary talks to a
// real deployment and stays free of FerretDB and SQLite.
package embedded

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
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
	// Close removes, in memory (/dev/shm) where the machine has one: such
	// data need not outlive the server, and on disk every write waits for
	// SQLite's sync, which is most of a lock call's time in a test.
	Dir string
	// OnDisk keeps an empty Dir's temporary directory in the system's
	// temporary directory, not in memory: for a server whose data may
	// outgrow what /dev/shm holds (a container's is often 64 MB), such as
	// the dev stack's, which a person fills for as long as they like.
	OnDisk bool
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
	// stdin and kill are a child process's (startChild): closing stdin
	// stops it, kill ends it if it does not stop in time.
	stdin io.WriteCloser
	kill  func()
	// ids indexes FerretDB's tables for its own _id lookups (idIndexer);
	// nil in a parent whose server runs in a child process.
	ids *idIndexer
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

// ChildEnv names a binary of testserver/ferretdb. When it is set and
// opts.Logger is nil, Start runs FerretDB in a child process of that
// binary instead of in the current process. scripts/test.sh sets it for
// the race step: a test binary built with -race would otherwise run
// FerretDB and SQLite under the detector too, which is most of that
// step's CPU and tests none of lockgate's code (the proxy and its
// upstream talk over TCP either way, as in production).
const ChildEnv = "LOCKGATE_TEST_FERRETDB"

// Start starts FerretDB and returns once it accepts connections: in a
// child process when ChildEnv names its binary and opts.Logger is nil,
// in the current process otherwise.
func Start(opts Options) (*Server, error) {
	if bin := os.Getenv(ChildEnv); bin != "" && opts.Logger == nil {
		return startChild(bin, opts)
	}
	return StartInProcess(opts)
}

// StartInProcess starts FerretDB in the current process and returns once
// it accepts connections.
func StartInProcess(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	logger := opts.Logger
	if logger == nil {
		// A handler that is off, not a text handler writing to io.Discard:
		// FerretDB derives a logger (Logger.With) for every SQL query it
		// runs, and a text handler formats the attributes of each, to be
		// thrown away. That was about 3% of the CPU of the processes
		// serving FerretDB in the tests (docs/TESTING.md, the twelfth box).
		logger = slog.New(slog.DiscardHandler)
	}
	s, abs, err := newServer(opts)
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
	s.ids = startIDIndexer(abs)

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

// memoryDir is a directory in memory for temporary data, or "" (the
// system's temporary directory) where there is none.
func memoryDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && st.Mode().Perm()&0o002 != 0 {
		return "/dev/shm"
	}
	return ""
}

// newServer makes the Server's data directory: opts.Dir, or a temporary
// one that Close removes. abs is its absolute path.
func newServer(opts Options) (s *Server, abs string, err error) {
	s = &Server{dir: opts.Dir}
	if s.dir == "" {
		base := ""
		if !opts.OnDisk {
			base = memoryDir()
		}
		d, err := os.MkdirTemp(base, "lockgate-ferretdb-")
		if err != nil {
			return nil, "", err
		}
		s.dir, s.tempDir = d, true
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, "", err
	}
	abs, err = filepath.Abs(s.dir)
	if err != nil {
		s.cleanup()
		return nil, "", err
	}
	return s, abs, nil
}

// startChild runs bin (testserver/ferretdb) on the Server's directory and
// returns once it printed its connection string. The child stops when its
// stdin closes: at Close, or when this process ends in any way.
func startChild(bin string, opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	s, abs, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-addr", opts.Addr, "-dir", abs)
	// The child runs FerretDB in itself (StartInProcess); without ChildEnv
	// in its environment, nothing it might start would spawn another.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, ChildEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("embedded upstream %s: %w", bin, err)
	}
	s.stdin = stdin
	s.done = make(chan error, 1)
	line, readErr := bufio.NewReader(stdout).ReadString('\n')
	uri, ok := strings.CutPrefix(strings.TrimSpace(line), "uri ")
	if readErr != nil || !ok {
		stdin.Close()
		err := cmd.Wait()
		s.cleanup()
		return nil, fmt.Errorf("embedded upstream %s did not start (%v, %v, %q)", bin, readErr, err, line)
	}
	pu, err := url.Parse(uri)
	if err != nil {
		stdin.Close()
		_ = cmd.Wait()
		s.cleanup()
		return nil, fmt.Errorf("embedded upstream %s: connection string %q: %w", bin, uri, err)
	}
	s.uri, s.addr = uri, pu.Host
	go func() { s.done <- cmd.Wait() }()
	s.kill = func() { _ = cmd.Process.Kill() }
	return s, nil
}

// URI is the upstream's connection string.
func (s *Server) URI() string { return s.uri }

// Addr is the upstream's host:port.
func (s *Server) Addr() string { return s.addr }

// Dir is where the SQLite files live.
func (s *Server) Dir() string { return s.dir }

// Close stops FerretDB, waits for it, and removes a temporary data directory.
func (s *Server) Close() error {
	if s.stdin != nil {
		s.stdin.Close()
	} else {
		s.cancel()
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		if s.kill != nil {
			s.kill()
			<-s.done
		}
	}
	s.cleanup()
	return nil
}

func (s *Server) cleanup() {
	if s.ids != nil {
		s.ids.Close()
	}
	if s.tempDir {
		os.RemoveAll(s.dir)
	}
}
