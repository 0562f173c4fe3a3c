package tests

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestClientDisconnectMidMessage plays clients that vanish part-way: after
// half a header, after a header and half a body, and right after sending a
// complete request without reading the reply. The proxy must release each
// connection (its open-connections gauge returns to where it was), keep
// serving a client that was connected all along, and serve a new client.
func TestClientDisconnectMidMessage(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, time.Minute)
	name := dbName(t)

	steady := connect(t, g.URI).Database(name).Collection("c")
	if err := steady.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := steady.InsertOne(ctx, bson.D{{Key: "_id", Value: "before"}}); err != nil {
		t.Fatal(err)
	}
	open := func() float64 { return g.metricValue(t, "lockgate_client_connections", nil) }
	before := open()

	ping := opMsgBytes(1, bsoncore.NewDocumentBuilder().AppendInt32("ping", 1).AppendString("$db", "admin").Build())
	insert := opMsgBytes(2, bsoncore.NewDocumentBuilder().
		AppendString("insert", "c").
		AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(
			bsoncore.NewDocumentBuilder().AppendString("_id", "raw-unread").Build()).Build()).
		AppendString("$db", name).Build())
	lying := make([]byte, 16)
	binary.LittleEndian.PutUint32(lying, 1000) // claims 1000 bytes, sends 16
	binary.LittleEndian.PutUint32(lying[12:], opMsg)

	cases := []struct {
		name string
		send []byte
	}{
		{"half a header", ping[:8]},
		{"header and half a body", ping[:16+(len(ping)-16)/2]},
		{"header promising more than sent", append(lying, make([]byte, 100)...)},
		{"complete request, reply never read", insert},
	}
	for _, tc := range cases {
		c, err := net.DialTimeout("tcp", g.ProxyAddr().String(), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: dial: %v", tc.name, err)
		}
		if _, err := c.Write(tc.send); err != nil {
			t.Fatalf("%s: write: %v", tc.name, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("%s: close: %v", tc.name, err)
		}
	}

	testkit.Eventually(t, 10*time.Second, "the proxy to release the abandoned connections (lockgate_client_connections back to its earlier value)", func() bool {
		return open() == before
	})

	// The connection that was open all along still works.
	if _, err := steady.InsertOne(ctx, bson.D{{Key: "_id", Value: "after"}}); err != nil {
		t.Fatalf("existing client after the abandoned connections: %v", err)
	}
	// A new client works, and sees every acknowledged write. The unread
	// insert was complete, so it may or may not have been applied; nothing
	// else may have been written.
	fresh := connect(t, g.URI).Database(name).Collection("c")
	n, err := fresh.CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"before", "after"}}}}})
	if err != nil {
		t.Fatalf("new client after the abandoned connections: %v", err)
	}
	if n != 2 {
		t.Fatalf("new client sees %d of the 2 acknowledged documents", n)
	}
	total, err := fresh.CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if total != 2 && total != 3 {
		t.Fatalf("%d documents in the collection, want 2 or 3", total)
	}
}
