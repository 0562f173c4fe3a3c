package guard

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/scripted"
	"github.com/lockgate/lockgate/wire"
)

// txnUpstream is a scripted router that accepts transactions and records
// the transaction commands it receives: FerretDB has no transactions.
type txnUpstream struct {
	mu   sync.Mutex
	ends []string // "commitTransaction 3", "abortTransaction 4"
}

func (u *txnUpstream) handle(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
	if cmd == nil {
		return nil
	}
	switch cmd.Name {
	case "hello", "isMaster", "ismaster":
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendBoolean("helloOk", true).AppendBoolean("ismaster", true).
			AppendBoolean("isWritablePrimary", true).AppendString("msg", "isdbgrid").AppendInt32("maxBsonObjectSize", 16777216).
			AppendInt32("maxMessageSizeBytes", 48000000).AppendInt32("maxWriteBatchSize", 100000).
			AppendDateTime("localTime", time.Now().UnixMilli()).AppendInt32("logicalSessionTimeoutMinutes", 30).
			AppendInt32("minWireVersion", 0).AppendInt32("maxWireVersion", 17).AppendDouble("ok", 1).Build())
	case "commitTransaction", "abortTransaction":
		n, _ := cmd.Body.Lookup("txnNumber").AsInt64OK()
		u.mu.Lock()
		u.ends = append(u.ends, cmd.Name+" "+string(rune('0'+n)))
		u.mu.Unlock()
	case "update":
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", 1).AppendInt32("nModified", 1).AppendDouble("ok", 1).Build())
	}
	return s.Reply(req, bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build())
}

func (u *txnUpstream) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ends) == 0 {
		return ""
	}
	return u.ends[len(u.ends)-1]
}

// TestCommitRechecksLocks: a transaction's writes are checked when sent,
// and again at commitTransaction. A commit whose locks are still held is
// forwarded; one whose locks lapsed after the writes were checked is not:
// the proxy aborts the transaction upstream instead and refuses the
// commit. (A scripted router plays the server: FerretDB has no
// transactions.)
func TestCommitRechecksLocks(t *testing.T) {
	u := &txnUpstream{}
	up, err := scripted.Start(u.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	st := startStackWith(t, stackOptions{upstreamAddr: up.Addr(), policy: config.Policy{
		Default: config.ModeOff, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	c := connect(t, st.uri, "txn")
	coll := c.Database("shop").Collection("orders")

	transact := func(id int, lease time.Duration, pause time.Duration) error {
		s := session(t, c)
		if _, err := run(t, c, s, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{id}}, {Key: "leaseMS", Value: lease.Milliseconds()}}); err != nil {
			t.Fatal(err)
		}
		ctx := mongo.NewSessionContext(context.Background(), s)
		if err := s.StartTransaction(); err != nil {
			t.Fatal(err)
		}
		if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}); err != nil {
			t.Fatalf("write in the transaction: %v", err)
		}
		time.Sleep(pause)
		return s.CommitTransaction(ctx)
	}
	if err := transact(1, 5*time.Second, 0); err != nil {
		t.Fatalf("commit under held locks: %v", err)
	}
	if got := u.last(); !strings.HasPrefix(got, "commitTransaction") {
		t.Errorf("upstream saw %q, want the commit", got)
	}
	err = transact(2, 400*time.Millisecond, 600*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "commitTransaction refused") {
		t.Fatalf("commit after the locks lapsed: %v, want the refusal", err)
	}
	if got := u.last(); !strings.HasPrefix(got, "abortTransaction") {
		t.Errorf("upstream saw %q last, want abortTransaction in place of the commit", got)
	}
}
