package guard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/xdg-go/scram"

	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestClientSuppliedUIDIsIgnored: MongoDB's session identity is (lsid.id,
// uid), uid being SHA-256 of the authenticated user, and the server never
// takes a uid from a client; neither does lockgate (issue 10, item 3). bob,
// sending alice's session id with the uid of alice@admin, holds none of
// alice's locks and cannot take them; alice, sending a uid of nonsense,
// still holds hers.
func TestClientSuppliedUIDIsIgnored(t *testing.T) {
	st := scramProxyStack(t)
	id := []byte("fedcba9876543210")
	aliceUID := sha256.Sum256([]byte("alice@admin"))
	withUID := func(uid []byte) bson.D {
		return bson.D{{"id", primitive.Binary{Subtype: 4, Data: id}}, {"uid", primitive.Binary{Data: uid}}}
	}
	cmd := func(name string, lsid bson.D) bson.D {
		return bson.D{{name, "orders"}, {"ids", bson.A{1}}, {"lsid", lsid}, {"$db", "shop"}}
	}

	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	if r := alice.do(cmd("acquireLock", lsidDoc(id))); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}
	bob := dialRawConn(t, st.addr)
	if !bob.scramAuth("bob", "bob-pw") {
		t.Fatal("bob could not authenticate")
	}
	r := bob.do(cmd("lockStatus", withUID(aliceUID[:])))
	if locks, _ := r["locks"].(bson.A); len(locks) != 1 || locks[0].(bson.M)["heldByYou"] != false {
		t.Fatalf("bob with alice's session id and uid: %v, want held, not by him", r)
	}
	if r := bob.do(cmd("acquireLock", withUID(aliceUID[:]))); fmt.Sprint(r["code"]) != "46" {
		t.Fatalf("bob's acquireLock with alice's session id and uid: %v, want LockBusy (46)", r)
	}
	r = alice.do(cmd("lockStatus", withUID(bytes.Repeat([]byte{7}, 32))))
	if locks, _ := r["locks"].(bson.A); len(locks) != 1 || locks[0].(bson.M)["heldByYou"] != true {
		t.Fatalf("alice with a uid of nonsense: %v, want her lock still hers", r)
	}
}

// TestAuthorizationVerdictFollowsTheUser: the upstream's verdict that a
// connection may write a namespace is cached for the connection's user
// only (issue 10, item 4): when the connection authenticates again as
// another user, or logs out, the verdict goes with the user. alice may
// write shop.orders, bob may not; on one connection, alice locks, then
// the same connection re-authenticated as bob may not lock, and after
// logout it may not either.
func TestAuthorizationVerdictFollowsTheUser(t *testing.T) {
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

	c := dialRawConn(t, st.addr)
	if !c.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	if r := c.do(acquire("alice-session-02", 1)); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}
	if !c.scramAuth("bob", "bob-pw") {
		t.Fatal("bob could not authenticate on alice's connection")
	}
	if r := c.do(acquire("bob-session-0002", 2)); fmt.Sprint(r["code"]) != "13" {
		t.Fatalf("bob's acquireLock on the connection alice authenticated first: %v, want Unauthorized (13)", r)
	}
	c.do(bson.D{{"logout", 1}, {"$db", "admin"}})
	if r := c.do(acquire("anon-session-002", 3)); fmt.Sprint(r["code"]) != "13" {
		t.Fatalf("acquireLock after logout: %v, want Unauthorized (13)", r)
	}
}

// TestInterleavedConversationsCreditNoClaimedUser: a user counts only for
// the conversation that claimed it (issue 10, item 3). mallory, who knows
// bob's password, opens a SCRAM conversation as bob, then opens a second
// one claiming alice, then finishes bob's: the upstream (this scripted one
// keeps both open) accepts bob's proof, and the proxy must not credit
// alice, whose session's locks mallory would then hold.
func TestInterleavedConversationsCreditNoClaimedUser(t *testing.T) {
	st := scramProxyStack(t)
	lsid := lsidDoc([]byte("alice-interleave"))
	status := bson.D{{"lockStatus", "orders"}, {"ids", bson.A{9}}, {"lsid", lsid}, {"$db", "shop"}}

	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	if r := alice.do(bson.D{{"acquireLock", "orders"}, {"ids", bson.A{9}}, {"lsid", lsid}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}

	m := dialRawConn(t, st.addr)
	client, err := scram.SHA256.NewClient("bob", "bob-pw", "")
	if err != nil {
		t.Fatal(err)
	}
	conv := client.NewConversation()
	first, _ := conv.Step("")
	r := m.do(bson.D{{"saslStart", 1}, {"mechanism", "SCRAM-SHA-256"}, {"payload", primitive.Binary{Data: []byte(first)}}, {"$db", "admin"}})
	bobConv := r["conversationId"]
	if fmt.Sprint(r["ok"]) != "1" || r["done"] == true {
		t.Fatalf("bob's saslStart: %v", r)
	}
	claim := m.do(bson.D{{"saslStart", 1}, {"mechanism", "SCRAM-SHA-256"}, {"payload", primitive.Binary{Data: []byte("n,,n=alice,r=mallorymallorymallory")}}, {"$db", "admin"}})
	if fmt.Sprint(claim["ok"]) != "1" {
		t.Fatalf("the first step claiming alice: %v", claim)
	}
	for fmt.Sprint(r["ok"]) == "1" && r["done"] != true {
		next, err := conv.Step(string(r["payload"].(primitive.Binary).Data))
		if err != nil {
			t.Fatal(err)
		}
		r = m.do(bson.D{{"saslContinue", 1}, {"conversationId", bobConv}, {"payload", primitive.Binary{Data: []byte(next)}}, {"$db", "admin"}})
	}
	if fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("the scripted upstream refused bob's conversation: %v", r)
	}
	r = m.do(status)
	if locks, _ := r["locks"].(bson.A); len(locks) == 1 && locks[0].(bson.M)["heldByYou"] == true {
		t.Fatalf("mallory holds alice's lock after finishing bob's conversation: %v", r)
	}
}

// TestLockCommandsNeedAuthenticationGoDriver: issue 10's second attack with
// the Go driver, where the upstream requires authentication: without
// credentials acquireLock and renewLock are Unauthorized (13) and take
// nothing; authenticated as alice (SCRAM-SHA-256, speculative in the
// handshake) the same session takes the lock, and lockStatus names her.
func TestLockCommandsNeedAuthenticationGoDriver(t *testing.T) {
	st := scramProxyStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := func(cred *options.Credential) *mongo.Client {
		o := options.Client().ApplyURI("mongodb://" + st.addr + "/?directConnection=true").SetServerSelectionTimeout(5 * time.Second)
		if cred != nil {
			o.SetAuth(*cred)
		}
		c, err := mongo.Connect(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Disconnect(context.Background()) })
		return c
	}
	anon := client(nil)
	s := session(t, anon)
	for _, name := range []string{"acquireLock", "renewLock"} {
		err := anon.Database("shop").RunCommand(inSession(s), bson.D{{name, "orders"}, {"ids", bson.A{21}}}).Err()
		if se, ok := err.(mongo.ServerError); !ok || !se.HasErrorCode(13) {
			t.Errorf("%s without credentials: %v, want Unauthorized (13)", name, err)
		}
	}
	alice := client(&options.Credential{Username: "alice", Password: "alice-pw", AuthMechanism: "SCRAM-SHA-256", AuthSource: "admin"})
	as := session(t, alice)
	if err := alice.Database("shop").RunCommand(inSession(as), bson.D{{"acquireLock", "orders"}, {"ids", bson.A{21}}}).Err(); err != nil {
		t.Fatalf("alice's acquireLock: %v (the anonymous attempt must have taken nothing)", err)
	}
	var st2 bson.M
	if err := alice.Database("shop").RunCommand(inSession(as), bson.D{{"lockStatus", "orders"}, {"ids", bson.A{21}}}).Decode(&st2); err != nil {
		t.Fatal(err)
	}
	l := st2["locks"].(bson.A)[0].(bson.M)
	if l["heldByYou"] != true || l["holder"].(bson.M)["user"] != "alice@admin" {
		t.Errorf("lockStatus: %v, want held by alice@admin", st2)
	}
}
