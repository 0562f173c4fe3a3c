package tests

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestUnacknowledgedWrites sends w:0 writes through the proxy. Drivers send
// them as OP_MSG with the moreToCome flag, and a server must never reply to
// such a request (DESIGN §3): a client that gets a stray reply reads it as
// the answer to its next request on the connection.
//
// FerretDB v1.24 does reply to moreToCome requests (it is checked and logged
// below), so a proxy that relays every upstream reply passes that protocol
// violation on. This test requires the clients of the proxy to see the
// protocol as it is specified.
func TestUnacknowledgedWrites(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, time.Minute)
	name := dbName(t)

	// On the wire: an insert with moreToCome (requestID 7), then a ping
	// (requestID 8). The first reply must be the ping's.
	insert := opMsgBytes(7, bsoncore.NewDocumentBuilder().
		AppendString("insert", "raw").
		AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(
			bsoncore.NewDocumentBuilder().AppendString("_id", "raw-w0").Build()).Build()).
		AppendDocument("writeConcern", bsoncore.NewDocumentBuilder().AppendInt32("w", 0).Build()).
		AppendString("$db", name).Build())
	binary.LittleEndian.PutUint32(insert[16:], 1<<1) // flagBits: moreToCome
	ping := opMsgBytes(8, bsoncore.NewDocumentBuilder().AppendInt32("ping", 1).AppendString("$db", "admin").Build())
	firstReplyTo := func(addr string) int32 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(append(append([]byte(nil), insert...), ping...)); err != nil {
			t.Fatal(err)
		}
		m, err := readMessage(c)
		if err != nil {
			t.Fatalf("%s: reading the first reply: %v", addr, err)
		}
		return m.ResponseTo
	}
	if got := firstReplyTo(upstream.Addr()); got != 8 {
		t.Logf("note: the upstream itself answers a moreToCome request (first reply has responseTo %d, want 8)", got)
	}
	if got := firstReplyTo(g.ProxyAddr().String()); got != 8 {
		t.Errorf("through the proxy, the first reply after a moreToCome insert (requestID 7) and a ping (requestID 8) has responseTo %d: the moreToCome request was answered", got)
	}

	// The same as a driver sees it, on a single pooled connection: w:0
	// inserts interleaved with acknowledged reads, each of which must get
	// its own answer; then every w:0 insert must have landed.
	client := connect(t, g.URI, options.Client().SetMaxPoolSize(1))
	acked := client.Database(name).Collection("c")
	if err := acked.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	unacked := client.Database(name).Collection("c", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	const n = 50
	for i := 0; i < n; i++ {
		// The driver reports a w:0 write as ErrUnacknowledgedWrite.
		if _, err := unacked.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); !errors.Is(err, mongo.ErrUnacknowledgedWrite) {
			t.Fatalf("w:0 insert %d: %v", i, err)
		}
		var d bson.M
		if err := acked.FindOne(ctx, bson.D{{Key: "_id", Value: -1}}).Decode(&d); !errors.Is(err, mongo.ErrNoDocuments) {
			t.Fatalf("find _id -1 after w:0 insert %d: got %v, %v; want mongo.ErrNoDocuments", i, d, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "all w:0 inserts to be applied", func() bool {
		c, err := acked.CountDocuments(ctx, bson.D{})
		return err == nil && c == n
	})
}
