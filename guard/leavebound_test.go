package guard

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
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
// still leave (the proxy's deadline check, d.Deadline, passed at the
// moment it would send the bytes), it must carry a maxTimeMS that ends
// its run before its lease less the margin, counted from the end of the
// line: the lease left may not be counted from a reading taken before the
// line unless the time the write may still leave after it is bounded
// (docs/BENCHMARKS.md, issue 25, h10-core: the one-clock-reading design).
// The time from the guard's reading to the bytes leaving (its edit, the
// proxy's checks, a pause of the process) is not counted here: the lease
// margin covers it (docs/ENFORCEMENT.md, "maxTimeMS"); on a loaded
// machine, or under the race detector, it was seen at 7 ms.
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
	seven, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.store.Status(context.Background(), lockstore.Owner{}, ns, []docid.ID{seven})
	if err != nil || len(st) != 1 || !st[0].Held {
		t.Fatalf("the lock is not held: %v %v", st, err)
	}
	// What the write may not run past.
	limit := st[0].ExpiresAt.Add(-pol.Lookup(ns).LeaseMargin)

	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", a).AppendString("$db", "db").Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	// write decides the write as the proxy does and reports whether it
	// would leave, checking what it would run under if so.
	write := func(block time.Duration) (left bool, late bsoncore.Document) {
		t.Helper()
		if block > 0 {
			sink.armed <- struct{}{}
		}
		req := &proxy.Request{Message: msg, Command: cmd, Client: c.client}
		done := make(chan proxy.Decision, 1)
		// from: no later than the guard's reading of the lease left.
		from := time.Now()
		go func() { done <- c.g.Intercept(context.Background(), req) }()
		if block > 0 {
			entered := <-sink.entered
			// The line's write is under way; let the time pass.
			<-time.After(time.Until(entered.Add(block)))
			from = time.Now()
			sink.release <- struct{}{}
		}
		d := <-done
		if d.Action != proxy.Rewrite {
			t.Fatalf("the holder's write: %+v %s", d, d.Reply)
		}
		// The proxy's check, immediately before the bytes leave.
		leaving := time.Now()
		if d.Deadline.IsZero() || d.Deadline.Before(leaving) {
			late = d.LateReply.LateReply()
			d.OnReply.Reply(context.Background(), nil)
			return false, late
		}
		ms := sentMaxTimeMS(t, d.Message)
		if end := from.Add(time.Duration(ms) * time.Millisecond); end.After(limit) {
			t.Fatalf("the write left with maxTimeMS %d, counted from before its line ended: it may run until %s, past its lease less the margin (%s) by %s",
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

// TestSubMillisecondBudgetIsLate: with no lease margin, a write whose
// decision ends less than a millisecond before its lease does may not
// leave with maxTimeMS 1 (the least a server takes), which would let it
// run up to a millisecond past the lease, when another session may hold
// the lock: it is refused as late. The decision line is held until the
// lease has 0.2–0.8 ms left, so the guard reads the lease left after it.
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
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	seven, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
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
		st, err := c.store.Status(context.Background(), lockstore.Owner{}, ns, []docid.ID{seven})
		if err != nil || len(st) != 1 || !st[0].Held {
			t.Fatalf("the lock is not held: %v %v", st, err)
		}
		limit := st[0].ExpiresAt
		body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", a).AppendString("$db", "db").Build()
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		sink.armed <- struct{}{}
		done := make(chan proxy.Decision, 1)
		go func() {
			done <- c.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: c.client})
		}()
		<-sink.entered
		<-time.After(time.Until(limit.Add(-left)))
		from := time.Now() // no later than the guard's reading of the lease left
		sink.release <- struct{}{}
		d = <-done
		leaving := time.Now()
		if d.Action == proxy.Rewrite && !d.Deadline.IsZero() && !d.Deadline.Before(leaving) {
			ms := sentMaxTimeMS(t, d.Message)
			if end := from.Add(time.Duration(ms) * time.Millisecond); ms <= 0 || end.After(limit) {
				overran++
				t.Errorf("with %v of its lease left at the line's end, the write left with maxTimeMS %d: it may run %v past its lease", left, ms, end.Sub(limit))
			}
			d.MessageDone.ReleaseMessage(d.Message)
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
