package guard

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// scramProxyStack is a test stack whose proxy relays to a scripted server
// enforcing SCRAM-SHA-256 for alice and bob (the lock store stays on the
// embedded FerretDB) and whose guard knows that the upstream requires
// authentication.
func scramProxyStack(t *testing.T) *stack {
	t.Helper()
	return scramProxyStackWith(t, config.Policy{})
}

// scramProxyStackWith is scramProxyStack under pol.
func scramProxyStackWith(t *testing.T, pol config.Policy) *stack {
	t.Helper()
	h, err := scripted.SCRAM(map[string]string{"alice": "alice-pw", "bob": "bob-pw"}, standaloneReplies)
	if err != nil {
		t.Fatal(err)
	}
	up, err := scripted.Start(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return startStackWith(t, stackOptions{upstreamAddr: up.Addr(), authRequired: func() bool { return true }, policy: pol})
}

// standaloneReplies answers a handshake as a standalone server with
// sessions does (what drivers need to connect), and anything else with ok.
func standaloneReplies(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
	if cmd == nil {
		return nil
	}
	switch cmd.Name {
	case "hello", "isMaster", "ismaster":
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendBoolean("helloOk", true).AppendBoolean("ismaster", true).
			AppendBoolean("isWritablePrimary", true).AppendInt32("maxBsonObjectSize", 16777216).AppendInt32("maxMessageSizeBytes", 48000000).
			AppendInt32("maxWriteBatchSize", 100000).AppendDateTime("localTime", time.Now().UnixMilli()).
			AppendInt32("logicalSessionTimeoutMinutes", 30).AppendInt32("minWireVersion", 0).AppendInt32("maxWireVersion", 21).
			AppendDouble("ok", 1).Build())
	}
	return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", 0).AppendDouble("ok", 1).Build())
}

// rawConn is a wire connection that can authenticate by hand, so that a
// test can choose its lsid (a driver always picks its own).
type rawConn struct {
	t  *testing.T
	c  net.Conn
	r  *bufio.Reader
	id int32
}

func dialRawConn(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) do(cmd bson.D) bson.M {
	rc.t.Helper()
	doc, err := bson.Marshal(cmd)
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.id++
	if _, err := rc.c.Write(wire.AppendMsg(nil, rc.id, 0, 0, doc)); err != nil {
		rc.t.Fatal(err)
	}
	raw, err := wire.ReadMessage(rc.r, wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		rc.t.Fatalf("reading the reply: %v", err)
	}
	m, err := wire.Parse(append([]byte(nil), raw.Bytes...), wire.Limits{})
	raw.Release()
	if err != nil {
		rc.t.Fatal(err)
	}
	var out bson.M
	if err := bson.Unmarshal(m.(*wire.OpMsg).Body, &out); err != nil {
		rc.t.Fatal(err)
	}
	return out
}

// scramAuth runs a SCRAM-SHA-256 conversation on the connection.
func (rc *rawConn) scramAuth(user, pass string) bool {
	rc.t.Helper()
	client, err := scram.SHA256.NewClient(user, pass, "")
	if err != nil {
		rc.t.Fatal(err)
	}
	conv := client.NewConversation()
	first, _ := conv.Step("")
	r := rc.do(bson.D{{"saslStart", 1}, {"mechanism", "SCRAM-SHA-256"}, {"payload", primitive.Binary{Data: []byte(first)}}, {"$db", "admin"}})
	for fmt.Sprint(r["ok"]) == "1" && r["done"] != true {
		payload := r["payload"].(primitive.Binary).Data
		next, err := conv.Step(string(payload))
		if err != nil {
			return false
		}
		r = rc.do(bson.D{{"saslContinue", 1}, {"conversationId", r["conversationId"]}, {"payload", primitive.Binary{Data: []byte(next)}}, {"$db", "admin"}})
	}
	return fmt.Sprint(r["ok"]) == "1"
}

func lsidDoc(id []byte) bson.D { return bson.D{{"id", primitive.Binary{Subtype: 4, Data: id}}} }

// TestLocksBelongToTheAuthenticatedUser: where the upstream requires
// authentication, a connection that has not authenticated cannot take,
// renew or inspect locks (issue 10, item 4), and a lock taken by session S
// as alice is not held by the same S on a connection authenticated as bob,
// or by bob's endSessions naming S (item 3).
func TestLocksBelongToTheAuthenticatedUser(t *testing.T) {
	st := scramProxyStack(t)
	lsid := []byte("0123456789abcdef")
	acquire := bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"lsid", lsidDoc(lsid)}, {"$db", "shop"}}
	status := bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1}}, {"lsid", lsidDoc(lsid)}, {"$db", "shop"}}

	anon := dialRawConn(t, st.addr)
	if r := anon.do(acquire); fmt.Sprint(r["code"]) != "13" {
		t.Fatalf("acquireLock before authenticating: %v, want Unauthorized (13)", r)
	}

	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate through the proxy")
	}
	if r := alice.do(acquire); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}

	bob := dialRawConn(t, st.addr)
	if !bob.scramAuth("bob", "bob-pw") {
		t.Fatal("bob could not authenticate through the proxy")
	}
	r := bob.do(status)
	locks, _ := r["locks"].(bson.A)
	if len(locks) != 1 || locks[0].(bson.M)["held"] != true || locks[0].(bson.M)["heldByYou"] != false {
		t.Fatalf("alice's session id on bob's connection: %v, want held but not by you", r)
	}
	if owner, _ := locks[0].(bson.M)["holder"].(bson.M); owner["user"] != "alice@admin" {
		t.Errorf("lockStatus names the holder %v, want user alice@admin", owner)
	}
	bob.do(bson.D{{"endSessions", bson.A{lsidDoc(lsid)}}, {"$db", "admin"}})
	r = alice.do(status)
	if locks, _ := r["locks"].(bson.A); len(locks) != 1 || locks[0].(bson.M)["heldByYou"] != true {
		t.Fatalf("after bob's endSessions naming alice's session: %v, want alice still holding it", r)
	}

	// A refused conversation leaves the connection unauthenticated.
	mallory := dialRawConn(t, st.addr)
	if mallory.scramAuth("alice", "guess") {
		t.Fatal("a wrong password was accepted")
	}
	if r := mallory.do(status); fmt.Sprint(r["code"]) != "13" {
		t.Fatalf("lockStatus after a refused conversation: %v, want Unauthorized (13)", r)
	}
}

// TestSessionMemoIsTheUsers: the guard keeps each session's memos (its
// owner key, its lock checks) for its next write on any connection, keyed
// by the user as well as the lsid: bob, sending the lsid of alice's
// session on his own connection right after her writes warmed its memos,
// writes as bob in that session, which holds nothing, and is refused,
// again and again between her writes. A memo keyed by the lsid alone
// would hand him alice's owner and let his writes through.
func TestSessionMemoIsTheUsers(t *testing.T) {
	st := scramProxyStackWith(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	lsid := []byte("0123456789abcdef")
	update := bson.D{{"update", "orders"}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", 1}}}, {"u", bson.D{{"$set", bson.D{{"x", 1}}}}}}}},
		{"lsid", lsidDoc(lsid)}, {"$db", "shop"}}
	alice, bob := dialRawConn(t, st.addr), dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") || !bob.scramAuth("bob", "bob-pw") {
		t.Fatal("alice or bob could not authenticate through the proxy")
	}
	if r := alice.do(bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"lsid", lsidDoc(lsid)}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}
	for i := range 3 {
		if r := alice.do(update); fmt.Sprint(r["ok"]) != "1" {
			t.Fatalf("round %d: alice's write in her session: %v", i, r)
		}
		if r := bob.do(update); fmt.Sprint(r["ok"]) == "1" {
			t.Fatalf("round %d: bob's write with alice's lsid was let through: %v", i, r)
		}
	}
}

// TestYouMayLockOnlyWhatYouMayWrite: where the upstream enforces
// authorization, acquireLock needs the caller's own update privilege on
// the namespace, decided by the upstream on the caller's own connection
// (issue 10, item 4): bob, who may write nothing, cannot lock alice's
// documents (a denial of service otherwise); alice can. The verdict is
// asked once per connection and namespace.
func TestYouMayLockOnlyWhatYouMayWrite(t *testing.T) {
	up, err := scripted.StartPerConn(func() scripted.Handler {
		h, err := scripted.SCRAMAuthz(map[string]string{"alice": "alice-pw", "bob": "bob-pw"},
			map[string][]string{"alice": {"shop.orders"}}, nil,
			func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
				if cmd == nil {
					return nil
				}
				return s.Reply(req, bsoncore.NewDocumentBuilder().AppendBoolean("isWritablePrimary", true).AppendInt32("maxWireVersion", 21).AppendDouble("ok", 1).Build())
			})
		if err != nil {
			panic(err)
		}
		return h
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	st := startStackWith(t, stackOptions{upstreamAddr: up.Addr(), authRequired: func() bool { return true }})
	acquire := func(lsid string, id int) bson.D {
		return bson.D{{"acquireLock", "orders"}, {"ids", bson.A{id}}, {"lsid", lsidDoc([]byte(lsid))}, {"$db", "shop"}}
	}

	bob := dialRawConn(t, st.addr)
	if !bob.scramAuth("bob", "bob-pw") {
		t.Fatal("bob could not authenticate")
	}
	if r := bob.do(acquire("bob-session-0001", 1)); fmt.Sprint(r["code"]) != "13" {
		t.Fatalf("bob's acquireLock on a namespace he may not write: %v, want Unauthorized (13)", r)
	}
	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	for i := 1; i <= 2; i++ {
		if r := alice.do(acquire("alice-session-01", i)); fmt.Sprint(r["ok"]) != "1" {
			t.Fatalf("alice's acquireLock %d: %v", i, r)
		}
	}
	probes := 0
	for _, b := range up.Requests() {
		if bytes.Contains(b, []byte("lockgateAuthorizationProbe")) {
			probes++
		}
	}
	if probes != 2 {
		t.Errorf("%d authorization probes reached the upstream, want 2 (one per connection and namespace)", probes)
	}
}

// TestResolutionNeedsTheCallersReadAccess: a write whose filter names no
// _id is resolved with the proxy's own credentials, so where the upstream
// enforces authorization the caller must itself be allowed to read the
// namespace (issue 10, item 5: the resolver was an oracle on data the
// caller could not read). carol may write shop.orders but not read it;
// alice may do both.
func TestResolutionNeedsTheCallersReadAccess(t *testing.T) {
	up, err := scripted.StartPerConn(func() scripted.Handler {
		h, err := scripted.SCRAMAuthz(map[string]string{"alice": "alice-pw", "carol": "carol-pw"},
			map[string][]string{"alice": {"shop.secrets"}, "carol": {"shop.secrets"}},
			map[string][]string{"alice": {"shop.secrets"}},
			func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
				if cmd == nil {
					return nil
				}
				return s.Reply(req, bsoncore.NewDocumentBuilder().AppendBoolean("isWritablePrimary", true).AppendInt32("maxWireVersion", 21).AppendInt32("n", 0).AppendDouble("ok", 1).Build())
			})
		if err != nil {
			panic(err)
		}
		return h
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, Namespaces: []config.NamespaceRule{{Match: "shop.secrets", Mode: config.ModeEnforce}}}
	st := startStackWith(t, stackOptions{upstreamAddr: up.Addr(), authRequired: func() bool { return true }, policy: pol})
	update := func(lsid string) bson.D {
		return bson.D{{"update", "secrets"}, {"updates", bson.A{bson.D{{"q", bson.D{{"secret", bson.D{{"$regex", "^a"}}}}}, {"u", bson.D{{"$set", bson.D{{"x", 1}}}}}, {"multi", true}}}},
			{"lsid", lsidDoc([]byte(lsid))}, {"$db", "shop"}}
	}
	carol := dialRawConn(t, st.addr)
	if !carol.scramAuth("carol", "carol-pw") {
		t.Fatal("carol could not authenticate")
	}
	r := carol.do(update("carol-session-01"))
	if fmt.Sprint(r["code"]) != "46" || !strings.Contains(fmt.Sprint(r["errmsg"]), "may not read shop.secrets") {
		t.Fatalf("carol's filter on data she may not read: %v, want a refusal saying so", r)
	}
	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	if r := alice.do(update("alice-session-01")); strings.Contains(fmt.Sprint(r["errmsg"]), "may not read") {
		t.Fatalf("alice, who may read, was refused for it: %v", r)
	}
}

// TestAuthenticatedLocksWithOtherDrivers: the same rules through pymongo
// and the Node.js driver authenticating with SCRAM-SHA-256 through the
// proxy: without credentials acquireLock is Unauthorized (13); as alice
// it succeeds and lockStatus names alice@admin as the holder; a wrong
// password does not authenticate.
func TestAuthenticatedLocksWithOtherDrivers(t *testing.T) {
	st := scramProxyStack(t)
	host := st.addr
	scripts := map[string][]string{
		"pymongo": {"/usr/bin/python3", "-c", `
import sys, pymongo
from pymongo.errors import OperationFailure
host = sys.argv[1]
anon = pymongo.MongoClient("mongodb://%s/?directConnection=true" % host, serverSelectionTimeoutMS=5000)
with anon.start_session() as s:
    try:
        anon.shop.command({"acquireLock": "orders", "ids": [7]}, session=s)
        print("anon ALLOWED")
    except OperationFailure as e:
        print("anon", e.code)
alice = pymongo.MongoClient("mongodb://alice:alice-pw@%s/?directConnection=true&authMechanism=SCRAM-SHA-256" % host, serverSelectionTimeoutMS=5000)
with alice.start_session() as s:
    alice.shop.command({"acquireLock": "orders", "ids": [7]}, session=s)
    st = alice.shop.command({"lockStatus": "orders", "ids": [7]}, session=s)
    print("alice", st["locks"][0]["heldByYou"], st["locks"][0]["holder"]["user"])
wrong = pymongo.MongoClient("mongodb://alice:nope@%s/?directConnection=true&authMechanism=SCRAM-SHA-256" % host, serverSelectionTimeoutMS=5000)
try:
    wrong.shop.command({"ping": 1})
    print("wrong ALLOWED")
except OperationFailure as e:
    print("wrong", e.code)
`, host},
		"node": {"node", "-e", `
const { MongoClient } = require('mongodb');
(async () => {
  const host = process.argv[1];
  const anon = new MongoClient('mongodb://' + host + '/?directConnection=true', { serverSelectionTimeoutMS: 5000 });
  let s = anon.startSession();
  try { await anon.db('shop').command({ acquireLock: 'orders', ids: [8] }, { session: s }); console.log('anon ALLOWED'); }
  catch (e) { console.log('anon', e.code); }
  await s.endSession(); await anon.close();
  const alice = new MongoClient('mongodb://alice:alice-pw@' + host + '/?directConnection=true&authMechanism=SCRAM-SHA-256', { serverSelectionTimeoutMS: 5000 });
  s = alice.startSession();
  await alice.db('shop').command({ acquireLock: 'orders', ids: [8] }, { session: s });
  const st = await alice.db('shop').command({ lockStatus: 'orders', ids: [8] }, { session: s });
  console.log('alice', st.locks[0].heldByYou ? 'True' : 'False', st.locks[0].holder.user);
  await s.endSession(); await alice.close();
  const wrong = new MongoClient('mongodb://alice:nope@' + host + '/?directConnection=true&authMechanism=SCRAM-SHA-256', { serverSelectionTimeoutMS: 5000 });
  try { await wrong.db('shop').command({ ping: 1 }); console.log('wrong ALLOWED'); }
  catch (e) { console.log('wrong', e.code); }
  await wrong.close();
})();
`, host},
	}
	nodeDir := filepath.Join("..", "tests", "compat", "node")
	// Checked before running the script, so that a checkout without the
	// driver says what to install instead of failing on Python's
	// ImportError or Node's MODULE_NOT_FOUND.
	missing := map[string]func() error{
		"pymongo": testkit.Pymongo,
		"node":    func() error { return testkit.NodeModule(filepath.Join(nodeDir, "node_modules"), "mongodb") },
	}
	for _, name := range []string{"pymongo", "node"} {
		t.Run(name, func(t *testing.T) {
			args := scripts[name]
			testkit.RequireTool(t, name, missing[name]())
			cmd := exec.Command(args[0], args[1:]...)
			if name == "node" {
				cmd.Dir = nodeDir
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got, want := strings.TrimSpace(string(out)), "anon 13\nalice True alice@admin\nwrong 18"; got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
