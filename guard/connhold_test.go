package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// TestDecisionReleasesItsConnection: an enforced write's decision holds
// its connection's state from its verdict to its decision (newVerdict,
// releaseConn), and gives it back however it ends: allowed, refused for a
// lock it does not hold, refused for want of a session, after a write
// nothing protects. Left held, every later write of the connection would
// do without its memos (a new verdict, a copied _id, no lock memo), and
// a flight landing on it could not hand its verdict back.
func TestDecisionReleasesItsConnection(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	free := func(what string) {
		t.Helper()
		st := connStateOf(&proxy.Request{Client: c.client})
		if st == nil {
			t.Fatalf("after %s the connection's state is still held", what)
		}
		if st.deciding.Load() != nil {
			t.Fatalf("after %s the connection's state still names a decision", what)
		}
		st.mu.Unlock()
	}
	if !c.write(a, 7) {
		t.Fatal("the holder's write was refused")
	}
	free("an allowed write")
	if c.write(a, 8) {
		t.Fatal("a write of a document not locked was allowed")
	}
	free("a refused write")
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	if d := c.do(bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendString("$db", "db").Build(),
		wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}); d.Action != proxy.Reply {
		t.Fatalf("a write without a session: %+v", d)
	}
	free("a write without a session")
	if d := c.do(bsoncore.NewDocumentBuilder().AppendString("update", "open").AppendDocument("lsid", a).AppendString("$db", "db").Build(),
		wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}); d.Action != proxy.Forward {
		t.Fatalf("a write nothing protects: %+v", d)
	}
	free("a write nothing protects")
	// And a landed flight's verdict goes back to the guard's spares,
	// cleared, for the next write (on any connection). sync.Pool keeps
	// one per P and, under the race detector, drops a quarter of what it
	// is given: the write is tried until its verdict is found there.
	for i := 0; ; i++ {
		if !c.write(a, 7) {
			t.Fatal("the holder's write was refused")
		}
		if v, _ := c.g.verdicts.Get().(*verdict); v != nil {
			// All but its message buffer, which it keeps (ownMsg).
			v.msg = nil
			if !reflect.ValueOf(v).Elem().IsZero() {
				t.Fatal("a verdict given back is not cleared")
			}
			break
		}
		if i == 50 {
			t.Fatal("no verdict was given back when its flight landed")
		}
	}
}

// TestSessionMemoFollowsTheLsid: the connection's latest session memo
// (takeSession) answers only for the same session. A write in another session,
// in no valid session (the same 16 bytes as a legacy UUID, subtype 3),
// or in one whose lsid document carries another field is decided on its
// own lsid, never on the one before.
func TestSessionMemoFollowsTheLsid(t *testing.T) {
	c := newConnTest(t)
	a, b := lsidOf(1), lsidOf(2)
	c.lockCmd(cmdAcquire, a, 7)
	legacy := bsoncore.NewDocumentBuilder().AppendBinary("id", 3, bytes.Repeat([]byte{1}, 16)).Build()
	twice := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{1}, 16)).AppendBinary("id", 4, bytes.Repeat([]byte{2}, 16)).Build()
	reason := func(lsid bsoncore.Document) string {
		t.Helper()
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
			Build()
		d := c.do(bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", lsid).AppendString("$db", "db").Build(),
			wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
		if d.Action != proxy.Reply {
			return "allowed"
		}
		r, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK()
		return r
	}
	for i, step := range []struct {
		lsid bsoncore.Document
		want string
	}{
		{a, "allowed"}, {a, "allowed"}, {b, "held_by_other"}, {a, "allowed"},
		{legacy, "no_session"}, {a, "allowed"}, {twice, "no_session"}, {a, "allowed"},
	} {
		if got := reason(step.lsid); got != step.want {
			t.Fatalf("write %d: %s, want %s", i, got, step.want)
		}
	}
}

// TestDecisionLineFollowsPolicyReload: the connection keeps its lines'
// policyVersion field (versionField) for the policy it was made for
// alone: the first write after a reload names the new version.
func TestDecisionLineFollowsPolicyReload(t *testing.T) {
	compile := func(margin int64) *policy.Policy {
		pol, err := policy.Compile(config.Policy{Default: config.ModeOff, LeaseMarginMS: margin,
			Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	one, two := compile(100), compile(200)
	if one.Version() == two.Version() {
		t.Fatal("two policies with one version")
	}
	var buf bytes.Buffer
	g := New(Options{Store: memstore.New(memstore.Config{}), Logger: zap.NewNop(),
		DecisionSink: &LineSink{Out: zapcore.AddSync(&buf), Level: zapcore.InfoLevel}})
	g.SetPolicy(one)
	c := &connTest{t: t, g: g, client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}, log: &buf}
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	version := func() string {
		t.Helper()
		buf.Reset()
		if !c.write(a, 7) {
			t.Fatal("the holder's write was refused")
		}
		var line struct{ PolicyVersion string }
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("%v: %s", err, buf.Bytes())
		}
		return line.PolicyVersion
	}
	for i, want := range []*policy.Policy{one, one, two, two, one} {
		g.SetPolicy(want)
		if got := version(); got != want.Version() {
			t.Fatalf("write %d: policyVersion %q, want %q", i, got, want.Version())
		}
	}
}

// TestConcurrentDecisionsOnOneConnection: writes decided at once on one
// connection (tests share a ClientInfo; a proxy's pipelined flight lands
// while the next write is decided) each find the connection's state held
// by another decision and do without it, and all are decided as alone
// (run with -race: a decision that used another's held state would
// race on its memos).
func TestConcurrentDecisionsOnOneConnection(t *testing.T) {
	c := newConnTest(t)
	// The lines through a locked sink, as the gateway's: the connection's
	// state serves them too.
	c.g = New(Options{Store: c.store, Logger: zap.NewNop(),
		DecisionSink: &LineSink{Out: zapcore.Lock(zapcore.AddSync(io.Discard)), Level: zapcore.InfoLevel}})
	c.g.SetPolicy(c.g0Policy(t))
	a := lsidOf(1)
	for id := int32(7); id < 11; id++ {
		c.lockCmd(cmdAcquire, a, id)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for id := int32(7); id < 11; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stmt := bsoncore.NewDocumentBuilder().
				AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", id).Build()).
				AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
				Build()
			body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", a).AppendString("$db", "db").Build()
			msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
			if err != nil {
				errs <- err.Error()
				return
			}
			cmd, err := wire.CommandOf(msg)
			if err != nil {
				errs <- err.Error()
				return
			}
			for range 300 {
				d := c.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: c.client})
				if d.MessageDone != nil {
					d.MessageDone.ReleaseMessage(d.Message)
				}
				if d.OnReply != nil {
					d.OnReply.Reply(context.Background(), nil)
				}
				if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
					errs <- fmt.Sprintf("the holder's write of %d was refused: %s", id, d.Reply)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// g0Policy is the policy newConnTest compiles: db.locked enforced.
func (c *connTest) g0Policy(t *testing.T) *policy.Policy {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TestEnforcedWriteAllocatesNothing: the allowed write of a session that
// holds its document's lock, repeated on one connection, allocates
// nothing, and neither does the same write where nothing is protected:
// its plan is read into the connection's (Request.Scratch, as the proxy
// keeps it), its verdict and flight come from the guard's spares, and
// its rewritten message, pinned _id, owner, lsid, lock check and
// decision line from the connection's state (issue 25's goal of 0 allocations).
func TestEnforcedWriteAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	c := newConnTest(t)
	c.g = New(Options{Store: c.store, Logger: zap.NewNop(),
		DecisionSink: &LineSink{Out: zapcore.Lock(zapcore.AddSync(io.Discard)), Level: zapcore.InfoLevel}})
	c.g.SetPolicy(c.g0Policy(t))
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	allocs := func(coll string) float64 {
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
			Build()
		body := bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendDocument("lsid", a).AppendString("$db", "db").Build()
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		req := &proxy.Request{Message: msg, Command: cmd, Client: c.client}
		write := func() {
			req.Plan = nil // planned anew into req.Scratch, as the proxy plans each message
			d := c.g.Intercept(context.Background(), req)
			if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
				t.Fatalf("the write to %s was refused: %s", coll, d.Reply)
			}
			if d.MessageDone != nil {
				d.MessageDone.ReleaseMessage(d.Message)
			}
			if d.OnReply != nil {
				d.OnReply.Reply(context.Background(), nil)
			}
		}
		for range 3 {
			write() // the connection's memos
		}
		return testkit.AllocsPerRun(5, 200, write) // the process's other goroutines allocate too
	}
	open, locked := allocs("open"), allocs("locked")
	if locked != 0 || open != 0 {
		t.Fatalf("the enforced write allocates %v times, the unprotected one %v", locked, open)
	}
}

// TestVerdictConnOnlyWhileHeld: a verdict finds its connection's state
// through itself (verdict.conn) only while its own request's decision
// holds it. Once released, or held by the connection's next decision,
// the state is not its to use: conn then takes it as connStateOf does
// (locked, for the caller to unlock) or finds it busy.
func TestVerdictConnOnlyWhileHeld(t *testing.T) {
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	req := &proxy.Request{Client: client}
	v := newVerdict(nil, req, time.Now())
	st := v.home
	if st == nil || v.conn(req) != st || st.deciding.Load() != req {
		t.Fatal("the decision does not find its own connection's state")
	}
	st.unlock(req) // held: a no-op
	releaseConn(req)
	if st.deciding.Load() != nil {
		t.Fatal("released, the state still names the decision")
	}
	// Released: conn locks it as connStateOf would; the caller unlocks.
	if got := v.conn(req); got != st || st.mu.TryLock() {
		t.Fatal("after its release conn did not take the state as connStateOf does")
	}
	st.unlock(req)
	// Held by the connection's next decision: busy for the old verdict.
	next := &proxy.Request{Client: client}
	w := newVerdict(nil, next, time.Now())
	if w.home != st {
		t.Fatal("the next decision did not take the connection's state")
	}
	if got := v.conn(req); got != nil {
		t.Fatal("a released verdict used the state another decision holds")
	}
	releaseConn(next)
	if st.mu.TryLock() {
		st.mu.Unlock()
	} else {
		t.Fatal("the next decision's release left the state locked")
	}
}
