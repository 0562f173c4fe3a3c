package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// Leg is one path from the client to the upstream.
type Leg string

// The three legs, in the order reports list them.
const (
	// Direct: client -> upstream.
	Direct Leg = "direct"
	// Relayed: client -> plain TCP relay -> upstream.
	Relayed Leg = "relay"
	// Lockgate: client -> lockgate proxy -> upstream.
	Lockgate Leg = "lockgate"
)

// AllLegs lists every leg.
var AllLegs = []Leg{Direct, Relayed, Lockgate}

// Upstream names the server behind the legs.
type Upstream string

// The upstreams.
const (
	// Instant answers from memory (see Instant).
	InstantUpstream Upstream = "instant"
	// FerretDB is the embedded FerretDB v1.24 with SQLite.
	FerretDB Upstream = "ferretdb"
)

// AllUpstreams lists every upstream, fastest first.
var AllUpstreams = []Upstream{InstantUpstream, FerretDB}

// Stack is one upstream with a relay and a lockgate proxy in front of it.
type Stack struct {
	Upstream Upstream
	addrs    map[Leg]string
	closers  []func() error // in start order; Close runs them backwards
}

// payload is the filler field of every seeded document, so that a found
// document is a realistic size (about 180 bytes) rather than a few bytes.
var payload = strings.Repeat("lockgate-benchmark-", 8)

// StartStack starts the upstream, a relay and a proxy. docs bounds the
// _ids the instant upstream keeps.
func StartStack(u Upstream, docs int) (st *Stack, err error) {
	st = &Stack{Upstream: u, addrs: make(map[Leg]string, len(AllLegs))}
	defer func() {
		if err != nil {
			st.Close()
			st = nil
		}
	}()
	switch u {
	case InstantUpstream:
		s, err := StartInstant(docs, payload)
		if err != nil {
			return nil, err
		}
		st.closers = append(st.closers, s.Close)
		st.addrs[Direct] = s.Addr()
	case FerretDB:
		s, err := embedded.Start(embedded.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return nil, err
		}
		st.closers = append(st.closers, s.Close)
		st.addrs[Direct] = s.Addr()
	default:
		return nil, fmt.Errorf("bench: unknown upstream %q", u)
	}
	r, err := StartRelay(st.addrs[Direct])
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, r.Close)
	st.addrs[Relayed] = r.Addr()

	p, err := startProxy(st.addrs[Direct])
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, p.close)
	st.addrs[Lockgate] = p.addr
	return st, nil
}

// Addr is the host:port a client of leg l connects to.
func (st *Stack) Addr(l Leg) string { return st.addrs[l] }

// Close stops the proxy, the relay and the upstream.
func (st *Stack) Close() error {
	var first error
	for i := len(st.closers) - 1; i >= 0; i-- {
		if err := st.closers[i](); err != nil && first == nil {
			first = err
		}
	}
	st.closers = nil
	return first
}

// dialTo is the proxy's upstream: a plain TCP dial of one address.
type dialTo string

func (a dialTo) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", string(a))
}

type proxyServer struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// startProxy runs a lockgate proxy as cmd/proxy wires it, minus TLS and the
// admin listener: no interceptor (a transparent proxy), metrics collected,
// and an info-level JSON logger whose output is discarded.
func startProxy(upstream string) (*proxyServer, error) {
	logger := zap.New(zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard),
		zap.InfoLevel,
	))
	srv, err := proxy.New(proxy.Options{
		Upstream:      dialTo(upstream),
		Logger:        logger,
		Metrics:       proxy.NewMetrics(),
		ShutdownGrace: 2 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxyServer{addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- srv.Serve(ctx, ln) }()
	return p, nil
}

func (p *proxyServer) close() error {
	p.cancel()
	select {
	case err := <-p.done:
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("bench: proxy did not stop within 10s")
	}
}
