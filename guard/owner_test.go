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
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)))
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
	// Parallel: most of its time is its second and third lockgates'
	// first grant, a CacheTrust each; it waits beside the package's other
	// waiting tests.
	t.Parallel()
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

// TestSessionOwnerKeyNeverStale: the owner key a write acts with is the
// one its guard's secret gives for its user and session, whichever
// sessions and guards (secrets) wrote on the same connection before it,
// and however the sessions fall into the memo table's slots.
func TestSessionOwnerKeyNeverStale(t *testing.T) {
	a := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("a"), MinOwnerSecret)})
	b := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("b"), MinOwnerSecret)})
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	lsids := [][]byte{bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16), bytes.Repeat([]byte{3}, 16)}
	for i := range 30 {
		g := []*Guard{a, b}[i%2]
		if i%5 == 0 {
			g = a
		}
		if i == 20 {
			// Every session in one pair of slots: the memos push each
			// other out.
			a.sessionMemos.pairs, b.sessionMemos.pairs = 1, 1
		}
		lsid := lsids[(i/2)%len(lsids)]
		req := ownerRequest(t, client, bsoncore.NewDocumentBuilder().AppendBinary("id", 4, lsid).Build(), "")
		st := connStateOf(req)
		st.hold(req)
		o, ok := g.writeOwner(req, &verdict{})
		releaseConn(req)
		if want := g.owners.Session("", lsid); !ok || !bytes.Equal(o.Session, want) {
			t.Fatalf("step %d: key %x, want %x", i, o.Session, want)
		}
	}
}

// ownerRequest is an update in the session of the lsid document, with
// comment if not "".
func ownerRequest(t *testing.T, client *proxy.ClientInfo, lsid bsoncore.Document, comment string) *proxy.Request {
	t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendString("update", "c").AppendDocument("lsid", lsid)
	if comment != "" {
		b.AppendString("comment", comment)
	}
	return BenchRequest(t, client, b.AppendString("$db", "db").Build())
}

// TestWriteOwnerNeverChanges: the owner a write acts as is what the
// guard derives for its client, user, session and binding, whatever was
// written before it on its connection or in its session on another
// connection; it lives in the write's verdict, so an owner handed to an
// earlier write (a flight still holding it) never changes.
func TestWriteOwnerNeverChanges(t *testing.T) {
	g := New(Options{Store: memstore.New(memstore.Config{}), OwnerSecret: bytes.Repeat([]byte("a"), MinOwnerSecret)})
	clients := []*proxy.ClientInfo{{ID: 1, Addr: "127.0.0.1:5000"}, {ID: 2, Addr: "127.0.0.1:5001"}}
	type handed struct {
		o   *lockstore.Owner
		was lockstore.Owner
	}
	var kept []handed
	write := func(step string, client *proxy.ClientInfo, lsid byte, comment string) {
		t.Helper()
		req := ownerRequest(t, client, lsidOf(lsid), comment)
		st := connStateOf(req)
		st.hold(req)
		o, ok := g.writeOwner(req, &verdict{})
		if ok && st.sess == nil {
			t.Fatalf("%s: the write got no session memo", step)
		}
		releaseConn(req)
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
	}
	a, b := clients[0], clients[1]
	write("first", a, 1, "")
	write("again", a, 1, "")
	write("bound", a, 1, "lockgate:job-7")
	write("bound, on another connection", b, 1, "lockgate:job-7")
	write("bound otherwise", b, 1, "lockgate:job-8")
	write("another session, bound", a, 2, "lockgate:job-7")
	write("another session", a, 2, "")
	write("the first on the other connection", b, 1, "")
	write("the first again", a, 1, "")
}
