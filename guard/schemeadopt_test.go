package guard

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/namespace"
)

// TestAdoptionOfARecordReleasedMeanwhile: a write from a non-holder finds
// a live lock record whose mirror is free and adopts it (nobody's until
// the record's end). Through two proxies, the record's holder can delete
// it and free its mirror between that read and the adoption. An adoption
// made anyway is a lock of nothing that lasts as long as the deleted
// record would have (here a minute): every acquirer is told "busy". This
// is how alistairjevans/mongodb-locks' workers timed out in
// tests/schemes TestLibWorkload while a rogue client tried to delete
// their records.
func TestAdoptionOfARecordReleasedMeanwhile(t *testing.T) {
	db := "adopt_" + time.Now().Format("150405.000000")[7:]
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{{Match: db + ".*", Mode: config.ModeEnforce,
			Scheme: &config.Scheme{Type: config.SchemeLockCollection, Collection: "resourceLocks",
				RecordID: "lock_{_id}", ExpiresField: "ExpireAt"}}}}
	coll := "locks_adopt"
	s1 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	s2 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locksOf := func(c *mongo.Client) *mongo.Collection { return c.Database(db).Collection("resourceLocks") }
	holder := locksOf(connect(t, s2.uri, "holder"))
	rogue := locksOf(connect(t, s1.uri, "rogue"))
	next := locksOf(connect(t, s1.uri, "next"))
	// The rogue's proxy finds the lock free; the holder then takes it
	// (through the other proxy), the rogue's proxy reads its record, and
	// the holder releases it before the rogue's proxy adopts what it read.
	var steps atomic.Int32
	s1.guard.schemes.Test = &scheme.TestHooks{
		BeforeRead: func(ns namespace.Namespace, id docid.ID) {
			if steps.CompareAndSwap(0, 1) {
				if _, err := holder.InsertOne(ctx, bson.D{{"_id", "lock_1"}, {"ExpireAt", time.Now().Add(time.Minute)}}); err != nil {
					t.Errorf("the holder's acquire: %v", err)
				}
			}
		},
		BeforeAdopt: func(ns namespace.Namespace, id docid.ID) {
			if steps.CompareAndSwap(1, 2) {
				if r, err := holder.DeleteOne(ctx, bson.D{{"_id", "lock_1"}}); err != nil || r.DeletedCount != 1 {
					t.Errorf("the holder's release: %v, %+v", err, r)
				}
			}
		},
	}
	_, err := rogue.DeleteOne(ctx, bson.D{{"_id", "lock_1"}})
	lockBusy(t, err, "did not insert it")
	if steps.Load() != 2 {
		t.Fatalf("the rogue's delete went %d of the 2 steps to the adoption: the test no longer reaches the race", steps.Load())
	}

	// The record is gone: the next acquire takes the lock.
	if _, err := next.InsertOne(ctx, bson.D{{"_id", "lock_1"}, {"ExpireAt", time.Now().Add(time.Minute)}}); err != nil {
		t.Fatalf("acquire after the holder released: %v (a lock of a deleted record was adopted)", err)
	}
	if _, err := next.DeleteOne(ctx, bson.D{{"_id", "lock_1"}}); err != nil {
		t.Fatalf("release: %v", err)
	}
}
