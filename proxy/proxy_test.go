package proxy

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// rsMemberHello is what a replica set primary says about itself.
func rsMemberHello(t *testing.T, me string) bsoncore.Document {
	return mustDoc(t, bson.D{
		{"helloOk", true},
		{"isWritablePrimary", true},
		{"ismaster", true},
		{"topologyVersion", bson.D{{"processId", "x"}, {"counter", int64(3)}}},
		{"hosts", bson.A{me, "10.0.0.2:27017", "10.0.0.3:27017"}},
		{"setName", "rs0"},
		{"setVersion", int32(4)},
		{"primary", me},
		{"me", me},
		{"electionId", "7fffffff0000000000000001"},
		{"lastWrite", bson.D{{"majorityWriteDate", "x"}}},
		{"maxBsonObjectSize", int32(16777216)},
		{"maxMessageSizeBytes", int32(48000000)},
		{"maxWriteBatchSize", int32(100000)},
		{"localTime", time.Now()},
		{"logicalSessionTimeoutMinutes", int32(30)},
		{"connectionId", int32(7)},
		{"minWireVersion", int32(0)},
		{"maxWireVersion", int32(21)},
		{"readOnly", false},
		{"compression", bson.A{"zstd"}},
		{"saslSupportedMechs", bson.A{"SCRAM-SHA-256"}},
		{"ok", 1.0},
	})
}

func rsUpstream(t *testing.T) *scripted.Server {
	return echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && (cmd.Role() == wire.RoleHandshake) {
			return s.Reply(req, rsMemberHello(t, s.Addr()))
		}
		return nil
	})
}

// TestHelloRewriteEveryForm sends each spelling of the handshake, with each
// value type, over OP_QUERY and OP_MSG, and checks that the reply comes back
// in the request's opcode, answers that request, and describes a router
// with the upstream's limits and nothing behind the proxy.
func TestHelloRewriteEveryForm(t *testing.T) {
	up := rsUpstream(t)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
	c := dialRaw(t, p.addr)

	values := []any{int32(1), int64(1), 1.0, true}
	for _, name := range []string{"hello", "isMaster", "ismaster"} {
		for _, v := range values {
			for _, opcode := range []wire.OpCode{wire.OpCodeQuery, wire.OpCodeMsg} {
				var req []byte
				var id int32
				if opcode == wire.OpCodeQuery {
					req, id = c.query("admin.$cmd", bson.D{{name, v}, {"helloOk", true}})
				} else {
					req, id = c.msg(0, bson.D{{name, v}, {"$db", "admin"}})
				}
				c.send(req)
				reply := c.read()
				wantOp := wire.OpCodeReply
				if opcode == wire.OpCodeMsg {
					wantOp = wire.OpCodeMsg
				}
				if got := reply.Header().OpCode; got != wantOp {
					t.Fatalf("%s:%v over %v: reply opcode %v, want %v", name, v, opcode, got, wantOp)
				}
				if got := reply.Header().ResponseTo; got != id {
					t.Fatalf("%s over %v: responseTo %d, want %d", name, opcode, got, id)
				}
				checkRouterHello(t, body(t, reply))
			}
		}
	}
	// A $query-wrapped OP_QUERY, as mongos-era drivers send it.
	req, _ := c.query("admin.$cmd", bson.D{{"$query", bson.D{{"isMaster", 1}}}, {"$readPreference", bson.D{{"mode", "primary"}}}})
	c.send(req)
	checkRouterHello(t, body(t, c.read()))

	if got, want := testutil.ToFloat64(p.metrics.helloRewrites), float64(3*len(values)*2+1); got != want {
		t.Fatalf("lockgate_handshake_rewrites_total = %v, want %v", got, want)
	}
}

func checkRouterHello(t *testing.T, doc bsoncore.Document) {
	t.Helper()
	for _, hidden := range []string{"setName", "setVersion", "hosts", "primary", "me", "electionId", "topologyVersion", "lastWrite"} {
		if _, err := doc.LookupErr(hidden); err == nil {
			t.Errorf("rewritten hello still has %q: %v", hidden, doc)
		}
	}
	if msg, _ := doc.Lookup("msg").StringValueOK(); msg != "isdbgrid" {
		t.Errorf("msg = %q, want isdbgrid", msg)
	}
	for key, want := range map[string]int32{"maxWireVersion": 21, "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000, "logicalSessionTimeoutMinutes": 30} {
		if got, ok := doc.Lookup(key).Int32OK(); !ok || got != want {
			t.Errorf("%s = %v, want %d (kept from the upstream)", key, doc.Lookup(key), want)
		}
	}
	if _, err := doc.LookupErr("saslSupportedMechs"); err != nil {
		t.Errorf("saslSupportedMechs dropped: authentication negotiation must pass through")
	}
	if !isOK(doc) {
		t.Errorf("ok lost: %v", doc)
	}
}

// TestHelloStandalonePassesThrough: a standalone server has no members a
// driver could discover, so its handshake reply reaches the client byte for
// byte, over OP_MSG and OP_QUERY alike; a router's reply is still made the
// proxy's own (its members stay hidden). Masquerading a standalone as
// mongos changed what drivers do (issue 9: exhaust cursors off, router
// code paths on).
func TestHelloStandalonePassesThrough(t *testing.T) {
	standaloneHello := mustDoc(t, bson.D{
		{"helloOk", true}, {"isWritablePrimary", true},
		{"topologyVersion", bson.D{{"processId", "x"}, {"counter", int64(0)}}},
		{"maxBsonObjectSize", int32(16777216)}, {"maxMessageSizeBytes", int32(48000000)},
		{"maxWriteBatchSize", int32(100000)}, {"minWireVersion", int32(0)}, {"maxWireVersion", int32(21)},
		{"ok", 1.0},
	})
	routerHello := mustDoc(t, bson.D{
		{"ismaster", true}, {"msg", "isdbgrid"}, {"me", "router-1:27017"},
		{"maxWireVersion", int32(21)}, {"ok", 1.0},
	})
	for _, tc := range []struct {
		name    string
		reply   bsoncore.Document
		rewrite bool
	}{
		{"standalone", standaloneHello, false},
		{"router", routerHello, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
				if cmd != nil && (cmd.Role() == wire.RoleHandshake) {
					return s.Reply(req, tc.reply)
				}
				return nil
			})
			p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
			c := dialRaw(t, p.addr)
			for _, opcode := range []wire.OpCode{wire.OpCodeMsg, wire.OpCodeQuery} {
				var req []byte
				if opcode == wire.OpCodeQuery {
					req, _ = c.query("admin.$cmd", bson.D{{"isMaster", 1}})
				} else {
					req, _ = c.msg(0, bson.D{{"hello", 1}, {"$db", "admin"}})
				}
				c.send(req)
				got := body(t, c.read())
				if !tc.rewrite {
					if string(got) != string(tc.reply) {
						t.Errorf("over %v: the standalone's reply changed through the proxy:\n got  %v\n want %v", opcode, got, tc.reply)
					}
					continue
				}
				if _, err := got.LookupErr("me"); err == nil {
					t.Errorf("over %v: the router's reply still names its host: %v", opcode, got)
				}
				if msg, _ := got.Lookup("msg").StringValueOK(); msg != "isdbgrid" {
					t.Errorf("over %v: msg = %q, want isdbgrid", opcode, msg)
				}
			}
			want := 0.0
			if tc.rewrite {
				want = 2
			}
			if got := testutil.ToFloat64(p.metrics.helloRewrites); got != want {
				t.Errorf("lockgate_handshake_rewrites_total = %v, want %v", got, want)
			}
		})
	}
}

// TestHelloErrorReplyPassesThrough: an upstream that refuses the handshake
// has nothing to hide; its reply reaches the client unchanged.
func TestHelloErrorReplyPassesThrough(t *testing.T) {
	errDoc := (&mongoerr.Error{Code: mongoerr.AuthenticationFailed, Msg: "no"}).Document()
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		return s.Reply(req, errDoc)
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
	c := dialRaw(t, p.addr)
	req, _ := c.msg(0, bson.D{{"hello", 1}, {"$db", "admin"}})
	c.send(req)
	if got := body(t, c.read()); string(got) != string(errDoc) {
		t.Fatalf("error reply changed: %v", got)
	}
}

// TestStreamedHelloRepliesAreRewritten: a client that asks for an exhaust
// hello gets every streamed reply rewritten, not just the first.
func TestStreamedHelloRepliesAreRewritten(t *testing.T) {
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil || !(cmd.Role() == wire.RoleHandshake) {
			return nil
		}
		doc := rsMemberHello(t, s.Addr())
		first := s.NextID()
		second := s.NextID()
		return [][]byte{
			wire.AppendMsg(nil, first, req.Header().RequestID, wire.MoreToCome, doc),
			wire.AppendMsg(nil, second, first, wire.MoreToCome, doc),
			wire.AppendMsg(nil, s.NextID(), second, 0, doc),
		}
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
	c := dialRaw(t, p.addr)
	req, _ := c.msg(wire.ExhaustAllowed, bson.D{{"hello", 1}, {"topologyVersion", bson.D{}}, {"maxAwaitTimeMS", 10}, {"$db", "admin"}})
	c.send(req)
	for i := 0; i < 3; i++ {
		checkRouterHello(t, body(t, c.read()))
	}
}

// recordingInterceptor answers, rewrites or closes by command name.
type recordingInterceptor struct {
	t *testing.T
}

func (ic recordingInterceptor) Intercept(ctx context.Context, req *Request) Decision {
	if req.Command == nil {
		return Decision{Action: Forward}
	}
	switch req.Command.Name {
	case "answerMe":
		return Decision{Action: Reply, Reply: mustDoc(ic.t, bson.D{{"ok", 1.0}, {"answeredBy", "proxy"}, {"app", req.Client.AppName()}})}
	case "refuseMe":
		return Decision{Action: Reply, Reply: (&mongoerr.Error{Code: mongoerr.LockBusy, Msg: "refused by the test"}).Document()}
	case "rewriteMe":
		b, err := wire.WithBody(req.Message, mustDoc(ic.t, bson.D{{"rewritten", 1}, {"$db", req.Command.DB}}))
		if err != nil {
			ic.t.Errorf("WithBody: %v", err)
		}
		return Decision{Action: Rewrite, Message: b}
	case "closeMe":
		return Decision{Action: Close, Reason: "test asked"}
	}
	return Decision{Action: Forward}
}

func TestInterceptorDecisions(t *testing.T) {
	up := echoUpstream(t, nil)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: recordingInterceptor{t}})
	c := dialRaw(t, p.addr)

	hello, _ := c.msg(0, bson.D{{"hello", 1}, {"client", bson.D{{"application", bson.D{{"name", "billing"}}}}}, {"$db", "admin"}})
	c.send(hello)
	c.read()

	// Reply: answered by the proxy, in the request's opcode, never forwarded.
	req, id := c.msg(0, bson.D{{"answerMe", 1}, {"$db", "test"}})
	c.send(req)
	r := c.read()
	if r.Header().ResponseTo != id {
		t.Fatalf("responseTo %d, want %d", r.Header().ResponseTo, id)
	}
	if by, _ := body(t, r).Lookup("answeredBy").StringValueOK(); by != "proxy" {
		t.Fatalf("not answered by the proxy: %v", body(t, r))
	}
	if app, _ := body(t, r).Lookup("app").StringValueOK(); app != "billing" {
		t.Fatalf("client app name from the handshake = %q, want billing", app)
	}
	// The same over OP_QUERY gets an OP_REPLY.
	q, qid := c.query("test.$cmd", bson.D{{"refuseMe", 1}})
	c.send(q)
	r = c.read()
	if r.Header().OpCode != wire.OpCodeReply || r.Header().ResponseTo != qid {
		t.Fatalf("legacy command answered with %v responseTo %d", r.Header().OpCode, r.Header().ResponseTo)
	}
	if code, _ := body(t, r).Lookup("code").Int32OK(); code != 46 {
		t.Fatalf("error reply: %v", body(t, r))
	}

	// Rewrite: the upstream runs the rewritten command, the client gets
	// the upstream's reply to its own request.
	req, id = c.msg(0, bson.D{{"rewriteMe", 1}, {"$db", "test"}})
	c.send(req)
	r = c.read()
	if r.Header().ResponseTo != id {
		t.Fatalf("rewritten request: responseTo %d, want %d", r.Header().ResponseTo, id)
	}
	if got, _ := body(t, r).Lookup("cmd").StringValueOK(); got != "rewritten" {
		t.Fatalf("upstream ran %q, want the rewritten command", got)
	}

	// A refused fire-and-forget request closes the connection, unanswered.
	req, _ = c.msg(wire.MoreToCome, bson.D{{"refuseMe", 1}, {"$db", "test"}})
	c.send(req)
	c.expectClosed()
	if got := p.errorCount(errUnackRejected); got != 1 {
		t.Fatalf("unack_rejected errors = %v, want 1", got)
	}

	// Close: the connection ends.
	c2 := dialRaw(t, p.addr)
	req, _ = c2.msg(0, bson.D{{"closeMe", 1}, {"$db", "test"}})
	c2.send(req)
	c2.expectClosed()

	got := strings.Join(receivedCommands(t, up), ",")
	if want := "hello,rewritten"; got != want {
		t.Fatalf("upstream received %s, want %s", got, want)
	}
}

// TestFireAndForgetIsNeverAnswered: a moreToCome request is forwarded and
// the proxy writes nothing back for it.
func TestFireAndForgetIsNeverAnswered(t *testing.T) {
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.MoreToCome {
			return [][]byte{} // mongod sends nothing
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: recordingInterceptor{t}})
	c := dialRaw(t, p.addr)
	req, _ := c.msg(wire.MoreToCome, bson.D{{"insert", "c"}, {"documents", bson.A{bson.D{{"_id", 1}}}}, {"$db", "test"}})
	c.send(req)
	// Accepted by the interceptor with ok:1: still no reply.
	req, _ = c.msg(wire.MoreToCome, bson.D{{"answerMe", 1}, {"$db", "test"}})
	c.send(req)
	ping, id := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	c.send(ping)
	if r := c.read(); r.Header().ResponseTo != id {
		t.Fatalf("first message back answers %d, want the ping %d", r.Header().ResponseTo, id)
	}
	if got := strings.Join(receivedCommands(t, up), ","); got != "insert,ping" {
		t.Fatalf("upstream received %s", got)
	}
}

// TestMalformedClosesOnlyThatConnection: each kind of bad input ends its
// own connection with a counted, logged reason; a healthy connection opened
// before them keeps working.
func TestMalformedClosesOnlyThatConnection(t *testing.T) {
	up := echoUpstream(t, nil)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), MaxMessageSize: 1 << 20})
	healthy := dialRaw(t, p.addr)

	header := func(length int32, op wire.OpCode) []byte {
		return wire.Header{MessageLength: length, RequestID: 1, OpCode: op}.Append(nil)
	}
	goodMsg, _ := healthy.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	badKind := append([]byte(nil), goodMsg...)
	badKind[wire.HeaderSize+4] = 7 // section kind 7
	dupDB, _ := healthy.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}, {"$db", "other"}})
	noDB, _ := healthy.msg(0, bson.D{{"ping", 1}})

	cases := []struct {
		name string
		in   []byte
		kind string
	}{
		{"length under 16", header(8, wire.OpCodeMsg), errMalformed},
		{"negative length", header(-5, wire.OpCodeMsg), errMalformed},
		{"length over the limit", header(2<<20, wire.OpCodeMsg), errTooLarge},
		{"unknown section kind", badKind, errMalformed},
		{"duplicate $db", dupDB, errMalformed},
		{"OP_MSG without $db", noDB, errMalformed},
		{"invalid BSON", append(header(int32(wire.HeaderSize+4+1+5), wire.OpCodeMsg), 0, 0, 0, 0, 0, 9, 0, 0, 0, 0), errMalformed},
		{"unknown opcode", append(header(wire.HeaderSize+8, 4242), 1, 2, 3, 4, 5, 6, 7, 8), errMalformed},
		{"OP_RESERVED", append(header(wire.HeaderSize+8, wire.OpCodeReserved), 1, 2, 3, 4, 5, 6, 7, 8), errMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := p.errorCount(tc.kind)
			c := dialRaw(t, p.addr)
			c.send(tc.in)
			c.expectClosed()
			if got := p.errorCount(tc.kind); got != before+1 {
				t.Fatalf("%s errors = %v, want %v", tc.kind, got, before+1)
			}
		})
	}
	if n := p.logs.FilterMessageSnippet("closing client connection").Len(); n < len(cases) {
		t.Fatalf("%d close reasons logged, want at least %d", n, len(cases))
	}
	healthy.send(goodMsg)
	if r := healthy.read(); !isOK(body(t, r)) {
		t.Fatalf("healthy connection broken: %v", body(t, r))
	}
	for _, name := range receivedCommands(t, up) {
		if name != "ping" {
			t.Fatalf("a malformed request reached the upstream as %q", name)
		}
	}
}

// TestSlowClientIsCutOff: a message trickled slower than MessageTimeout
// closes its connection; an idle connection is left alone.
func TestSlowClientIsCutOff(t *testing.T) {
	up := echoUpstream(t, nil)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), MessageTimeout: 300 * time.Millisecond})
	idle := dialRaw(t, p.addr)
	slow := dialRaw(t, p.addr)
	req, _ := slow.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	slow.send(req[:5])
	start := time.Now()
	slow.expectClosed()
	if waited := time.Since(start); waited > 4*time.Second {
		t.Fatalf("slow client closed only after %v", waited)
	}
	// The idle connection was opened before the slow one's message began,
	// so it has been idle for longer than MessageTimeout once the cut is
	// counted.
	testkit.Eventually(t, 10*time.Second, "the cut to be counted", func() bool { return p.errorCount(errSlowClient) >= 1 })
	req, _ = idle.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	idle.send(req)
	if r := idle.read(); !isOK(body(t, r)) {
		t.Fatalf("idle connection was closed or broken")
	}
}

// TestGracefulShutdownFinishesInFlight: cancelling Serve lets a request
// already forwarded get its reply, then closes the connection.
func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	release := make(chan struct{})
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.Name == "slow" {
			<-release
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), ShutdownGrace: 5 * time.Second})
	c := dialRaw(t, p.addr)
	req, id := c.msg(0, bson.D{{"slow", 1}, {"$db", "admin"}})
	c.send(req)
	testkit.Eventually(t, 10*time.Second, "the slow request to reach the upstream", func() bool { return len(up.Requests()) == 1 })

	p.cancel()
	testkit.Eventually(t, 10*time.Second, "the shutdown to close the listener", func() bool {
		c, err := net.Dial("tcp", p.addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(release)
	r := c.read()
	if r.Header().ResponseTo != id || !isOK(body(t, r)) {
		t.Fatalf("in-flight request lost in shutdown: %v", body(t, r))
	}
	c.expectClosed()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatal(err)
		}
		p.done <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
}

// TestShutdownGraceBoundsTheWait: a request that never gets its reply does
// not hold shutdown past the grace period.
func TestShutdownGraceBoundsTheWait(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.Name == "never" {
			<-block
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), ShutdownGrace: 200 * time.Millisecond})
	c := dialRaw(t, p.addr)
	req, _ := c.msg(0, bson.D{{"never", 1}, {"$db", "admin"}})
	c.send(req)
	testkit.Eventually(t, 10*time.Second, "the request to reach the upstream", func() bool { return len(up.Requests()) == 1 })
	start := time.Now()
	p.cancel()
	select {
	case <-p.done:
		p.done <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("Serve ignored the grace period")
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("Serve returned after %v, before the grace period", waited)
	}
	c.expectClosed()
}

// TestCompressedRequestIsInspected: the interceptor sees the command inside
// OP_COMPRESSED, and the original compressed bytes are what is forwarded.
func TestCompressedRequestIsInspected(t *testing.T) {
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if _, ok := req.(*wire.OpCompressed); !ok {
			t.Errorf("upstream got %v, want the client's OP_COMPRESSED", req.Header().OpCode)
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: recordingInterceptor{t}})
	c := dialRaw(t, p.addr)
	for _, comp := range []wire.Compressor{wire.CompressorNoop, wire.CompressorSnappy, wire.CompressorZlib, wire.CompressorZstd} {
		plain, id := c.msg(0, bson.D{{"answerMe", 1}, {"$db", "test"}})
		packed, err := wire.AppendCompressed(nil, plain, comp)
		if err != nil {
			t.Fatal(err)
		}
		c.send(packed)
		r := c.read()
		if by, _ := body(t, r).Lookup("answeredBy").StringValueOK(); by != "proxy" || r.Header().ResponseTo != id {
			t.Fatalf("%v: compressed command not seen by the interceptor: %v", comp, body(t, r))
		}
		plain, _ = c.msg(0, bson.D{{"ping", 1}, {"$db", "test"}})
		packed, _ = wire.AppendCompressed(nil, plain, comp)
		c.send(packed)
		if r := c.read(); !isOK(body(t, r)) {
			t.Fatalf("%v: compressed ping failed", comp)
		}
	}
	// A compressed message whose declared size lies closes the connection.
	plain, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "test"}})
	packed, _ := wire.AppendCompressed(nil, plain, wire.CompressorSnappy)
	binary.LittleEndian.PutUint32(packed[wire.HeaderSize+4:], uint32(len(plain))) // declared size off by 16
	c.send(packed)
	c.expectClosed()
}

// TestClientThatNeverReadsIsCut: replies pile up behind a client that does
// not read them; once a write has been stuck longer than WriteTimeout the
// connection closes, and other clients are unaffected.
func TestClientThatNeverReadsIsCut(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.Name == "big" {
			return s.Reply(req, mustDoc(t, bson.D{{"ok", 1.0}, {"blob", big}}))
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), WriteTimeout: 300 * time.Millisecond})
	deaf := dialRaw(t, p.addr)
	for i := 0; i < 64; i++ {
		req, _ := deaf.msg(0, bson.D{{"big", 1}, {"$db", "admin"}})
		if _, err := deaf.conn.Write(req); err != nil {
			break // the proxy already gave up on us
		}
	}
	testkit.Eventually(t, 10*time.Second, "the deaf client to be cut off", func() bool { return p.errorCount(errSlowClient) >= 1 })
	other := dialRaw(t, p.addr)
	req, _ := other.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	other.send(req)
	if r := other.read(); !isOK(body(t, r)) {
		t.Fatalf("another client was affected")
	}
}

// TestUpstreamReplyToFireAndForgetIsDropped: an upstream that answers a
// moreToCome request (FerretDB v1.24 does) must not make the client take
// that answer for the reply to its next request.
func TestUpstreamReplyToFireAndForgetIsDropped(t *testing.T) {
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.MoreToCome {
			// Answer anyway, as a buggy server does.
			return [][]byte{wire.AppendMsg(nil, s.NextID(), req.Header().RequestID, 0, mustDoc(t, bson.D{{"ok", 1.0}, {"stray", true}}))}
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
	c := dialRaw(t, p.addr)
	w0, _ := c.msg(wire.MoreToCome, bson.D{{"insert", "c"}, {"documents", bson.A{bson.D{{"_id", 1}}}}, {"$db", "test"}})
	ping, id := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	c.send(append(w0, ping...))
	if r := c.read(); r.Header().ResponseTo != id {
		t.Fatalf("first reply answers %d, want the ping %d: the stray reply got through", r.Header().ResponseTo, id)
	}
	if got := testutilCount(p.metrics.droppedReplies); got != 1 {
		t.Fatalf("dropped replies = %v, want 1", got)
	}
}

// TestGoodRequestBeforeGarbageIsAnswered: the reply to a request forwarded
// before a malformed one still reaches the client before the connection
// closes, as mongod, answering in order, would send it.
func TestGoodRequestBeforeGarbageIsAnswered(t *testing.T) {
	// The upstream answers only once the proxy has read the garbage.
	garbageRead := make(chan struct{})
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		<-garbageRead
		return nil
	})
	release := sync.OnceFunc(func() { close(garbageRead) })
	t.Cleanup(release) // before the upstream stops, should the test end early
	p := startProxy(t, Options{Upstream: dialTo(up.Addr())})
	c := dialRaw(t, p.addr)
	ping, id := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	garbage := wire.Header{MessageLength: 8, OpCode: wire.OpCodeMsg}.Append(nil)
	c.send(append(ping, garbage...))
	testkit.Eventually(t, 10*time.Second, "the proxy to read the garbage", func() bool { return p.errorCount(errMalformed) > 0 })
	release()
	if r := c.read(); r.Header().ResponseTo != id || !isOK(body(t, r)) {
		t.Fatalf("reply to the good request lost: %v", body(t, r))
	}
	c.expectClosed()
}
