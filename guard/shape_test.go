package guard

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestLockCommandFieldTypes: every field a lock command reads answers a
// wrong type with TypeMismatch (14), the server's code, never a panic or a
// misleading "no session" (issue 12, deliverable 5).
func TestLockCommandFieldTypes(t *testing.T) {
	g := New(Options{Store: unavailableStore{}, OrderTimeout: time.Millisecond})
	for i, cmd := range []bson.D{
		{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"lsid", bson.D{{"id", "not a uuid"}}}, {"$db", "shop"}},
		{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"lsid", bson.D{{"x", 1}}}, {"$db", "shop"}},
		{{"lockStatus", "orders"}, {"ids", bson.A{1}}, {"lsid", bson.D{{"id", primitive.Binary{Subtype: 0, Data: []byte{1}}}}}, {"$db", "shop"}},
		{{"acquireLock", "orders"}, {"ids", bson.A{1}}, {"bind", true}, {"$db", "shop"}},
		{{"renewLock", "orders"}, {"ids", "1"}, {"$db", "shop"}},
		{{"releaseLock", bson.A{"orders"}}, {"$db", "shop"}},
		{{"endSessions", "all"}, {"$db", "admin"}},
	} {
		body, err := bson.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		d := g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: c, Client: &proxy.ClientInfo{ID: uint64(i + 1)}})
		if d.Action != proxy.Reply {
			t.Fatalf("%v: action %v, want a reply", cmd, d.Action)
		}
		code, _ := bsoncore.Document(d.Reply).Lookup("code").AsInt64OK()
		if code != int64(mongoerr.TypeMismatch) {
			t.Errorf("%v: code %d (%v), want TypeMismatch", cmd, code, bsoncore.Document(d.Reply))
		}
	}
}
