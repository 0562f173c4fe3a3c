package guard

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// blockingSink is a decision log whose next line, once armed, blocks
// until released: a full pipe, a stalled disk.
type blockingSink struct {
	armed   chan struct{} // a value: block the next line
	entered chan time.Time
	release chan struct{}
}

func (s *blockingSink) Write(p []byte) (int, error) {
	select {
	case <-s.armed:
		s.entered <- time.Now()
		<-s.release
	default:
	}
	return len(p), nil
}

func (s *blockingSink) Sync() error { return nil }

// sentMaxTimeMS is the maxTimeMS of the message the proxy would send.
func sentMaxTimeMS(t *testing.T, b []byte) int64 {
	t.Helper()
	sent, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	scmd, err := wire.CommandOf(sent)
	if err != nil {
		t.Fatal(err)
	}
	ms, ok := scmd.Body.Lookup("maxTimeMS").AsInt64OK()
	if !ok {
		t.Fatalf("no maxTimeMS in %s", scmd.Body)
	}
	return ms
}

// TestBlockingDecisionLineCannotStretchALease: an allowed write's
// decision line is written after its lock check, to a sink that can block
// for any time (a full pipe, a stalled disk). Whenever the write can
// still leave (the proxy's check, Decision.Leave, passed at the moment it
// would send the bytes), it must carry a maxTimeMS that ends its run
// before its lease less the margin, counted from that moment: the proxy
// sets the cap from its own reading just before the bytes leave, so
// nothing between the guard's reading and the send (the line, the edit, a
// pause of the process) is left to the margin (docs/ENFORCEMENT.md,
// "maxTimeMS").
func TestBlockingDecisionLineCannotStretchALease(t *testing.T) {
	c := newConnTest(t)
	sink := &blockingSink{armed: make(chan struct{}, 1), entered: make(chan time.Time, 1), release: make(chan struct{})}
	c.g = New(Options{Store: c.store, Logger: zap.NewNop(),
		DecisionSink: &LineSink{Out: zapcore.Lock(sink), Level: zapcore.InfoLevel}})
	pol := c.g0Policy(t)
	c.g.SetPolicy(pol)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	ns := namespace.Of("db.locked")
	// What the write may not run past.
	limit := leaseLimit(t, c.store, ns, 7, pol.Lookup(ns).LeaseMargin)

	msg, cmd := updateOfSeven(t, a)
	// write decides the write as the proxy does and reports whether it
	// would leave, checking what it would run under if so.
	write := func(block time.Duration) (left bool, late bsoncore.Document) {
		t.Helper()
		if block > 0 {
			sink.armed <- struct{}{}
		}
		req := &proxy.Request{Message: msg, Command: cmd, Client: c.client}
		done := make(chan proxy.Decision, 1)
		go func() { done <- c.g.Intercept(context.Background(), req) }()
		if block > 0 {
			entered := <-sink.entered
			// The line's write is under way; let the time pass.
			<-time.After(time.Until(entered.Add(block)))
			sink.release <- struct{}{}
		}
		d := <-done
		if d.Action != proxy.Rewrite || d.Deadline.IsZero() || !d.MaxTime.Located() {
			t.Fatalf("the holder's write: %+v %s", d, d.Reply)
		}
		// The proxy's check, immediately before the bytes leave: the
		// write's run is counted from this reading.
		leaving := time.Now()
		if !d.Leave(d.Message, leaving) {
			late = d.LateReply.LateReply()
			d.OnReply.Reply(context.Background(), nil)
			return false, late
		}
		ms := sentMaxTimeMS(t, d.Message)
		if end := leaving.Add(time.Duration(ms) * time.Millisecond); end.After(limit) {
			t.Fatalf("the write left with maxTimeMS %d: counted from when it left, it may run until %s, past its lease less the margin (%s) by %s",
				ms, end.Format(time.RFC3339Nano), limit.Format(time.RFC3339Nano), end.Sub(limit))
		}
		d.MessageDone.ReleaseMessage(d.Message)
		d.OnReply.Reply(context.Background(), nil)
		return true, nil
	}
	for range 3 {
		write(0) // unblocked: leaves (or, descheduled past the bound, is refused), always inside the lease
	}
	refused := 0
	for _, block := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond} {
		if left, _ := write(block); !left {
			refused++ // refused rather than let run past its lease: allowed
		}
	}
	write(0)
	t.Logf("%d of the 2 writes whose line blocked were refused", refused)
}

// TestSubMillisecondBudgetIsLate: with no lease margin, a write that
// would leave less than a millisecond before its lease ends may not leave
// with maxTimeMS 1 (the least a server takes), which would let it run up
// to a millisecond past the lease, when another session may hold the
// lock: it is refused as late, by the guard or at the proxy's check just
// before the bytes leave (Decision.Leave). The decision line is held
// until the lease has 0.2–0.8 ms left.
func TestSubMillisecondBudgetIsLate(t *testing.T) {
	c := newConnTest(t)
	sink := &blockingSink{armed: make(chan struct{}, 1), entered: make(chan time.Time, 1), release: make(chan struct{})}
	c.g = New(Options{Store: c.store, Logger: zap.NewNop(),
		DecisionSink: &LineSink{Out: zapcore.Lock(sink), Level: zapcore.InfoLevel}})
	pol := c.g0Policy(t)
	if m := pol.Lookup(namespace.Of("db.locked")).LeaseMargin; m != 0 {
		t.Fatalf("the policy's lease margin is %v; the test needs none", m)
	}
	c.g.SetPolicy(pol)
	ns := namespace.Of("db.locked")
	overran := 0
	for i, left := range []time.Duration{800 * time.Microsecond, 500 * time.Microsecond, 200 * time.Microsecond} {
		a := lsidOf(byte(10 + i))
		// A short lease, so that the line is held for about a second.
		d := c.do(bsoncore.NewDocumentBuilder().AppendString(cmdAcquire, "locked").
			AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", 1000).
			AppendDocument("lsid", a).AppendString("$db", "db").Build())
		if ok, _ := d.Reply.Lookup("ok").AsInt64OK(); ok != 1 {
			t.Fatalf("acquire: %s", d.Reply)
		}
		limit := leaseLimit(t, c.store, ns, 7, 0)
		msg, cmd := updateOfSeven(t, a)
		sink.armed <- struct{}{}
		done := make(chan proxy.Decision, 1)
		go func() {
			done <- c.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: c.client})
		}()
		<-sink.entered
		<-time.After(time.Until(limit.Add(-left)))
		sink.release <- struct{}{}
		d = <-done
		leaving := time.Now()
		if (d.Action == proxy.Rewrite || d.Action == proxy.Forward) && d.Leave(d.Message, leaving) {
			ms := sentMaxTimeMS(t, d.Message)
			if end := leaving.Add(time.Duration(ms) * time.Millisecond); ms <= 0 || end.After(limit) {
				overran++
				t.Errorf("with %v of its lease left at the line's end, the write left with maxTimeMS %d: it may run %v past its lease", left, ms, end.Sub(limit))
			}
			d.MessageDone.ReleaseMessage(d.Message)
		}
		if d.Action != proxy.Reply && d.LateReply != nil {
			// Refused where the proxy refuses it, just before it leaves.
			d = proxy.Decision{Action: proxy.Reply, Reply: d.LateReply.LateReply(), OnReply: d.OnReply}
		}
		if d.OnReply != nil {
			d.OnReply.Reply(context.Background(), nil)
		}
		// Under a millisecond left, or none: refused, with the reason.
		if ok, _ := d.Reply.Lookup("ok").AsInt64OK(); d.Action != proxy.Reply || ok != 0 || !bytes.Contains(d.Reply, []byte("leaseMarginMS")) {
			t.Errorf("with %v of its lease left at the line's end: action %v, reply %s; want the late refusal", left, d.Action, d.Reply)
		}
		c.lockCmd(cmdRelease, a, 7)
	}
	t.Logf("%d of 3 writes could overrun", overran)
}

// pausingInterceptor is the guard with a pause, once armed, between its
// decision and the proxy's send: the process descheduled, a slow stage
// after enforcement.
type pausingInterceptor struct {
	g       *Guard
	armed   chan struct{} // a value: pause the next update
	paused  chan proxy.Action
	release chan struct{}
}

func (p *pausingInterceptor) Intercept(ctx context.Context, req *proxy.Request) proxy.Decision {
	d := p.g.Intercept(ctx, req)
	if req.Command != nil && req.Command.Name == "update" {
		select {
		case <-p.armed:
			p.paused <- d.Action
			<-p.release
		default:
		}
	}
	return d
}

// TestPauseBeforeSendCannotStretchALease: through the proxy, a pause of 5
// or 50 ms between the guard's decision and the send may not let the
// write run past its lease less the margin: the maxTimeMS the upstream
// receives, counted from the end of the pause (before the bytes left),
// ends no later than that. Before the proxy set the cap at the send, the
// guard's cap counted from its decision and the write could run past the
// lease by the whole pause. A client's own maxTimeMS, smaller than the
// cap when decided (the client's bytes forwarded), is lowered in place
// too when a pause of 400 ms has left less than it.
func TestPauseBeforeSendCannotStretchALease(t *testing.T) {
	c := newConnTest(t)
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, LeaseMarginMS: 200,
		Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	c.g.SetPolicy(pol)
	ns := namespace.Of("db.locked")
	margin := pol.Lookup(ns).LeaseMargin
	if margin != 200*time.Millisecond {
		t.Fatalf("margin %v", margin)
	}
	type arrival struct {
		at time.Time
		ms int64
	}
	arrived := make(chan arrival, 1)
	up, err := scripted.Start(func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		at := time.Now()
		if cmd != nil && cmd.Name == "update" {
			ms, _ := cmd.Body.Lookup("maxTimeMS").AsInt64OK()
			arrived <- arrival{at, ms}
			return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", 1).AppendInt32("nModified", 1).AppendDouble("ok", 1).Build())
		}
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build())
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	pi := &pausingInterceptor{g: c.g, armed: make(chan struct{}, 1), paused: make(chan proxy.Action), release: make(chan struct{})}
	srv, err := proxy.New(proxy.Options{Upstream: dialAddr(up.Addr()), Interceptor: pi, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { srv.Serve(sctx, ln); close(served) }()
	t.Cleanup(func() { cancel(); <-served })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var id int32
	send := func(body bsoncore.Document, seqs ...wire.Sequence) {
		t.Helper()
		id++
		if _, err := conn.Write(wire.AppendMsg(nil, id, 0, 0, body, seqs...)); err != nil {
			t.Fatal(err)
		}
	}
	reply := func() bsoncore.Document {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		raw, err := wire.ReadMessage(conn, nil, wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.Parse(raw.Bytes, wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return m.(*wire.OpMsg).Body
	}
	a := lsidOf(1)
	send(bsoncore.NewDocumentBuilder().AppendString(cmdAcquire, "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", 60000).
		AppendDocument("lsid", a).AppendString("$db", "db").Build())
	if ok, _ := reply().Lookup("ok").AsInt64OK(); ok != 1 {
		t.Fatal("acquireLock refused")
	}
	limit := leaseLimit(t, c.store, ns, 7, margin)
	stmt := incSeven()
	for _, w := range []struct {
		pause time.Duration
		own   int32 // the client's own maxTimeMS, smaller than the cap at the decision
	}{{5 * time.Millisecond, 0}, {50 * time.Millisecond, 0}, {400 * time.Millisecond, 59500}} {
		pi.armed <- struct{}{}
		body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", a).AppendString("$db", "db")
		if w.own > 0 {
			body.AppendInt32("maxTimeMS", w.own)
		}
		send(body.Build(), wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
		action := <-pi.paused // decided
		if want := proxy.Rewrite; w.own > 0 && action != proxy.Forward || w.own == 0 && action != want {
			t.Fatalf("the write's decision: %v", action)
		}
		<-time.After(w.pause)
		// The bytes leave after this reading.
		resumed := time.Now()
		pi.release <- struct{}{}
		got := <-arrived
		if ok, _ := reply().Lookup("ok").AsInt64OK(); ok != 1 {
			t.Fatal("the holder's write was refused")
		}
		end := resumed.Add(time.Duration(got.ms) * time.Millisecond)
		t.Logf("pause %v: maxTimeMS %d, arrived %v after the pause", w.pause, got.ms, got.at.Sub(resumed))
		if got.ms <= 0 || end.After(limit) {
			t.Errorf("after a pause of %v before the send, the write arrived with maxTimeMS %d: counted from when it left, it may run until %s, %v past its lease less the margin",
				w.pause, got.ms, end.Format(time.RFC3339Nano), end.Sub(limit))
		}
	}
}

// leaseLimit is the end of the held lock on _id id, less margin: what a
// write under it may not run past.
func leaseLimit(t *testing.T, store *memstore.Store, ns namespace.Namespace, id int32, margin time.Duration) time.Time {
	t.Helper()
	d, err := docid.Of(id)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Status(context.Background(), lockstore.Owner{}, ns, []docid.ID{d})
	if err != nil || len(st) != 1 || !st[0].Held {
		t.Fatalf("the lock is not held: %v %v", st, err)
	}
	return st[0].ExpiresAt.Add(-margin)
}

// incSeven is the statement the leave-bound tests send: $inc n on _id 7.
func incSeven() bsoncore.Document {
	return bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
}

// updateOfSeven is incSeven as an update of db.locked in session lsid,
// its statement in a document sequence, parsed as the proxy hands it on.
func updateOfSeven(t *testing.T, lsid bsoncore.Document) (wire.Message, *wire.Command) {
	t.Helper()
	body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", lsid).AppendString("$db", "db").Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{incSeven()}}), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return msg, cmd
}
