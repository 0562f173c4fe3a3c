package guard

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// decideWrite decides updateOne({_id: id}) in lsid's session on c's
// connection and returns its flight, not landed: a request whose reply has
// not arrived yet.
func (c *connTest) decideWrite(lsid bsoncore.Document, id int32) *flightPlan {
	c.t.Helper()
	_, f := c.decideWriteMsg(lsid, id)
	return f
}

// decideWriteMsg is decideWrite returning the decision too.
func (c *connTest) decideWriteMsg(lsid bsoncore.Document, id int32) (proxy.Decision, *flightPlan) {
	c.t.Helper()
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", id).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", lsid).AppendString("$db", "db").Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
	if err != nil {
		c.t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		c.t.Fatal(err)
	}
	d := c.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: c.client})
	f, ok := d.OnReply.(*flightPlan)
	if !ok || (d.Action != proxy.Forward && d.Action != proxy.Rewrite) || d.LateReply != proxy.LateReplier(f) {
		c.t.Fatalf("write of %d: %+v, want a flight that is also the late reply", id, d)
	}
	return d, f
}

// inFlight reports whether a write this guard forwarded under the lock on
// id is still unanswered (what a force-release would wait for).
func (c *connTest) inFlight(id int32) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // asks, does not wait
	return c.g.WaitWritesOn(ctx, namespace.Of("db.locked"), lockstoretest.ID(id)) != nil
}

// TestOverlappingWritesNeverShareAVerdict: a verdict goes back to the
// guard's spares only when its flight has landed by its reply, so
// requests decided while another is in flight on the same connection
// (pipelined, or a driver that does not wait) each get a verdict of
// their own, and landing one neither lands nor changes the others; a
// flight that was abandoned (its write may still run) keeps its verdict.
// Whether a landed one is the one reused is the pool's to say (sync.Pool
// keeps one per P, and drops some under the race detector): the test
// holds that no write gets a verdict still in flight.
func TestOverlappingWritesNeverShareAVerdict(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	for _, id := range []int32{7, 8, 9, 10} {
		c.lockCmd(cmdAcquire, a, id)
	}
	locks := func(f *flightPlan) []docid.ID { return f.Locks.Get(namespace.Of("db.locked")) }
	holds := func(f *flightPlan, id int32) {
		t.Helper()
		if ids := locks(f); len(ids) != 1 || !ids[0].Equal(lockstoretest.ID(id)) {
			t.Fatalf("a flight of the write of %d holds %v", id, ids)
		}
	}
	fa := c.decideWrite(a, 7)
	fb := c.decideWrite(a, 8) // while a's is unanswered
	if fa == fb || fa.v == fb.v {
		t.Fatal("two writes in flight on one connection share a verdict")
	}
	holds(fa, 7)
	holds(fb, 8)
	fa.Reply(context.Background(), nil)
	if c.inFlight(7) || !c.inFlight(8) {
		t.Fatalf("after the first reply: 7 in flight %v, 8 in flight %v; want only 8", c.inFlight(7), c.inFlight(8))
	}
	fc := c.decideWrite(a, 9) // a's verdict back, as a rule: a has landed
	if fc == fb || fc.v == fb.v {
		t.Fatal("two writes in flight on one connection share a verdict")
	}
	holds(fc, 9)
	holds(fb, 8)
	if !c.inFlight(8) || !c.inFlight(9) {
		t.Fatal("a write in flight is no longer tracked after another reused a verdict")
	}
	// Its late reply is its own request's, while it is in flight.
	if late := fc.LateReply(); late == nil {
		t.Fatal("no late reply")
	}
	fb.Reply(context.Background(), nil)
	fd := c.decideWrite(a, 10)
	if fd == fc || fd.v == fc.v {
		t.Fatal("two writes in flight on one connection share a verdict")
	}
	holds(fc, 9)
	holds(fd, 10)
	fc.Reply(context.Background(), nil)
	fd.Reply(context.Background(), nil)
	if c.inFlight(9) || c.inFlight(10) {
		t.Fatal("landed flights still tracked")
	}

	// Abandoned: the database may still run it, and its timer lands it
	// later; its verdict is not handed out meanwhile.
	fe := c.decideWrite(a, 7)
	fe.Abandon()
	ff := c.decideWrite(a, 8)
	if ff == fe || ff.v == fe.v {
		t.Fatal("an abandoned flight's verdict was reused")
	}
	holds(fe, 7)
	if !c.inFlight(7) {
		t.Fatal("an abandoned write no longer covers its lock")
	}
	ff.Reply(context.Background(), nil)
	fe.Reply(context.Background(), nil) // lands it, as its timer would
}

// TestRewrittenMessageBufferNotReusedUntilHandedBack: a rewritten
// message (maxTimeMS added) is encoded into a buffer of the guard's only
// once the proxy has handed it back (MessageDone): a message still held
// by the proxy is never written over, whatever is decided meanwhile on
// the connection. (Which handed-back buffer is reused is the pool's to
// say; TestMessageBufferReleasedOnce holds that one goes back.)
func TestRewrittenMessageBufferNotReusedUntilHandedBack(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	c.lockCmd(cmdAcquire, a, 8)
	d1, f1 := c.decideWriteMsg(a, 7)
	if d1.Action != proxy.Rewrite || d1.MessageDone == nil {
		t.Fatalf("%+v, want a rewrite (maxTimeMS) to hand back", d1)
	}
	kept := append([]byte(nil), d1.Message...)
	d2, f2 := c.decideWriteMsg(a, 8) // d1's message not handed back yet
	if &d2.Message[0] == &d1.Message[0] {
		t.Fatal("a message the proxy still holds was reused")
	}
	if !bytes.Equal(d1.Message, kept) {
		t.Fatal("a message the proxy still holds was written over")
	}
	d1.MessageDone.ReleaseMessage(d1.Message)
	f1.Reply(context.Background(), nil)
	kept = append(kept[:0], d2.Message...)
	d3, f3 := c.decideWriteMsg(a, 7)
	if &d3.Message[0] == &d2.Message[0] {
		t.Fatal("a message the proxy still holds was reused")
	}
	if !bytes.Equal(d2.Message, kept) || maxTimeOf(t, d2.Message) <= 0 {
		t.Fatal("a message the proxy still holds was written over")
	}
	// And the reused buffer, held again, is not handed out again.
	kept = append(kept[:0], d3.Message...)
	d4, f4 := c.decideWriteMsg(a, 8)
	if &d4.Message[0] == &d3.Message[0] || !bytes.Equal(d3.Message, kept) {
		t.Fatal("a reused buffer the proxy holds again was written over")
	}
	for _, d := range []proxy.Decision{d2, d3, d4} {
		d.MessageDone.ReleaseMessage(d.Message)
	}
	for _, f := range []*flightPlan{f2, f3, f4} {
		f.Reply(context.Background(), nil)
	}
}

// TestLateReplyOfALegacyWrite: a write that holds no lock and ran out of
// its implicit lock's lease before leaving is told so, not told to renew
// a lock it never took.
func TestLateReplyOfALegacyWrite(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "db.locked", Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedWait}}})
	if err != nil {
		t.Fatal(err)
	}
	c := newConnTest(t)
	c.g.SetPolicy(pol)
	_, f := c.decideWriteMsg(lsidOf(3), 7) // holds nothing: an implicit lock
	if f.implicit == nil {
		t.Fatal("the legacy write took no implicit lock")
	}
	late := bson.Raw(f.LateReply()).String()
	f.Reply(context.Background(), nil)
	if strings.Contains(late, "renewLock") || !strings.Contains(late, "implicit lock") {
		t.Fatalf("late reply of a legacy write: %s", late)
	}
	_, f = c.decideWriteMsg(func() bsoncore.Document { c.lockCmd(cmdAcquire, lsidOf(4), 8); return lsidOf(4) }(), 8)
	late = bson.Raw(f.LateReply()).String()
	f.Reply(context.Background(), nil)
	if !strings.Contains(late, "renewLock") {
		t.Fatalf("late reply of a holder's write: %s", late)
	}
}

// TestVerdictMessageBufferNotReusedBeforeHandedBack: a verdict that goes
// back to the spares keeps its message buffer (verdict.msg). When its
// flight lands before the proxy hands the rewritten message back (the
// reply read while the writer has not yet let go of the bytes), the
// next write, which may get that verdict, must not encode into the
// bytes the proxy still holds. Tried on several writes in turn: the
// spares (a sync.Pool) are not bound to hand back any one verdict.
func TestVerdictMessageBufferNotReusedBeforeHandedBack(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	c.lockCmd(cmdAcquire, a, 8)
	reused := false
	for i := range 20 {
		d1, f1 := c.decideWriteMsg(a, 7+int32(i%2))
		if d1.Action != proxy.Rewrite || d1.MessageDone == nil {
			t.Fatalf("%+v, want a rewrite (maxTimeMS) to hand back", d1)
		}
		v1 := f1.v
		kept := append([]byte(nil), d1.Message...)
		f1.Reply(context.Background(), nil) // landed: v1 may go to the next write
		d2, f2 := c.decideWriteMsg(a, 8-int32(i%2))
		reused = reused || f2.v == v1
		if &d2.Message[0] == &d1.Message[0] || !bytes.Equal(d1.Message, kept) {
			t.Fatal("a message the proxy still holds was written over by the next write")
		}
		d1.MessageDone.ReleaseMessage(d1.Message)
		d2.MessageDone.ReleaseMessage(d2.Message)
		f2.Reply(context.Background(), nil)
	}
	if !reused && !raceEnabled {
		t.Fatal("no landed flight's verdict was reused: the test did not try what it is for")
	}
}
