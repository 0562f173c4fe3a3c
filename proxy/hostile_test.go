package proxy

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// flakyListener fails its first n accepts with err, as a process out of
// file descriptors does, then behaves.
type flakyListener struct {
	net.Listener
	failures atomic.Int32
	err      error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: l.err}
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsDoNotEndTheProxy: EMFILE from accept used to end Serve,
// and with it the whole process (issue 12). Each temporary error is now
// counted and retried with backoff, and the proxy keeps serving.
func TestAcceptErrorsDoNotEndTheProxy(t *testing.T) {
	for _, errno := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			up := echoUpstream(t, nil)
			m := NewMetrics()
			core, _ := observer.New(zap.DebugLevel)
			srv, err := New(Options{Upstream: dialTo(up.Addr()), Metrics: m, Logger: zap.New(core), ShutdownGrace: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &flakyListener{Listener: inner, err: errno}
			ln.failures.Store(5)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx, ln) }()

			c := dialRaw(t, inner.Addr().String())
			req, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
			c.send(req)
			if !isOK(body(t, c.read())) {
				t.Fatal("no answer after the accept errors")
			}
			if got := testutil.ToFloat64(m.acceptErrors); got != 5 {
				t.Errorf("lockgate_accept_errors_total = %v, want 5", got)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve returned %v after a clean shutdown", err)
			}
		})
	}
}

// TestConnectionLimit: beyond MaxConnections a new client is closed at
// once, counted, and the server reports itself at its limit; a slot freed
// is usable again.
func TestConnectionLimit(t *testing.T) {
	up := echoUpstream(t, nil)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), MaxConnections: 2})
	a, b := dialRaw(t, p.addr), dialRaw(t, p.addr)
	for _, c := range []*rawClient{a, b} {
		req, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(req)
		c.read()
	}
	third, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatal("a client beyond the limit was not closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a client beyond the limit was left open")
	}
	if got := testutil.ToFloat64(p.metrics.connsRefused); got != 1 {
		t.Errorf("lockgate_client_connections_refused_total = %v, want 1", got)
	}
	a.conn.Close()
	testkit.Eventually(t, 10*time.Second, "one open connection", func() bool { return testutil.ToFloat64(p.metrics.connsOpen) == 1 })
	c := dialRaw(t, p.addr)
	req, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	c.send(req)
	c.read()
}

// TestSilentClientsCostNoUpstream: a client that connects and sends
// nothing gets no upstream connection (it used to be dialed at accept)
// and is closed after the handshake timeout.
func TestSilentClientsCostNoUpstream(t *testing.T) {
	var dials atomic.Int32
	up := echoUpstream(t, nil)
	d := dialFunc(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", up.Addr())
	})
	p := startProxy(t, Options{Upstream: d, HandshakeTimeout: 300 * time.Millisecond})
	silent := make([]net.Conn, 5)
	for i := range silent {
		c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent[i] = c
	}
	testkit.Eventually(t, 10*time.Second, "five open connections", func() bool { return testutil.ToFloat64(p.metrics.connsOpen) == 5 })
	if n := dials.Load(); n != 0 {
		t.Errorf("%d upstream connections dialed for clients that sent nothing", n)
	}
	for _, c := range silent {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("a silent client was not closed after the handshake timeout: %v", err)
		}
	}
	if len(p.logs.FilterMessageSnippet("sent nothing within").All()) == 0 {
		t.Error("the close of a silent client was not logged with its reason")
	}
	// A client that speaks is dialed once, on its first request.
	c := dialRaw(t, p.addr)
	req, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	c.send(req)
	c.read()
	if n := dials.Load(); n != 1 {
		t.Errorf("%d upstream dials for one speaking client, want 1", n)
	}
}

// TestUpstreamDownAnswersTheClient: when the upstream cannot be reached,
// the client's first request gets an error that says so (it used to see
// only a reset connection).
func TestUpstreamDownAnswersTheClient(t *testing.T) {
	d := dialFunc(func(ctx context.Context) (net.Conn, error) { return nil, errors.New("connection refused") })
	p := startProxy(t, Options{Upstream: d})
	c := dialRaw(t, p.addr)
	req, _ := c.msg(0, bson.D{{"hello", 1}, {"$db", "admin"}})
	c.send(req)
	doc := body(t, c.read())
	msg, _ := doc.Lookup("errmsg").StringValueOK()
	if code, _ := doc.Lookup("code").AsInt64OK(); code != 6 || !strings.Contains(msg, "cannot reach the upstream") {
		t.Errorf("reply %v, want HostUnreachable saying the upstream cannot be reached", doc)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
