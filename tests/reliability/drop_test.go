package reliability

import (
	"bytes"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// TestDroppedReplyKeepsTheLock: the connection to the database drops right
// after an enforced write was passed on, so its reply never comes; the
// database may still be running it. The write stays in flight for its
// maxTimeMS: a release of the session from a new connection is answered
// only after that, never while the write may still land.
//
// The bound is the maxTimeMS lockgate put on the write, read from the
// message the database got, counted from before the client sent the
// write (the flight cannot start earlier). It used to be a fixed 1.5 s
// from after the send, which a loaded machine broke with no fault of the
// product: maxTimeMS is the lease left at the check less the margin, and
// every millisecond the acquire's reply and the check took came off it.
func TestDroppedReplyKeepsTheLock(t *testing.T) {
	t.Parallel()
	coll := uniq("drop")
	ns := "fence." + coll
	relay := newFaultRelay(t, upstream.Addr(), slowMarker, 0)
	relay.DropAfterMarked(true)
	forwarded := make(chan []byte, 1)
	relay.onForwardedMsg = func(msg []byte) {
		select {
		case forwarded <- msg:
		default:
		}
	}
	cfg := fencedConfig("mongodb://"+relay.Addr()+"/", ns, false)
	cfg.Lockstore.URI = upstream.URI()
	g := startGateway(t, cfg)
	ctx := testCtx(t, time.Minute)
	direct := connect(t, upstream.URI(), "seed").Database("fence").Collection(coll)
	if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: "X"}, {Key: "v", Value: "start"}}); err != nil {
		t.Fatal(err)
	}
	lsid := make([]byte, 16)
	rand.Read(lsid)
	session := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, lsid).Build()
	ids := bsoncore.NewArrayBuilder().AppendString("X").Build()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", g.Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c
	}
	c := dial()
	defer c.Close()
	if _, err := c.Write(rawCmd(1, session, "fence", func(b *bsoncore.DocumentBuilder) {
		b.AppendString("acquireLock", coll).AppendArray("ids", ids).AppendInt32("leaseMS", 4000)
	})); err != nil {
		t.Fatal(err)
	}
	if r := readBody(t, c); !bytes.Contains(r, []byte("token")) {
		t.Fatalf("acquireLock: %v", bsoncore.Document(r))
	}
	update := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendString("_id", "X").Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set",
			bsoncore.NewDocumentBuilder().AppendString("v", "dropped reply").Build()).Build()).Build()
	sent := time.Now()
	if _, err := c.Write(rawCmd(2, session, "fence", func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", coll).AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(update).Build()).
			AppendString("comment", slowMarker)
	})); err != nil {
		t.Fatal(err)
	}
	// The proxy closes the client's connection with its upstream.
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the client's connection survived the upstream cut")
	}

	c2 := dial()
	defer c2.Close()
	if _, err := c2.Write(rawCmd(3, session, "fence", func(b *bsoncore.DocumentBuilder) {
		b.AppendString("releaseLock", coll).AppendArray("ids", ids)
	})); err != nil {
		t.Fatal(err)
	}
	r := bsoncore.Document(readBody(t, c2))
	waited := time.Since(sent)
	var maxTime time.Duration
	select {
	case msg := <-forwarded:
		maxTime = maxTimeOf(t, msg)
	default:
		t.Fatal("the relay passed on no marked message, yet the connection was cut")
	}
	t.Logf("update sent with maxTimeMS %v; release answered %v after the send", maxTime, waited)
	if maxTime <= 0 {
		t.Fatalf("the enforced update reached the database without maxTimeMS")
	}
	if waited < maxTime {
		t.Errorf("the release was answered %v after the write was sent, within its maxTimeMS of %v: the write could still be running (%v)", waited, maxTime, r)
	}
	if n, _ := r.Lookup("released").AsInt64OK(); n != 1 {
		t.Errorf("release after the write's maxTimeMS: %v, want released: 1", r)
	}
}

// maxTimeOf returns the maxTimeMS of the OP_MSG command msg, 0 if it has
// none.
func maxTimeOf(t *testing.T, msg []byte) time.Duration {
	t.Helper()
	m, err := wire.Parse(msg, wire.Limits{})
	if err != nil {
		t.Fatalf("parsing the forwarded write: %v", err)
	}
	om, ok := m.(*wire.OpMsg)
	if !ok {
		t.Fatalf("the forwarded write is a %T, not OP_MSG", m)
	}
	v, err := bsoncore.Document(om.Body).LookupErr("maxTimeMS")
	if err != nil {
		return 0
	}
	ms, ok := v.AsInt64OK()
	if !ok {
		t.Fatalf("maxTimeMS %v is not a number", v)
	}
	return time.Duration(ms) * time.Millisecond
}
