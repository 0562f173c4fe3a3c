package guard

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// evictingServer plays a MongoDB server's capped collections, which the
// embedded upstream does not evict on insert: each collection keeps at
// most max documents, and an insert into a full one removes the oldest
// first, as MongoDB does, naming none of them in its reply.
type evictingServer struct {
	mu   sync.Mutex
	max  int
	docs map[string][]bsoncore.Document // collection -> documents, oldest first
}

func (e *evictingServer) ids(coll string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for _, d := range e.docs[coll] {
		ids = append(ids, d.Lookup("_id").String())
	}
	return fmt.Sprint(ids)
}

func (e *evictingServer) handle(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
	if cmd == nil {
		return nil
	}
	switch cmd.Name {
	case "listCollections":
		name, _ := cmd.Body.Lookup("filter", "name").StringValueOK()
		batch := bsoncore.NewArrayBuilder()
		e.mu.Lock()
		_, ok := e.docs[name]
		e.mu.Unlock()
		if ok {
			opts := bsoncore.NewDocumentBuilder().AppendBoolean("capped", true).AppendInt64("size", 4096).AppendInt64("max", int64(e.max)).Build()
			batch.AppendDocument(bsoncore.NewDocumentBuilder().AppendString("name", name).AppendString("type", "collection").
				AppendDocument("options", opts).Build())
		}
		cursor := bsoncore.NewDocumentBuilder().AppendInt64("id", 0).AppendString("ns", cmd.DB+".$cmd.listCollections").
			AppendArray("firstBatch", batch.Build()).Build()
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendDocument("cursor", cursor).AppendDouble("ok", 1).Build())
	case "insert":
		docs, err := cmd.Documents("documents")
		if err != nil {
			return s.Reply(req, (&mongoerr.Error{Code: mongoerr.FailedToParse, Msg: err.Error()}).Document())
		}
		e.mu.Lock()
		for _, d := range docs {
			c := append(e.docs[cmd.Collection], append(bsoncore.Document(nil), d...))
			if len(c) > e.max {
				c = c[len(c)-e.max:] // the oldest go, locked or not
			}
			e.docs[cmd.Collection] = c
		}
		e.mu.Unlock()
		return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("n", int32(len(docs))).AppendDouble("ok", 1).Build())
	}
	return standaloneReplies(s, req, cmd)
}

// TestInsertIntoAFullCappedCollectionEvictsNoLockedDocument is issue 16's
// eviction on a server that evicts on insert (scripted: the embedded
// upstream does not): another session holds the lock on the oldest
// document of a full capped collection. Where the rule lets capped inserts
// through (allowCappedInserts, the defence off), an insert by a session
// without any lock evicts the locked document and the server answers ok;
// by default the same insert is refused with capped_insert and the
// collection is unchanged.
func TestInsertIntoAFullCappedCollectionEvictsNoLockedDocument(t *testing.T) {
	up := &evictingServer{max: 3, docs: map[string][]bsoncore.Document{}}
	for _, coll := range []string{"ring", "ring_open"} {
		for i := 1; i <= 3; i++ {
			up.docs[coll] = append(up.docs[coll], bsoncore.NewDocumentBuilder().AppendInt32("_id", int32(i)).Build())
		}
	}
	srv, err := scripted.Start(up.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	uri := "mongodb://" + srv.Addr() + "/?directConnection=true"
	pol := config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.ring", Mode: config.ModeEnforce},
		{Match: "shop.ring_open", Mode: config.ModeEnforce, AllowCappedInserts: true},
	}}
	st := startStackWith(t, stackOptions{policy: pol, upstreamAddr: srv.Addr(), resolver: func(Resolver) Resolver {
		rc, err := mongo.Connect(context.Background(), options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Disconnect(context.Background()) })
		return NewResolver(rc)
	}})
	holder, intruder := connect(t, st.uri, "holder"), connect(t, st.uri, "intruder")
	hs, is := session(t, holder), session(t, intruder)
	acquire(t, holder, hs, "ring", 1)
	acquire(t, holder, hs, "ring_open", 1)

	// The defence off: the locked document goes, and nobody is told.
	if _, err := intruder.Database("shop").Collection("ring_open").InsertOne(inSession(is), bson.D{{"_id", 4}}); err != nil {
		t.Fatalf("insert where allowCappedInserts is set: %v", err)
	}
	if got, want := up.ids("ring_open"), `[{"$numberInt":"2"} {"$numberInt":"3"} {"$numberInt":"4"}]`; got != want {
		t.Fatalf("the scripted server did not evict the locked document: %s, want %s", got, want)
	}

	// By default: refused, nothing evicted.
	before := up.ids("ring")
	_, err = intruder.Database("shop").Collection("ring").InsertOne(inSession(is), bson.D{{"_id", 4}})
	lockBusy(t, err, "capped collection")
	if after := up.ids("ring"); after != before {
		t.Errorf("the capped collection changed: before %s, after %s", before, after)
	}
	// The holder is refused too: an insert evicts whatever is oldest.
	_, err = holder.Database("shop").Collection("ring").InsertOne(inSession(hs), bson.D{{"_id", 5}})
	lockBusy(t, err, "capped collection")
	if after := up.ids("ring"); after != before {
		t.Errorf("the capped collection changed: before %s, after %s", before, after)
	}
}
