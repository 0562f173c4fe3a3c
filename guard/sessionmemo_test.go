package guard

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

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

// pooledTest is a guard in front of a driver's pool: connections, each
// of which writes for any of the sessions in turn.
type pooledTest struct {
	t     *testing.T
	g     *Guard
	conns []*connTest
}

func newPooledTest(t *testing.T, conns int, sink *LineSink) *pooledTest {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "bench.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Config{})
	g := New(Options{Store: store, Logger: zap.NewNop(), DecisionSink: sink})
	g.SetPolicy(pol)
	p := &pooledTest{t: t, g: g}
	for i := range conns {
		p.conns = append(p.conns, &connTest{t: t, g: g, store: store, client: &proxy.ClientInfo{ID: uint64(i + 1), Addr: fmt.Sprintf("127.0.0.1:%d", 5000+i)}})
	}
	return p
}

// write sends updateOne({_id: id}) on bench.locked in the session of
// lsid on connection conn, and lands it when it is let through; it
// reports whether it was.
func (p *pooledTest) write(conn int, lsid bsoncore.Document, id int32) bool {
	p.t.Helper()
	req := BenchUpdate(p.t, p.conns[conn].client, lsid, "locked", id)
	return p.decide(req)
}

func (p *pooledTest) decide(req *proxy.Request) bool {
	p.t.Helper()
	allowed, err := p.decideReq(req)
	if err != nil {
		p.t.Fatal(err)
	}
	return allowed
}

// decideReq is decide without the test's Fatal, for other goroutines.
func (p *pooledTest) decideReq(req *proxy.Request) (bool, error) {
	req.Plan = nil // planned anew into req.Scratch, as the proxy plans each message
	d := p.g.Intercept(context.Background(), req)
	if d.MessageDone != nil {
		d.MessageDone.ReleaseMessage(d.Message)
	}
	if d.OnReply != nil {
		d.OnReply.Reply(context.Background(), nil)
	}
	switch d.Action {
	case proxy.Forward, proxy.Rewrite:
		return true, nil
	case proxy.Reply:
		return false, nil
	}
	return false, fmt.Errorf("unexpected decision %+v", d)
}

// lockCmd runs acquireLock or releaseLock of bench.locked id in the
// session of lsid on connection conn.
func (p *pooledTest) lockCmd(conn int, name string, lsid bsoncore.Document, id int32) {
	p.t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendString(name, "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(id).Build())
	if name == cmdAcquire {
		b.AppendInt32("leaseMS", 600000)
	}
	d := p.g.Intercept(context.Background(), BenchRequest(p.t, p.conns[conn].client, b.AppendDocument("lsid", lsid).AppendString("$db", "bench").Build()))
	if v, _ := d.Reply.Lookup("ok").AsInt64OK(); d.Action != proxy.Reply || v != 1 {
		p.t.Fatalf("%s of %d: %+v %s", name, id, d, d.Reply)
	}
}

// TestPooledSessionsAllocateNothing: the enforce family's workload as the
// guard sees it behind a driver's pool: 16 sessions, each holding its 4
// documents, write in turn on 4 connections, each write on whichever
// connection comes next, so a connection sees every session's writes
// and a session's writes come on every connection. Once each session
// has written each of its documents, a write allocates nothing: the
// session's memos (owner key, pinned ids and filters, held locks, the
// decision line's fields) are found on whichever connection it comes.
// With the memos kept per connection it allocated 10 times a write.
func TestPooledSessionsAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	p := newPooledTest(t, 4, &LineSink{Out: zapcore.Lock(zapcore.AddSync(io.Discard)), Level: zapcore.InfoLevel})
	const sessions, ids = 16, 4
	var reqs []*proxy.Request
	for s := range int32(sessions) {
		lsid := lsidOf(byte(s + 1))
		for k := range int32(ids) {
			p.lockCmd(int(s)%len(p.conns), cmdAcquire, lsid, 100*s+k)
		}
	}
	// Request i is session i mod 16's, on its documents in turn, on
	// connection i mod 5 mod 4: every session meets every connection.
	for i := range sessions * ids * 5 {
		s, k := int32(i%sessions), int32(i/sessions%ids)
		reqs = append(reqs, BenchUpdate(t, p.conns[i%5%len(p.conns)].client, lsidOf(byte(s+1)), "locked", 100*s+k))
	}
	next := 0
	write := func() {
		req := reqs[next%len(reqs)]
		next++
		if !p.decide(req) {
			t.Fatal("a holder's write was refused")
		}
	}
	for range 2 * len(reqs) {
		write() // every memo made
	}
	// testkit.AllocsPerRun: the process's other goroutines (the embedded
	// FerretDB's among them) allocate too, and a burst of theirs on a
	// loaded machine read as "allocates 1 times".
	if n := testkit.AllocsPerRun(5, len(reqs), write); n != 0 {
		t.Fatalf("a pooled session's write allocates %v times", n)
	}
}

// TestSessionMemoSeesEveryLockChange: a session's memos, filled by its
// writes on one connection, decide its next write on another on the lock
// as it is now: after a release on a third connection, after another
// session's takeover, after the session's end.
func TestSessionMemoSeesEveryLockChange(t *testing.T) {
	p := newPooledTest(t, 3, nil)
	a, b := lsidOf(1), lsidOf(2)
	p.lockCmd(0, cmdAcquire, a, 7)
	for i := range 6 {
		if !p.write(i%3, a, 7) {
			t.Fatal("the holder's write was refused")
		}
	}
	if m := p.conns[0].sessionMemo(a); m == nil || m.ids[0].ids == nil {
		t.Fatal("the session's memos were not used")
	}
	p.lockCmd(2, cmdRelease, a, 7)
	if p.write(1, a, 7) {
		t.Fatal("a write was let through on another connection after its session released the lock")
	}
	p.lockCmd(2, cmdAcquire, b, 7)
	for conn := range 3 {
		if p.write(conn, a, 7) {
			t.Fatal("the old holder's write was let through after another session took the lock")
		}
		if !p.write(conn, b, 7) {
			t.Fatal("the new holder's write was refused")
		}
	}
	// The session ends on one connection; its write on another is refused.
	d := p.g.Intercept(context.Background(), BenchRequest(t, p.conns[0].client, bsoncore.NewDocumentBuilder().
		AppendArray("endSessions", bsoncore.NewArrayBuilder().AppendDocument(b).Build()).AppendString("$db", "admin").Build()))
	if d.OnReply != nil {
		d.OnReply.Reply(context.Background(), nil)
	}
	if p.write(1, b, 7) {
		t.Fatal("a write was let through after its session ended")
	}
}

// TestSessionWritesAtOnce: writes of one session sent at the same moment
// on several connections (which a driver does not do, a client may) are
// each decided on the lock, whichever of them gets the session's memos:
// the others do without them and never wait for them. Run under -race,
// it is the memos' lock that is tested.
func TestSessionWritesAtOnce(t *testing.T) {
	p := newPooledTest(t, 4, &LineSink{Out: zapcore.Lock(zapcore.AddSync(io.Discard)), Level: zapcore.InfoLevel})
	a, b := lsidOf(1), lsidOf(2)
	p.lockCmd(0, cmdAcquire, a, 7)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong []string
	for conn := range p.conns {
		// Each goroutine's requests, made here: only the test's own
		// goroutine may fail it.
		holderReq := BenchUpdate(t, p.conns[conn].client, a, "locked", 7)
		strangerReq := BenchUpdate(t, p.conns[conn].client, b, "locked", 7)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				holder, err1 := p.decideReq(holderReq)
				stranger, err2 := p.decideReq(strangerReq)
				if !holder || stranger || err1 != nil || err2 != nil {
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("connection %d, write %d: holder let through %v, stranger %v (%v, %v)", conn, i, holder, stranger, err1, err2))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("%d wrong decisions, first: %s", len(wrong), wrong[0])
	}
	for _, id := range [][]byte{bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)} {
		if _, _, m := p.g.sessionMemos.find("", id); m == nil || !m.mu.TryLock() {
			t.Fatalf("session %x: its memo is missing or still held after every decision", id[0])
		} else {
			m.mu.Unlock()
		}
	}
}

// TestSessionMemoModel: random steps of lock commands and writes by
// sessions with and without bindings, each on whichever connection comes,
// against a model of who holds each document. Every write must be let
// through exactly when its owner (session and binding) holds the lock
// as the model has it: the memos a session's writes leave, on any
// connection, never decide one on a lock as it was.
func TestSessionMemoModel(t *testing.T) {
	p := newPooledTest(t, 3, &LineSink{Out: zapcore.Lock(zapcore.AddSync(io.Discard)), Level: zapcore.InfoLevel})
	type owner struct {
		lsid byte
		bind string
	}
	lsids, binds, docs := []byte{1, 2, 3, 4}, []string{"", "b1", "b2"}, []int32{1, 2, 3}
	held := map[int32]owner{}
	rng := rand.New(rand.NewPCG(25, 4))
	steps := 3000
	if testing.Short() {
		steps = 600
	}
	for i := range steps {
		conn := rng.IntN(len(p.conns))
		o := owner{lsids[rng.IntN(len(lsids))], binds[rng.IntN(len(binds))]}
		doc := docs[rng.IntN(len(docs))]
		lsid := lsidOf(o.lsid)
		switch op := rng.IntN(10); {
		case op < 2: // acquireLock
			b := bsoncore.NewDocumentBuilder().AppendString(cmdAcquire, "locked").
				AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(doc).Build()).AppendInt32("leaseMS", 600000)
			if o.bind != "" {
				b.AppendString("bind", o.bind)
			}
			d := p.g.Intercept(context.Background(), BenchRequest(t, p.conns[conn].client, b.AppendDocument("lsid", lsid).AppendString("$db", "bench").Build()))
			ok, _ := d.Reply.Lookup("ok").AsInt64OK()
			h, isHeld := held[doc]
			if want := !isHeld || h == o; (ok == 1) != want {
				t.Fatalf("step %d: acquireLock of %d by %+v on connection %d: %s, held by %+v (%v)", i, doc, o, conn, d.Reply, h, isHeld)
			}
			if ok == 1 {
				held[doc] = o
			}
		case op < 3: // releaseLock
			b := bsoncore.NewDocumentBuilder().AppendString(cmdRelease, "locked").
				AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(doc).Build())
			if o.bind != "" {
				b.AppendString("bind", o.bind)
			}
			p.g.Intercept(context.Background(), BenchRequest(t, p.conns[conn].client, b.AppendDocument("lsid", lsid).AppendString("$db", "bench").Build()))
			if h, ok := held[doc]; ok && h == o {
				delete(held, doc)
			}
		default: // updateOne({_id: doc}), as the holder's writes or another's
			stmt := bsoncore.NewDocumentBuilder().
				AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", doc).Build()).
				AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
				Build()
			b := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", lsid)
			if o.bind != "" {
				b.AppendString("comment", "lockgate:"+o.bind)
			}
			req := BenchRequest(t, p.conns[conn].client, b.AppendString("$db", "bench").Build(), wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
			h, isHeld := held[doc]
			if got, want := p.decide(req), isHeld && h == o; got != want {
				t.Fatalf("step %d: the write of %d by %+v on connection %d let through: %v, want %v (held by %+v: %v)", i, doc, o, conn, got, want, h, isHeld)
			}
		}
	}
}

// memoCount is how many session memos the guard's table holds.
func (p *pooledTest) memoCount() int {
	n := 0
	for i := range p.g.sessionMemos.slots {
		if p.g.sessionMemos.slots[i].Load() != nil {
			n++
		}
	}
	return n
}

// uuidLSID is {id: <UUID n>}, for more sessions than lsidOf makes.
func uuidLSID(n int) bsoncore.Document {
	id := make([]byte, 16)
	id[0], id[1], id[15] = byte(n), byte(n>>8), 0xa5
	return bsoncore.NewDocumentBuilder().AppendBinary("id", 4, id).Build()
}

// TestSessionMemosLeaveWithTheirConnection: the session memos do not grow
// with the sessions served. A client that opens a connection per session
// and closes it without ending the session (an old driver, a script, the
// soak of tests/reliability) leaves no memo behind: the connection's
// latest session's memo leaves the table when the connection closes.
// Sessions that a driver ends (endSessions, as it does when it
// disconnects), on whichever of its pooled connections, leave none
// either. Either way a memo counts as a leak only until the table is
// full; the soak's check of memory per connection served found it.
func TestSessionMemosLeaveWithTheirConnection(t *testing.T) {
	p := newPooledTest(t, 4, nil)
	const sessions = 300
	for s := range sessions {
		c := &connTest{t: t, g: p.g, store: nil, client: &proxy.ClientInfo{ID: uint64(100 + s), Addr: fmt.Sprintf("127.0.0.1:%d", 6000+s)}}
		p.conns = append(p.conns[:4], c)
		lsid := uuidLSID(s)
		p.lockCmd(4, cmdAcquire, lsid, int32(s))
		if !p.write(4, lsid, int32(s)) {
			t.Fatal("the holder's write was refused")
		}
		if c.sessionMemo(lsid) == nil {
			t.Fatal("the write made no session memo")
		}
		p.lockCmd(4, cmdRelease, lsid, int32(s))
		closer, ok := c.client.Local().(proxy.ConnCloser)
		if !ok {
			t.Fatal("the guard's connection state is not a proxy.ConnCloser")
		}
		closer.ConnClosed()
	}
	if n := p.memoCount(); n != 0 {
		t.Fatalf("%d session memos left after %d connections, each of one session, closed", n, sessions)
	}

	// A driver's pool: every session on every connection, then ended.
	ended := bsoncore.NewArrayBuilder()
	for s := range sessions {
		lsid := uuidLSID(1000 + s)
		p.lockCmd(s%4, cmdAcquire, lsid, int32(s))
		for conn := range 4 {
			if !p.write(conn, lsid, int32(s)) {
				t.Fatal("the holder's write was refused")
			}
		}
		ended.AppendDocument(lsid)
	}
	if n := p.memoCount(); n < sessions/2 {
		t.Fatalf("%d session memos for %d sessions: the table keeps too few for this test to mean anything", n, sessions)
	}
	d := p.g.Intercept(context.Background(), BenchRequest(t, p.conns[0].client, bsoncore.NewDocumentBuilder().
		AppendArray("endSessions", ended.Build()).AppendString("$db", "admin").Build()))
	if d.OnReply != nil {
		d.OnReply.Reply(context.Background(), nil)
	}
	if n := p.memoCount(); n != 0 {
		t.Fatalf("%d session memos left after their %d sessions ended", n, sessions)
	}
	// An ended session that writes again is decided as any: its lock
	// went with it.
	if p.write(1, uuidLSID(1000), 0) {
		t.Fatal("a write was let through after its session ended")
	}
}
