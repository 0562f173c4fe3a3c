package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// dialFunc adapts a function to Dialer.
type dialFunc func(ctx context.Context) (net.Conn, error)

func (f dialFunc) Dial(ctx context.Context) (net.Conn, error) { return f(ctx) }

func dialTo(addr string) Dialer {
	return dialFunc(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
}

// testProxy is a proxy server running for one test.
type testProxy struct {
	addr    string
	metrics *Metrics
	logs    *observer.ObservedLogs
	cancel  context.CancelFunc
	done    chan error
}

func startProxy(t *testing.T, opts Options) *testProxy {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	opts.Logger = zap.New(core)
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 2 * time.Second
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &testProxy{addr: ln.Addr().String(), metrics: opts.Metrics, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *testProxy) stop(t *testing.T) {
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		p.done <- nil // later stops return at once
	case <-time.After(10 * time.Second):
		t.Errorf("Serve did not return within 10s of cancellation")
	}
}

func (p *testProxy) errorCount(kind string) float64 {
	return testutil.ToFloat64(p.metrics.errorsVec.WithLabelValues(kind))
}

// rawClient speaks the wire protocol by hand, for the forms drivers do not
// send and for checking exact bytes.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
	pool *wire.BufferPool
	mu   sync.Mutex
	id   int32
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, conn: c, r: bufio.NewReader(c), pool: wire.NewBufferPool(), id: 100}
}

func (c *rawClient) nextID() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.id++
	return c.id
}

func (c *rawClient) send(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read returns the next message, or fails the test after 5s.
func (c *rawClient) read() wire.Message {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, err := wire.ReadMessage(c.r, c.pool, wire.Limits{})
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	b := append([]byte(nil), raw.Bytes...)
	raw.Release()
	m, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		c.t.Fatalf("parse reply: %v", err)
	}
	return m
}

// expectClosed asserts the proxy closes the connection within 5s without
// sending anything.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := c.r.ReadByte()
	if err == nil {
		c.t.Fatalf("connection still open: read byte %#x", b)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.t.Fatalf("connection still open after 5s")
	}
}

// msg builds an OP_MSG command from a bson.D.
func (c *rawClient) msg(flags wire.MsgFlags, cmd bson.D) ([]byte, int32) {
	c.t.Helper()
	id := c.nextID()
	return wire.AppendMsg(nil, id, 0, flags, mustDoc(c.t, cmd)), id
}

// query builds an OP_QUERY on ns by hand.
func (c *rawClient) query(ns string, q bson.D) ([]byte, int32) {
	c.t.Helper()
	id := c.nextID()
	return appendQuery(id, ns, mustDoc(c.t, q)), id
}

func appendQuery(id int32, ns string, q []byte) []byte {
	b := wire.Header{RequestID: id, OpCode: wire.OpCodeQuery}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(b, ns...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)          // numberToSkip
	b = binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF) // numberToReturn -1
	b = append(b, q...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// body returns the command or reply document of a message.
func body(t *testing.T, m wire.Message) bsoncore.Document {
	t.Helper()
	switch m := m.(type) {
	case *wire.OpMsg:
		return m.Body
	case *wire.OpReply:
		if len(m.Documents) != 1 {
			t.Fatalf("OP_REPLY with %d documents", len(m.Documents))
		}
		return m.Documents[0]
	}
	t.Fatalf("unexpected reply opcode %v", m.Header().OpCode)
	return nil
}

// echoUpstream answers every command with {ok:1, cmd: <name>, served: addr}
// and records what it received.
func echoUpstream(t *testing.T, extra func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte) *scripted.Server {
	t.Helper()
	s, err := scripted.Start(func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if extra != nil {
			if r := extra(s, req, cmd); r != nil {
				return r
			}
		}
		if cmd == nil {
			return nil
		}
		return s.Reply(req, mustDoc(t, bson.D{{"ok", 1.0}, {"cmd", cmd.Name}, {"served", s.Addr()}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// receivedCommands lists the command names a scripted upstream received.
func receivedCommands(t *testing.T, s *scripted.Server) []string {
	t.Helper()
	var names []string
	for _, b := range s.Requests() {
		m, err := wire.Parse(b, wire.Limits{})
		if err != nil {
			t.Fatalf("upstream received a malformed message: %v", err)
		}
		if cmd, _ := wire.CommandOf(m); cmd != nil {
			names = append(names, cmd.Name)
		}
	}
	return names
}

func testutilCount(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
