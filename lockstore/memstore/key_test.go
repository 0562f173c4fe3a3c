package memstore_test

import (
	"context"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// TestKeysOfTwoNamespacesNeverMeet: a lock is its namespace and its _id's
// canonical key, kept apart. Joined into one string with a separator that
// a collection name may hold, the lock on 7 in "coll/#abcdefgh" and the
// lock on an ObjectId in "coll" were one record: a session holding the
// first held the second, and another was refused it.
func TestKeysOfTwoNamespacesNeverMeet(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	seven, err := docid.Of(int32(7))
	if err != nil {
		t.Fatal(err)
	}
	// The canonical key of int32 7 is 0x0a 0x01 '7'; an ObjectId's is '#'
	// and its 12 bytes, so ObjectId("abcdefgh/" + 0x0a 0x01 '7') in "db.coll"
	// spelled "db.coll/#abcdefgh/" + the key of 7.
	var oid primitive.ObjectID
	copy(oid[:], "abcdefgh/\x0a\x017")
	other, err := docid.Of(oid)
	if err != nil {
		t.Fatal(err)
	}
	a := lockstore.Owner{Session: []byte("a"), App: "a"}
	b := lockstore.Owner{Session: []byte("b"), App: "b"}
	if _, err := s.Acquire(ctx, a, namespace.Of("db.coll/#abcdefgh"), []docid.ID{seven}, 0, 0); err != nil {
		t.Fatal(err)
	}
	sts, err := s.Status(ctx, a, namespace.Of("db.coll"), []docid.ID{other})
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].Held {
		t.Errorf("%s in db.coll is held, after a lock on 7 in db.coll/#abcdefgh only", other)
	}
	if _, err := s.Acquire(ctx, b, namespace.Of("db.coll"), []docid.ID{other}, 0, 0); err != nil {
		t.Errorf("the lock on %s in db.coll is taken by a lock in another namespace: %v", other, err)
	}
}
