package proxy

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// writeWatch is an upstream connection that tells when each message it
// was given has been written: the last requestID whose Write returned.
type writeWatch struct {
	net.Conn
	mu      sync.Mutex
	written map[int32]bool
}

func (w *writeWatch) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if len(b) >= 16 {
		h, _ := wire.ParseHeader(b)
		w.mu.Lock()
		w.written[h.RequestID] = true
		w.mu.Unlock()
	}
	return n, err
}

func (w *writeWatch) wasWritten(id int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written[id]
}

// bufferInterceptor rewrites every request into one buffer it reuses,
// which the proxy must hand back (MessageDone) after writing it and
// before the connection's next request is decided.
type bufferInterceptor struct {
	t     *testing.T
	watch func() *writeWatch
	mu    sync.Mutex
	buf   []byte
	out   bool  // the proxy has the buffer
	id    int32 // the requestID of the message in it
	fails []string
}

func (b *bufferInterceptor) fail(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails = append(b.fails, fmt.Sprintf(format, args...))
}

func (b *bufferInterceptor) Intercept(_ context.Context, req *Request) Decision {
	if req.Command == nil || req.Command.Name != "count" {
		return Decision{Action: Forward}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.out {
		b.fails = append(b.fails, fmt.Sprintf("request %d decided while the message of %d was not handed back", req.Message.Header().RequestID, b.id))
		return Decision{Action: Forward}
	}
	n, _ := req.Command.Body.Lookup("count").AsInt64OK()
	body := bsoncore.NewDocumentBuilder().AppendString("rewritten", fmt.Sprint(n)).AppendString("$db", "test").Build()
	b.buf = wire.AppendMsg(b.buf[:0], req.Message.Header().RequestID, 0, 0, body)
	b.out, b.id = true, req.Message.Header().RequestID
	return Decision{Action: Rewrite, Message: b.buf, MessageDone: b}
}

func (b *bufferInterceptor) ReleaseMessage(m []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.out || &m[0] != &b.buf[0] {
		b.fails = append(b.fails, "handed back a message it does not have")
		return
	}
	if w := b.watch(); w == nil || !w.wasWritten(b.id) {
		b.fails = append(b.fails, fmt.Sprintf("the message of %d handed back before it was written", b.id))
	}
	// Scribbled over at once, as the next request's encoding would: any
	// later read of it would send garbage upstream.
	for i := range b.buf {
		b.buf[i] = 0xff
	}
	b.out = false
}

// TestRewrittenMessageHandedBackAfterWrite: a rewritten message whose
// decision names a MessageDone is handed back only after the upstream
// write of it returned, and before the connection's next request is
// decided, so an interceptor may encode every request of a connection
// into one buffer: with 50 requests pipelined (sent without waiting for
// replies), the upstream receives each rewrite intact and in order. Run
// it with -race.
func TestRewrittenMessageHandedBackAfterWrite(t *testing.T) {
	up := echoUpstream(t, nil)
	var mu sync.Mutex
	var watch *writeWatch
	dial := dialFunc(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", up.Addr())
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		watch = &writeWatch{Conn: c, written: map[int32]bool{}}
		return watch, nil
	})
	ic := &bufferInterceptor{t: t, watch: func() *writeWatch { mu.Lock(); defer mu.Unlock(); return watch }}
	p := startProxy(t, Options{Upstream: dial, Interceptor: ic})
	c := dialRaw(t, p.addr)
	const n = 50
	ids := make([]int32, n)
	var batch []byte
	for i := range n {
		req, id := c.msg(0, bson.D{{"count", int64(i)}, {"$db", "test"}})
		batch, ids[i] = append(batch, req...), id
	}
	c.send(batch)
	for i := range n {
		r := c.read()
		if r.Header().ResponseTo != ids[i] {
			t.Fatalf("reply %d answers %d, want %d", i, r.Header().ResponseTo, ids[i])
		}
		if got, _ := body(t, r).Lookup("cmd").StringValueOK(); got != "rewritten" {
			t.Fatalf("reply %d: upstream ran %q", i, got)
		}
	}
	ic.mu.Lock()
	fails := ic.fails
	ic.mu.Unlock()
	for _, f := range fails {
		t.Error(f)
	}
	var got []string
	for _, b := range up.Requests() {
		m, err := wire.Parse(b, wire.Limits{})
		if err != nil {
			t.Fatalf("upstream received a broken message: %v", err)
		}
		if cmd, _ := wire.CommandOf(m); cmd != nil {
			v, _ := cmd.Body.Lookup("rewritten").StringValueOK()
			got = append(got, v)
		}
	}
	if len(got) != n {
		t.Fatalf("upstream received %d rewrites, want %d", len(got), n)
	}
	for i, v := range got {
		if v != fmt.Sprint(i) {
			t.Fatalf("rewrite %d carried %q", i, v)
		}
	}
}
