package reliability

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// slowMarker in a client message makes markerRelay hold that message (and,
// as a busy server would, everything behind it on its connection).
const slowMarker = "lockgate-slow-marker"

// markerRelay relays TCP to target, holding each client message that
// contains slowMarker for delay before passing it on: a stand-in for a
// server still busy with a slow query when the next requests arrive.
func markerRelay(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(c, up); c.Close() }()
			go func() {
				defer wg.Done()
				defer up.Close()
				for {
					var hdr [4]byte
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					msg := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
					copy(msg, hdr[:])
					if _, err := io.ReadFull(c, msg[4:]); err != nil {
						return
					}
					if bytes.Contains(msg, []byte(slowMarker)) {
						// The injected fault: a server busy for delay.
						time.Sleep(delay)
					}
					if _, err := up.Write(msg); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestReleaseWaitsForEarlierWrites is issue 11's lost update, as written:
// on one connection a client pipelines a slow read, an enforced update of X
// under its lock, and releaseLock of X. The proxy used to answer the
// release at once; another session then took X and wrote it, and the first
// update landed afterwards, over the new holder's work. The release must
// now be answered only after the update, and the second writer's value
// must be the one that stays.
func TestReleaseWaitsForEarlierWrites(t *testing.T) {
	t.Parallel()
	coll := uniq("order")
	ns := "rel." + coll
	cfg := gatewayConfig("mongodb://"+markerRelay(t, upstream.Addr(), 700*time.Millisecond)+"/", uniq("locks"), ns)
	cfg.Lockstore.URI = upstream.URI() // the lock store is not behind the slow relay
	g := startGateway(t, cfg)
	ctx := testCtx(t, time.Minute)

	direct := connect(t, upstream.URI(), "seed").Database("rel").Collection(coll)
	if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: "X"}, {Key: "v", Value: "start"}}); err != nil {
		t.Fatal(err)
	}

	c, err := net.Dial("tcp", g.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	lsid := make([]byte, 16)
	rand.Read(lsid)
	session := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, lsid).Build()
	cmd := func(id int32, build func(*bsoncore.DocumentBuilder)) []byte {
		b := bsoncore.NewDocumentBuilder()
		build(b)
		b.AppendDocument("lsid", session).AppendString("$db", "rel")
		return wire.AppendMsg(nil, id, 0, 0, b.Build())
	}
	ids := bsoncore.NewArrayBuilder().AppendString("X").Build()
	if _, err := c.Write(cmd(1, func(b *bsoncore.DocumentBuilder) {
		b.AppendString("acquireLock", coll).AppendArray("ids", ids).AppendInt32("leaseMS", 60000)
	})); err != nil {
		t.Fatal(err)
	}
	if r := readBody(t, c); !bytes.Contains(r, []byte("token")) {
		t.Fatalf("acquireLock: %v", bsoncore.Document(r))
	}

	// Pipelined: slow find, update X, release X.
	slowFilter := bsoncore.NewDocumentBuilder().AppendString("marker", slowMarker).Build()
	update := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendString("_id", "X").Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set",
			bsoncore.NewDocumentBuilder().AppendString("v", "first holder").Build()).Build()).Build()
	var batch []byte
	batch = append(batch, cmd(10, func(b *bsoncore.DocumentBuilder) { b.AppendString("find", coll).AppendDocument("filter", slowFilter) })...)
	batch = append(batch, cmd(11, func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", coll).AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(update).Build())
	})...)
	batch = append(batch, cmd(12, func(b *bsoncore.DocumentBuilder) { b.AppendString("releaseLock", coll).AppendArray("ids", ids) })...)
	if _, err := c.Write(batch); err != nil {
		t.Fatal(err)
	}

	// As soon as the release is answered, a second session takes X and
	// writes it: the moment the lost update used to happen.
	var order []int32
	second := connect(t, g.URI, "second-holder")
	for len(order) < 3 {
		m := readMessage(t, c)
		order = append(order, m.Header().ResponseTo)
		if m.Header().ResponseTo == 11 {
			// The first holder's write is answered: it has landed, and
			// nothing of it is still on its way to the database.
			body := m.(*wire.OpMsg).Body
			if n, _ := body.Lookup("n").AsInt64OK(); n != 1 {
				t.Fatalf("the first holder's update: %v", body)
			}
		}
		if m.Header().ResponseTo != 12 {
			continue
		}
		s, err := second.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		sctx := mongo.NewSessionContext(ctx, s)
		if err := second.Database("rel").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: bson.A{"X"}}}).Err(); err != nil {
			t.Fatalf("second holder's acquireLock right after the release: %v", err)
		}
		if _, err := second.Database("rel").Collection(coll).UpdateOne(sctx, bson.D{{Key: "_id", Value: "X"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: "second holder"}}}}); err != nil {
			t.Fatalf("second holder's write: %v", err)
		}
		s.EndSession(ctx)
	}
	if order[0] != 10 || order[1] != 11 || order[2] != 12 {
		t.Errorf("replies answered requests %v, want [10 11 12]: the release was answered before the write sent ahead of it", order)
	}
	// Every reply is in, the first write's included, so what is in the
	// database now is final: no sleep needed before looking.
	var got bson.M
	if err := direct.FindOne(ctx, bson.D{{Key: "_id", Value: "X"}}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got["v"] != "second holder" {
		t.Errorf("X = %v: the first holder's write landed after the lock had passed to the second (lost update)", got["v"])
	}
}

func readMessage(t *testing.T, c net.Conn) wire.Message {
	t.Helper()
	raw, err := wire.ReadMessage(c, wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		t.Fatalf("reading a reply: %v", err)
	}
	b := append([]byte(nil), raw.Bytes...)
	raw.Release()
	m, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readBody(t *testing.T, c net.Conn) []byte {
	t.Helper()
	m, ok := readMessage(t, c).(*wire.OpMsg)
	if !ok {
		t.Fatal("reply is not OP_MSG")
	}
	return m.Body
}
