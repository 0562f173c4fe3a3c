package reliability

import (
	"bytes"
	"crypto/rand"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
)

// Environment of TestPausedProxy's child gateway (see runChildGateway):
// its lock store, and whether it fences.
const (
	envChildStoreURI = "LOCKGATE_RELIABILITY_CHILD_STORE"
	envChildFence    = "LOCKGATE_RELIABILITY_CHILD_FENCE"
)

// childStaleConfig applies TestPausedProxy's settings to a child gateway.
func childStaleConfig(cfg *config.Config) {
	if uri := os.Getenv(envChildStoreURI); uri != "" {
		cfg.Lockstore.URI = uri
		cfg.Policy.LeaseMarginMS = 50
	}
	if os.Getenv(envChildFence) != "" && len(cfg.Policy.Namespaces) > 0 {
		cfg.Policy.Namespaces[0].Fence = config.FenceDocument
	}
}

// TestPausedProxy: a lockgate process is stopped (SIGSTOP) right after it
// forwarded an enforced update, which the database receives 2 s later
// (held by a relay, as a busy server would); the 500 ms lease ends while
// the process cannot renew it, a second session takes the lock through
// another lockgate and writes, and the process is continued (SIGCONT).
// Without the fence the stale update lands over the current holder's
// write; with it the database refuses it and the stale client gets the
// fenced-out error once its proxy runs again.
//
// Not parallel: the second session must take the lock and write within
// the relay's 2 s, after the 500 ms lease. Its two cases, each with its
// own child, relay and gateway, run beside each other only.
func TestPausedProxy(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := "without fence"
		if fence {
			name = "with fence"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			coll := uniq("paused")
			ns := "fence." + coll
			locks := uniq("locks")
			relay := newFaultRelay(t, upstream.Addr(), slowMarker, 2*time.Second)
			held := make(chan struct{}, 1)
			relay.onMarked = func() {
				select {
				case held <- struct{}{}:
				default:
				}
			}
			forwarded := make(chan struct{}, 1)
			relay.onForwarded = func() {
				select {
				case forwarded <- struct{}{}:
				default:
				}
			}
			env := []string{envChildStoreURI + "=" + upstream.URI(), envChildFence + "="}
			if fence {
				env[1] += "1"
			}
			child := startChildGateway(t, "mongodb://"+relay.Addr()+"/", locks, ns, env...)
			cfg2 := fencedConfig(upstream.URI(), ns, fence)
			cfg2.Lockstore.Collection = locks
			g2 := startGateway(t, cfg2)
			ctx := testCtx(t, time.Minute)
			direct := connect(t, upstream.URI(), "seed").Database("fence").Collection(coll)
			if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: "X"}, {Key: "v", Value: "start"}}); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp", child.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			lsid := make([]byte, 16)
			rand.Read(lsid)
			session := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, lsid).Build()
			ids := bsoncore.NewArrayBuilder().AppendString("X").Build()
			if _, err := c.Write(rawCmd(1, session, "fence", func(b *bsoncore.DocumentBuilder) {
				b.AppendString("acquireLock", coll).AppendArray("ids", ids).AppendInt32("leaseMS", 500)
			})); err != nil {
				t.Fatal(err)
			}
			if r := readBody(t, c); !bytes.Contains(r, []byte("token")) {
				t.Fatalf("acquireLock: %v", bsoncore.Document(r))
			}
			update := bsoncore.NewDocumentBuilder().
				AppendDocument("q", bsoncore.NewDocumentBuilder().AppendString("_id", "X").Build()).
				AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set",
					bsoncore.NewDocumentBuilder().AppendString("v", "stale holder").Build()).Build()).Build()
			if _, err := c.Write(rawCmd(2, session, "fence", func(b *bsoncore.DocumentBuilder) {
				b.AppendString("update", coll).AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(update).Build()).
					AppendString("comment", slowMarker)
			})); err != nil {
				t.Fatal(err)
			}
			// Stopped only once the update has left the proxy and the relay
			// holds it: stopped earlier, the proxy would refuse it as late
			// when continued, and the run would test nothing.
			select {
			case <-held:
			case <-time.After(20 * time.Second):
				t.Fatal("the update never reached the relay")
			}
			if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := true
			defer func() {
				if stopped {
					child.cmd.Process.Signal(syscall.SIGCONT)
				}
			}()

			second := connect(t, g2.URI, "second-holder")
			s, err := second.StartSession()
			if err != nil {
				t.Fatal(err)
			}
			defer s.EndSession(ctx)
			sctx := mongo.NewSessionContext(ctx, s)
			if err := second.Database("fence").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: bson.A{"X"}}, {Key: "waitMS", Value: 5000}}).Err(); err != nil {
				t.Fatalf("second holder's acquireLock while the first proxy is stopped: %v", err)
			}
			if _, err := second.Database("fence").Collection(coll).UpdateOne(sctx, bson.D{{Key: "_id", Value: "X"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: "current holder"}}}}); err != nil {
				t.Fatalf("second holder's write: %v", err)
			}
			// The held update reaches the database while the proxy is
			// stopped.
			select {
			case <-forwarded:
			case <-time.After(20 * time.Second):
				t.Fatal("the relay never passed the held update on")
			}
			child.cmd.Process.Signal(syscall.SIGCONT)
			stopped = false
			reply := readBody(t, c)
			var got struct {
				V string `bson:"v"`
			}
			if err := direct.FindOne(ctx, bson.D{{Key: "_id", Value: "X"}}).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if !fence {
				if got.V != "stale holder" {
					t.Fatalf("without the fence the paused proxy's update should land over the current holder's; X = %q, reply %v", got.V, bsoncore.Document(reply))
				}
				return
			}
			if got.V != "current holder" {
				t.Errorf("X = %q: the paused proxy's stale update landed", got.V)
			}
			if !bytes.Contains(reply, []byte("fenced out")) {
				t.Errorf("the stale client got %v, want the fenced-out error", bsoncore.Document(reply))
			}
		})
	}
}
