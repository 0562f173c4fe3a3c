package guard

import (
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestRefusalsShowHoldersOnlyToReaders: where the upstream enforces
// authorization, a refusal names another session's lock, its holder and
// what became of it only to a caller who may read the namespace, the gate
// of lockStatus (issue 27, item 3). alice holds _id 1 of shop.orders and
// may read and write it; dave may only read it; bob may do neither; and a
// connection that has not authenticated may do nothing; erin may write it
// but not read it, so she may lock there, and learns only that _id 1 is
// busy (acquireLock must say so), not whose it is. To bob and to the
// anonymous connection, a write of _id 1 (locked) and of _id 2 (not
// locked) are refused alike, with no holder; a renewLock of either says
// the same; lockStatus is refused (13); a locked insert names no holder.
// dave sees the holder, as before. Before the gate every one of them saw
// user, client address and port, application, session tag and lease end,
// and held_by_other against not_locked told which ids were locked.
func TestRefusalsShowHoldersOnlyToReaders(t *testing.T) {
	up, err := scripted.StartPerConn(func() scripted.Handler {
		h, err := scripted.SCRAMAuthz(map[string]string{"alice": "alice-pw", "bob": "bob-pw", "dave": "dave-pw", "erin": "erin-pw"},
			map[string][]string{"alice": {"shop.orders"}, "erin": {"shop.orders"}},
			map[string][]string{"alice": {"shop.orders"}, "dave": {"shop.orders"}},
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
	pol := config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}}
	st := startStackWith(t, stackOptions{upstreamAddr: up.Addr(), authRequired: func() bool { return true }, policy: pol})

	lsid := func(s string) bson.D { return lsidDoc([]byte(s)) }
	alice := dialRawConn(t, st.addr)
	if !alice.scramAuth("alice", "alice-pw") {
		t.Fatal("alice could not authenticate")
	}
	alice.do(bson.D{{"hello", 1}, {"client", bson.D{{"application", bson.D{{"name", "alice-billing"}}}}}, {"$db", "admin"}})
	if r := alice.do(bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1, 3}}, {"lsid", lsid("alice-session-01")}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's acquireLock: %v", r)
	}
	// A last error left on _id 3 for the next holder.
	if r := alice.do(bson.D{{"releaseLock", "orders"}, {"ids", bson.A{3}}, {"error", "alice's secret failure"}, {"lsid", lsid("alice-session-01")}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) != "1" {
		t.Fatalf("alice's releaseLock: %v", r)
	}
	aliceTag := ""
	if r := alice.do(bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1}}, {"lsid", lsid("alice-session-01")}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) == "1" {
		aliceTag = fmt.Sprint(r["locks"].(bson.A)[0].(bson.M)["holder"].(bson.M)["tag"])
	}
	if aliceTag == "" {
		t.Fatal("alice's lockStatus did not name her holder tag")
	}
	// What a refusal must not tell an outsider about alice's lock.
	secrets := []string{"alice", aliceTag, "127.0.0.1:", "until "}
	leaks := func(r bson.M) []string {
		var found []string
		text := fmt.Sprint(r)
		for _, s := range secrets {
			if strings.Contains(text, s) {
				found = append(found, s)
			}
		}
		if d, _ := r["lockgate"].(bson.M); d != nil && d["holder"] != nil {
			found = append(found, "lockgate.holder")
		}
		return found
	}
	update := func(id int, session string) bson.D {
		return bson.D{{"update", "orders"}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", id}}}, {"u", bson.D{{"$set", bson.D{{"x", 1}}}}}}}},
			{"lsid", lsid(session)}, {"$db", "shop"}}
	}
	// same reports whether two refusals differ only by the _id named.
	same := func(locked, free bson.M) bool {
		a := strings.ReplaceAll(fmt.Sprint(locked["errmsg"]), "_id 1", "_id 2")
		da, _ := locked["lockgate"].(bson.M)
		db, _ := free["lockgate"].(bson.M)
		return a == fmt.Sprint(free["errmsg"]) && locked["code"] == free["code"] && da != nil && db != nil && da["reason"] == db["reason"] && len(da) == len(db)
	}

	bob := dialRawConn(t, st.addr)
	if !bob.scramAuth("bob", "bob-pw") {
		t.Fatal("bob could not authenticate")
	}
	anon := dialRawConn(t, st.addr)
	for _, c := range []struct {
		who  string
		conn *rawConn
	}{{"a connection that has not authenticated", anon}, {"bob, who may not read shop.orders", bob}} {
		session := fmt.Sprintf("outsider-%07d", len(c.who))
		locked, free := c.conn.do(update(1, session)), c.conn.do(update(2, session))
		if fmt.Sprint(locked["code"]) != "46" || !strings.Contains(fmt.Sprint(locked["errmsg"]), "nothing was written") {
			t.Errorf("%s: a write of alice's locked _id 1: %v, want LockBusy (46) saying nothing was written", c.who, locked)
		}
		if l := leaks(locked); len(l) > 0 {
			t.Errorf("%s: the refusal of a write of alice's _id 1 shows %q: %v", c.who, l, locked)
		}
		if !same(locked, free) {
			t.Errorf("%s: a write of a locked _id and of an unlocked one are refused differently, which tells which is locked:\n locked: %v\n free:   %v", c.who, locked, free)
		}
		insert := func(id int) bson.M {
			return c.conn.do(bson.D{{"insert", "orders"}, {"documents", bson.A{bson.D{{"_id", id}}}}, {"lsid", lsid(session)}, {"$db", "shop"}})
		}
		locked = insert(1)
		if len(leaks(locked)) > 0 {
			t.Errorf("%s: the refusal of an insert of alice's _id 1 shows %q: %v", c.who, leaks(locked), locked)
		}
		// The database refuses a connection that has not authenticated
		// any insert; lockgate must not refuse the locked one first.
		if free = insert(2); c.conn == anon && !same(locked, free) {
			t.Errorf("%s: an insert of a locked _id and of an unlocked one are refused differently, which tells which is locked:\n locked: %v\n free:   %v", c.who, locked, free)
		}
		if r := c.conn.do(bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1, 3}}, {"lsid", lsid(session)}, {"$db", "shop"}}); fmt.Sprint(r["code"]) != "13" {
			t.Errorf("%s: lockStatus: %v, want Unauthorized (13)", c.who, r)
		}
	}
	// bob may run renewLock (he is authenticated); what it says of a lock
	// he does not hold is the same for alice's and for nobody's.
	locked := bob.do(bson.D{{"renewLock", "orders"}, {"ids", bson.A{1}}, {"lsid", lsid("bob-session-0001")}, {"$db", "shop"}})
	free := bob.do(bson.D{{"renewLock", "orders"}, {"ids", bson.A{2}}, {"lsid", lsid("bob-session-0001")}, {"$db", "shop"}})
	if fmt.Sprint(locked["code"]) != "107" || !same(locked, free) {
		t.Errorf("bob's renewLock of alice's _id 1 and of the free _id 2 differ, which tells which is locked:\n locked: %v\n free:   %v", locked, free)
	}

	erin := dialRawConn(t, st.addr)
	if !erin.scramAuth("erin", "erin-pw") {
		t.Fatal("erin could not authenticate")
	}
	if r := erin.do(bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"lsid", lsid("erin-session-001")}, {"$db", "shop"}}); fmt.Sprint(r["code"]) != "46" || len(leaks(r)) > 0 {
		t.Errorf("erin's acquireLock of alice's _id 1: %v (shows %q), want LockBusy (46) naming no holder", r, leaks(r))
	}

	// dave may read shop.orders: he sees who holds it, as before.
	dave := dialRawConn(t, st.addr)
	if !dave.scramAuth("dave", "dave-pw") {
		t.Fatal("dave could not authenticate")
	}
	r := dave.do(update(1, "dave-session-001"))
	if d, _ := r["lockgate"].(bson.M); fmt.Sprint(r["code"]) != "46" || d == nil || d["reason"] != enforce.ReasonHeldByOther ||
		fmt.Sprint(d["holder"].(bson.M)["user"]) != "alice@admin" || !strings.Contains(fmt.Sprint(r["errmsg"]), "alice-billing") {
		t.Errorf("dave's write of alice's _id 1: %v, want held_by_other naming alice and her application", r)
	}
	r = dave.do(bson.D{{"lockStatus", "orders"}, {"ids", bson.A{1, 3}}, {"lsid", lsid("dave-session-001")}, {"$db", "shop"}})
	locks, _ := r["locks"].(bson.A)
	if len(locks) != 2 || fmt.Sprint(locks[0].(bson.M)["holder"].(bson.M)["user"]) != "alice@admin" || locks[1].(bson.M)["lastError"] != "alice's secret failure" {
		t.Errorf("dave's lockStatus: %v, want alice named as the holder of _id 1 and _id 3's last error", r)
	}
}
