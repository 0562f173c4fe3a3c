package tests

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestExplicitSessionLsidReachesUpstream runs commands in an explicit
// session through the proxy, with a recording relay between the proxy and
// the upstream. The commands must succeed, and every one of them must reach
// the upstream carrying the session's lsid byte for byte: lock ownership
// (DESIGN §4) is keyed on it, and a proxy that dropped or rewrote it would
// break sessions for every client.
func TestExplicitSessionLsidReachesUpstream(t *testing.T) {
	rec := startRecorder(t, upstream.Addr())
	g := startGateway(t, rec.URI())
	ctx := testCtx(t, time.Minute)
	client := connect(t, g.URI)
	coll := client.Database(dbName(t)).Collection("s")
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}

	sess, err := client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	lsid := sess.ID()
	var got bson.M
	err = mongo.WithSession(ctx, sess, func(sc mongo.SessionContext) error {
		if _, err := coll.InsertOne(sc, bson.D{{Key: "_id", Value: "in-session"}, {Key: "v", Value: 1}}); err != nil {
			return err
		}
		if _, err := coll.UpdateOne(sc, bson.D{{Key: "_id", Value: "in-session"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}); err != nil {
			return err
		}
		if err := coll.FindOne(sc, bson.D{{Key: "_id", Value: "in-session"}}).Decode(&got); err != nil {
			return err
		}
		return coll.Database().RunCommand(sc, bson.D{{Key: "ping", Value: 1}}).Err()
	})
	if err != nil {
		t.Fatalf("commands in an explicit session through the proxy: %v", err)
	}
	if got["v"] != int32(2) {
		t.Fatalf("document read in the session: %v, want v=2", got)
	}

	// The same lsid on each command at the upstream, and only this session's
	// commands carry it.
	for _, name := range []string{"insert", "update", "find", "ping"} {
		n := 0
		for _, cmd := range rec.commands(name) {
			v, err := cmd.LookupErr("lsid")
			if err != nil {
				continue
			}
			if bytes.Equal(v.Document(), bsoncore.Document(lsid)) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d commands at the upstream carry the session's lsid %v, want exactly 1", name, n, lsid)
		}
	}
	if len(rec.commands("insert")) == 0 {
		t.Fatal("the recording relay saw no insert at all; is the proxy talking to it?")
	}
}
