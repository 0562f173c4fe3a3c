package reliability

import (
	"bytes"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestDroppedReplyKeepsTheLock: the connection to the database drops right
// after an enforced write was passed on, so its reply never comes; the
// database may still be running it. The write stays in flight for its
// maxTimeMS: a release of the session from a new connection is answered
// only after that, never while the write may still land.
func TestDroppedReplyKeepsTheLock(t *testing.T) {
	t.Parallel()
	coll := uniq("drop")
	ns := "fence." + coll
	relay := newFaultRelay(t, upstream.Addr(), slowMarker, 0)
	relay.DropAfterMarked(true)
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
		b.AppendString("acquireLock", coll).AppendArray("ids", ids).AppendInt32("leaseMS", 3000)
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
	if _, err := c.Write(rawCmd(2, session, "fence", func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", coll).AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(update).Build()).
			AppendString("comment", slowMarker)
	})); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
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
	waited := time.Since(cut)
	// maxTimeMS was at most the 3 s lease less the 1 s margin.
	if waited < 1500*time.Millisecond {
		t.Errorf("the release was answered %v after the reply was lost (%v), while the write could still be running (maxTimeMS about 2 s)", waited, r)
	}
	if n, _ := r.Lookup("released").AsInt64OK(); n != 1 {
		t.Errorf("release after the write's maxTimeMS: %v, want released: 1", r)
	}
}
