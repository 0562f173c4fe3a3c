package guard

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// txnUpstream is a scripted router that accepts transactions and records
// the transaction commands it executes: FerretDB has no transactions. As
// MongoDB does, it refuses commitTransaction and abortTransaction without
// autocommit: false, and such a refusal leaves the transaction open.
type txnUpstream struct {
	mu   sync.Mutex
	ends []string // "commitTransaction 3", "abortTransaction 4"
	// commitArrived, when set, is closed when a commitTransaction
	// arrives, which is then answered once holdCommit is closed.
	commitArrived, holdCommit chan struct{}
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
		if ac, ok := cmd.Body.Lookup("autocommit").BooleanOK(); !ok || ac {
			return s.Reply(req, bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", 72).
				AppendString("codeName", "InvalidOptions").AppendString("errmsg", cmd.Name+" must be run within a transaction").Build())
		}
		n, _ := cmd.Body.Lookup("txnNumber").AsInt64OK()
		u.mu.Lock()
		arrived, hold := u.commitArrived, u.holdCommit
		if cmd.Name == "commitTransaction" {
			u.commitArrived = nil
		}
		u.mu.Unlock()
		if cmd.Name == "commitTransaction" && arrived != nil {
			close(arrived)
			<-hold
		}
		u.mu.Lock()
		u.ends = append(u.ends, cmd.Name+" "+strconv.FormatInt(n, 10))
		u.mu.Unlock()
	case "update":
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", 1).AppendInt32("nModified", 1).AppendDouble("ok", 1).Build())
	case "insert":
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", 1).AppendDouble("ok", 1).Build())
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

// executed reports whether the upstream executed end (say
// "commitTransaction 1").
func (u *txnUpstream) executed(end string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Contains(u.ends, end)
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
		// The lease really runs out here (pause > lease): the time is
		// what is tested, not an ordering.
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
	// A transaction that writes only where nothing is enforced needs no
	// lock, and the driver's commit goes through.
	s := session(t, c)
	ctx := mongo.NewSessionContext(context.Background(), s)
	if err := s.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Database("shop").Collection("other").UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}); err != nil {
		t.Fatalf("write in the transaction: %v", err)
	}
	if err := s.CommitTransaction(ctx); err != nil {
		t.Fatalf("commit of a transaction on an unprotected collection: %v", err)
	}
	if got := u.last(); !strings.HasPrefix(got, "commitTransaction") {
		t.Errorf("upstream saw %q last, want the commit", got)
	}
}

func commitRequest(t *testing.T, n int64) *proxy.Request {
	t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendInt32("commitTransaction", 1).AppendInt64("txnNumber", n).
		AppendBoolean("autocommit", false).AppendDocument("lsid", flightLSID).AppendString("$db", "admin")
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.Build()), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
}

// TestTransactionsFailClosedWithoutTheLockStore: what a transaction's
// commit needs lives in the lock store; while it cannot be reached, an
// enforced statement in a transaction is refused (its needs could not be
// recorded), and so is a commit (what it needs cannot be read): the
// proxy aborts it in the commit's place. A commit of a transaction that
// recorded nothing is forwarded once the store answers.
func TestTransactionsFailClosedWithoutTheLockStore(t *testing.T) {
	g, st := flightGuard(t, 2*time.Second)
	inTxn := func(n int64) func(*bsoncore.DocumentBuilder) {
		return func(b *bsoncore.DocumentBuilder) { b.AppendInt64("txnNumber", n).AppendBoolean("autocommit", false) }
	}
	ok := bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build()
	d := g.Intercept(context.Background(), flightRequest(t, inTxn(1)))
	if d.Action != proxy.Forward || d.OnReply == nil {
		t.Fatalf("statement under its lock: %+v, want forwarded", d)
	}
	d.OnReply.Reply(context.Background(), ok)

	st.txns.SetUnavailable(errors.New("partitioned"))
	d = g.Intercept(context.Background(), commitRequest(t, 1))
	if d.Action != proxy.Rewrite || d.OnReply == nil {
		t.Fatalf("commit with the lock store unreachable: %+v, want rewritten into an abort", d)
	}
	if cmd := commandName(t, d.Message); cmd != "abortTransaction" {
		t.Errorf("sent %q in the commit's place, want abortTransaction", cmd)
	}
	if r := d.OnReply.Reply(context.Background(), ok); !strings.Contains(string(r.Lookup("errmsg").StringValue()), "commitTransaction refused") {
		t.Errorf("client answered %v, want the refusal", r)
	}
	d = g.Intercept(context.Background(), flightRequest(t, inTxn(2)))
	if d.Action != proxy.Reply || !strings.Contains(d.Reply.Lookup("errmsg").StringValue(), "could not record") {
		t.Fatalf("statement with the lock store unreachable: %+v, want refused", d)
	}

	st.txns.SetUnavailable(nil)
	if d = g.Intercept(context.Background(), commitRequest(t, 3)); d.Action != proxy.Forward {
		t.Errorf("commit of a transaction that recorded nothing: %+v, want forwarded", d)
	}
}

func commandName(t *testing.T, b []byte) string {
	t.Helper()
	msg, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Name
}

// TestForceReleaseDuringACommitsCheckRefusesIt: a transaction's commit
// whose locks were checked, and which is not yet launched, when an
// operator force-releases one of them through this proxy (the path of
// the admin API: BeginForceRelease, the store's ForceRelease) must not be
// forwarded: the lock may be another session's by then. The proxy aborts
// the transaction in the commit's place. Without the guard the commit
// leaves under the freed lock.
func TestForceReleaseDuringACommitsCheckRefusesIt(t *testing.T) {
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
	s := session(t, c)
	if _, err := run(t, c, s, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{7}}, {Key: "leaseMS", Value: 20000}}); err != nil {
		t.Fatal(err)
	}
	ctx := mongo.NewSessionContext(context.Background(), s)
	if err := s.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Database("shop").Collection("orders").UpdateOne(ctx, bson.D{{Key: "_id", Value: 7}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}); err != nil {
		t.Fatalf("write in the transaction: %v", err)
	}
	id, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	st.guard.testCommitChecked = func() {
		once.Do(func() {
			forced, err := st.guard.BeginForceRelease(context.Background(), namespace.Of("shop.orders"), id)
			if err == nil {
				_, err = st.store.ForceRelease(context.Background(), namespace.Of("shop.orders"), id, "stuck")
			}
			forced()
			if err != nil {
				t.Errorf("force-release while the commit is checked: %v", err)
			}
		})
	}
	err = s.CommitTransaction(ctx)
	if err == nil || !strings.Contains(err.Error(), "an operator force-released the lock") {
		t.Fatalf("commit checked before a force-release of its lock: %v (upstream saw %q last), want it refused", err, u.last())
	}
	if got := u.last(); !strings.HasPrefix(got, "abortTransaction") {
		t.Errorf("upstream saw %q last, want abortTransaction in place of the commit", got)
	}
}
