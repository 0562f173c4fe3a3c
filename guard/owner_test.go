package guard

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// lockRecords returns every document of a test stack's lock collection and
// its claims, raw, read straight from the database.
func lockRecords(t *testing.T, coll string) []bson.Raw {
	t.Helper()
	ctx := context.Background()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(ctx)
	var out []bson.Raw
	for _, name := range []string{coll, coll + "_claims"} {
		cur, err := c.Database("lockgate_guard_test").Collection(name).Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		for cur.Next(ctx) {
			out = append(out, append(bson.Raw(nil), cur.Current...))
		}
		cur.Close(ctx)
	}
	return out
}

// TestLockStoreKeepsNoSessionID: someone who reads the lock store (or a
// backup of it) learns nothing that lets them write as the holder (issue
// 10, item 2). The records hold neither the holder's session id nor its
// bind value, and a write that carries the owner value found there as its
// session id holds nothing.
func TestLockStoreKeepsNoSessionID(t *testing.T) {
	coll, pol := protected(t, 2)
	lockColl := "locks_owner_" + coll
	st := startStackWith(t, stackOptions{collection: lockColl, policy: pol})
	holder := connect(t, st.uri, "holder")
	s := session(t, holder)
	_, lsid := s.ID().Lookup("id").Binary()
	const bind = "holder-private-bind-value"
	if _, err := run(t, holder, s, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"bind", bind}}); err != nil {
		t.Fatal(err)
	}
	recs := lockRecords(t, lockColl)
	if len(recs) == 0 {
		t.Fatal("no lock records to inspect")
	}
	var stored []byte
	for _, r := range recs {
		if bytes.Contains(r, lsid) {
			t.Errorf("a lock record contains the holder's session id: %v", r)
		}
		if bytes.Contains(r, []byte(bind)) {
			t.Errorf("a lock record contains the holder's bind value: %v", r)
		}
		if _, data, ok := r.Lookup("owner").BinaryOK(); ok && len(data) > 0 {
			stored = data
		}
	}
	if stored == nil {
		t.Fatal("no owner value in the lock records")
	}

	// The attacker replays what it read as its own session id, with the
	// binding too, on a raw connection (a driver would add its own lsid).
	forged := bson.D{{"update", coll}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", 1}}}, {"u", bson.D{{"$set", bson.D{{"x", "forged"}}}}}}}},
		{"lsid", bson.D{{"id", primitive.Binary{Subtype: 4, Data: stored}}}}, {"comment", "lockgate:" + bind}, {"$db", "shop"}}
	if reply := rawCommand(t, st.addr, forged); fmt.Sprint(reply["code"]) != "46" {
		t.Errorf("a write as the stored owner value: %v, want LockBusy", reply)
	}
	// The holder itself, on a raw connection with its real session id
	// and binding, still holds it: the check above refused for the right
	// reason.
	real := bson.D{{"update", coll}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", 1}}}, {"u", bson.D{{"$set", bson.D{{"x", "holder"}}}}}}}},
		{"lsid", bson.D{{"id", primitive.Binary{Subtype: 4, Data: lsid}}}}, {"comment", "lockgate:" + bind}, {"$db", "shop"}}
	if reply := rawCommand(t, st.addr, real); fmt.Sprint(reply["ok"]) != "1" {
		t.Errorf("the holder's own write on a raw connection: %v", reply)
	}
}

// TestOwnerSecretIsShared: proxies that share a lock store must share the
// owner secret; with another secret the same session is a stranger, which
// keeps the lock exclusive (fail closed) but not usable (docs/SECURITY.md).
func TestOwnerSecretIsShared(t *testing.T) {
	coll, pol := protected(t, 1)
	lockColl := "locks_secret_" + coll
	a := startStackWith(t, stackOptions{noMemoryLocks: true, collection: lockColl, policy: pol})
	same := startStackWith(t, stackOptions{noMemoryLocks: true, collection: lockColl, policy: pol})
	other := startStackWith(t, stackOptions{noMemoryLocks: true, collection: lockColl, policy: pol, ownerSecret: []byte("another-owner-secret-0123456789abcdef")})
	ca := connect(t, a.uri, "app")
	s := session(t, ca)
	acquire(t, ca, s, coll, 1)
	_, lsid := s.ID().Lookup("id").Binary()
	status := bson.D{{"lockStatus", coll}, {"ids", bson.A{1}}, {"lsid", bson.D{{"id", primitive.Binary{Subtype: 4, Data: lsid}}}}, {"$db", "shop"}}
	for _, tc := range []struct {
		name string
		st   *stack
		want bool
	}{{"same secret", same, true}, {"other secret", other, false}} {
		reply := rawCommand(t, tc.st.addr, status)
		l, _ := reply["locks"].(bson.A)
		if len(l) != 1 || l[0].(bson.M)["heldByYou"] != tc.want || l[0].(bson.M)["held"] != true {
			t.Errorf("%s: %v, want held and heldByYou = %v", tc.name, reply, tc.want)
		}
	}
}

// TestConnectionOwnerMemoNeverStale: the owner key a connection remembers
// for its latest session is the one the guard's secret gives for the
// session it writes in now, whichever session it wrote in before and
// whichever guard (secret) asked last on the same connection.
func TestConnectionOwnerMemoNeverStale(t *testing.T) {
	a := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("a"), MinOwnerSecret)})
	b := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("b"), MinOwnerSecret)})
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
	lsids := [][]byte{bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16), []byte("short")}
	for i := range 30 {
		g := []*Guard{a, b}[i%2]
		if i%5 == 0 {
			g = a
		}
		lsid := lsids[(i/2)%len(lsids)]
		got, _, st := g.sessionKey(req, lsid)
		if st != nil {
			st.unlock(req)
		}
		if want := g.owners.Session("", lsid); !bytes.Equal(got, want) {
			t.Fatalf("step %d: key %x, want %x", i, got, want)
		}
	}
}

// TestWriteOwnerSharedNeverChanges: the owner a write acts as is the
// connection's shared one while it writes as the same owner, and what
// the guard derives for its user, session and binding whatever it wrote
// as before; an owner handed to an earlier write never changes.
func TestWriteOwnerSharedNeverChanges(t *testing.T) {
	g := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("a"), MinOwnerSecret)})
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	type handed struct {
		o   *lockstore.Owner
		was lockstore.Owner
	}
	var kept []handed
	write := func(step string, lsid byte, comment string) *lockstore.Owner {
		t.Helper()
		b := bsoncore.NewDocumentBuilder().AppendString("update", "c").AppendDocument("lsid", lsidOf(lsid))
		if comment != "" {
			b.AppendString("comment", comment)
		}
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.AppendString("$db", "db").Build()), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		o, ok := g.writeOwner(&proxy.Request{Message: msg, Command: cmd, Client: client}, &verdict{})
		if !ok {
			t.Fatalf("%s: no owner", step)
		}
		want := g.owners.Owner(client, g.owners.Session("", bytes.Repeat([]byte{lsid}, 16)), strings.TrimPrefix(comment, "lockgate:"))
		if !reflect.DeepEqual(*o, want) {
			t.Fatalf("%s: owner %+v, want %+v", step, *o, want)
		}
		for _, h := range kept {
			if !reflect.DeepEqual(*h.o, h.was) {
				t.Fatalf("%s: an earlier write's owner changed: %+v, was %+v", step, *h.o, h.was)
			}
		}
		kept = append(kept, handed{o, *o})
		return o
	}
	first := write("first", 1, "")
	if write("again", 1, "") != first {
		t.Fatal("the connection's owner was made again")
	}
	write("bound", 1, "lockgate:job-7")
	write("another session, bound", 2, "lockgate:job-7")
	write("another session", 2, "")
	write("the first again", 1, "")
}
