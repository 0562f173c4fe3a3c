package guard

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// connTest drives a guard in process, as one connection of the proxy
// would, on an in-memory lock store.
type connTest struct {
	t      *testing.T
	g      *Guard
	store  *memstore.Store
	client *proxy.ClientInfo
	log    *bytes.Buffer
}

func newConnTest(t *testing.T) *connTest {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeDuration = zapcore.StringDurationEncoder
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&buf), zapcore.InfoLevel))
	store := memstore.New(memstore.Config{})
	g := New(Options{Store: store, Logger: logger})
	g.SetPolicy(pol)
	return &connTest{t: t, g: g, store: store, client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}, log: &buf}
}

func lsidOf(b byte) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{b}, 16)).Build()
}

// sessionMemo is the guard's memo of the session of lsid (from lsidOf),
// nil when its table has none.
func (c *connTest) sessionMemo(lsid bsoncore.Document) *sessionMemo {
	id, ok := wire.SessionID(lsid)
	if !ok {
		c.t.Fatalf("no session id in %s", lsid)
	}
	_, _, m := c.g.sessionMemos.find(c.client.User(), id)
	return m
}

func (c *connTest) do(body bsoncore.Document, seq ...wire.Sequence) proxy.Decision {
	c.t.Helper()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, seq...), wire.Limits{})
	if err != nil {
		c.t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		c.t.Fatal(err)
	}
	d := c.g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: c.client})
	if d.OnReply != nil {
		d.OnReply.Reply(context.Background(), nil) // answered: the flight lands
	}
	return d
}

func (c *connTest) lockCmd(name string, lsid bsoncore.Document, id int32) {
	c.t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendString(name, "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(id).Build())
	if name == cmdAcquire {
		b.AppendInt32("leaseMS", 60000)
	}
	d := c.do(b.AppendDocument("lsid", lsid).AppendString("$db", "db").Build())
	if d.Action != proxy.Reply || !bytes.Contains(d.Reply, []byte("ok")) {
		c.t.Fatalf("%s: %+v", name, d)
	}
	if v, _ := d.Reply.Lookup("ok").AsInt64OK(); v != 1 {
		c.t.Fatalf("%s refused: %s", name, d.Reply)
	}
}

// write sends updateOne({_id: id}) and reports whether it was let through.
func (c *connTest) write(lsid bsoncore.Document, id int32) bool {
	c.t.Helper()
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", id).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendBoolean("ordered", true).
		AppendDocument("lsid", lsid).AppendString("$db", "db").Build()
	d := c.do(body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
	switch d.Action {
	case proxy.Forward, proxy.Rewrite:
		return true
	case proxy.Reply:
		return false
	}
	c.t.Fatalf("unexpected decision %+v", d)
	return false
}

// TestConnMemoSeesEveryLockChange: the connection's memos (pinned _ids,
// decision line heads) hold nothing about locks. With them warm from
// writes of the same _id, the very next write after a release, after a
// takeover by another session, and after the session is ended is decided
// on the lock as it is now.
func TestConnMemoSeesEveryLockChange(t *testing.T) {
	c := newConnTest(t)
	a, b := lsidOf(1), lsidOf(2)
	c.lockCmd(cmdAcquire, a, 7)
	for range 3 {
		if !c.write(a, 7) {
			t.Fatal("the holder's write was refused")
		}
	}
	if m := c.sessionMemo(a); m == nil || m.ids[0].ids == nil {
		t.Fatal("the session's _id memo was not used")
	}
	// Release: the next write is refused.
	c.lockCmd(cmdRelease, a, 7)
	if c.write(a, 7) {
		t.Fatal("a write was let through after its session released the lock")
	}
	// Takeover: another session takes it; the old holder's next write is
	// refused, the new holder's allowed.
	c.lockCmd(cmdAcquire, a, 7)
	if !c.write(a, 7) {
		t.Fatal("the holder's write was refused after it took the lock again")
	}
	c.lockCmd(cmdRelease, a, 7)
	c.lockCmd(cmdAcquire, b, 7)
	if c.write(a, 7) {
		t.Fatal("the old holder's write was let through after another session took the lock")
	}
	if !c.write(b, 7) {
		t.Fatal("the new holder's write was refused")
	}
	// The session's locks released behind the guard's back (what
	// endSessions and the sweep of dead sessions do): seen at once.
	if !c.write(b, 7) {
		t.Fatal("the holder's write was refused")
	}
	if _, err := c.store.ReleaseSession(context.Background(), c.g.owners.Session("", bytes.Repeat([]byte{2}, 16))); err != nil {
		t.Fatal(err)
	}
	if c.write(b, 7) {
		t.Fatal("a write was let through after its session's locks were released in the store")
	}
}

// TestDecisionLineUnchangedByPrefix: a decision line written from the
// connection's pre-encoded head is the very line written field by field
// (the fallback when the state is busy), except for its time and took.
func TestDecisionLineUnchangedByPrefix(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	c.log.Reset()
	c.write(a, 7) // builds the head
	c.write(a, 7) // uses it
	st := connStateOf(&proxy.Request{Client: c.client})
	if st == nil {
		t.Fatal("no connection state")
	}
	c.write(a, 7) // the state is busy: field by field
	st.mu.Unlock()
	c.write(a, 8) // refused: a reject line from the head
	st = connStateOf(&proxy.Request{Client: c.client})
	c.write(a, 8) // and field by field
	st.mu.Unlock()
	// Counted alike: the connection's cached allow series and the lookup.
	if n := testutil.ToFloat64(c.g.metrics.decisions.WithLabelValues("db.locked", enforce.DecisionAllow, "none")); n != 3 {
		t.Fatalf("%v allowed writes counted, want 3", n)
	}
	if n := testutil.ToFloat64(c.g.metrics.decisions.WithLabelValues("db.locked", enforce.DecisionReject, enforce.ReasonNotLocked)); n != 2 {
		t.Fatalf("%v refused writes counted, want 2", n)
	}
	lines := strings.Split(strings.TrimSpace(c.log.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), c.log)
	}
	varying := regexp.MustCompile(`"(ts|took)":("[^"]*"|[0-9.e+-]+)`)
	for i := range lines {
		lines[i] = varying.ReplaceAllString(lines[i], `"$1":_`)
	}
	if lines[0] != lines[1] || lines[1] != lines[2] {
		t.Fatalf("allowed write lines differ:\n%s\n%s\n%s", lines[0], lines[1], lines[2])
	}
	if lines[3] != lines[4] {
		t.Fatalf("refused write lines differ:\n%s\n%s", lines[3], lines[4])
	}
	want := `{"level":"info","ts":_,"logger":"audit","msg":"decision","client":"127.0.0.1:5000","app":"","user":"","session":"01010101","ns":"db.locked","command":"update","mode":"enforce","decision":"allow","policyVersion":`
	if !strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], `"took":_,"ids":"7"}`) {
		t.Fatalf("allowed write line:\n%s\nwant it to start\n%s", lines[0], want)
	}
}

// TestNextWriteSeesEveryLockChangeThroughTheProxy is
// TestConnMemoSeesEveryLockChange through the proxy, with the real lock
// store and its cache: with the connection's memos and the store's cache
// warm from allowed writes of one _id, a force-release, a takeover by
// another session and a release are each seen by the very next write.
func TestNextWriteSeesEveryLockChangeThroughTheProxy(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: config.Policy{
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	c := connect(t, s.uri, "memo-app")
	a, b := session(t, c), session(t, c)
	lock := func(sess mongo.Session, cmd string) {
		t.Helper()
		if _, err := run(t, c, sess, bson.D{{Key: cmd, Value: "orders"}, {Key: "ids", Value: bson.A{9}}}); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
	write := func(sess mongo.Session) error {
		_, err := run(t, c, sess, bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: 9}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}}}}})
		return err
	}
	warm := func(sess mongo.Session) {
		t.Helper()
		for range 3 {
			if err := write(sess); err != nil {
				t.Fatalf("the holder's write was refused: %v", err)
			}
		}
	}
	lock(a, "acquireLock")
	warm(a)
	if _, err := s.store.ForceRelease(context.Background(), namespace.Of("shop.orders"), lockstoretest.ID(int32(9)), "test"); err != nil {
		t.Fatal(err)
	}
	if write(a) == nil {
		t.Fatal("the next write after a force-release was let through")
	}
	lock(b, "acquireLock")
	warm(b)
	lock(b, "releaseLock")
	if write(b) == nil {
		t.Fatal("the next write after a release was let through")
	}
	lock(a, "acquireLock")
	warm(a)
	lock(a, "releaseLock")
	lock(b, "acquireLock") // taken over by another session
	if write(a) == nil {
		t.Fatal("the old holder's next write after a takeover was let through")
	}
	if err := write(b); err != nil {
		t.Fatalf("the new holder's write was refused: %v", err)
	}
}
