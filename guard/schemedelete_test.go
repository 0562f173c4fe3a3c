package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestNonHolderDeleteAfterItsMirrorLapsed: anyone may delete a lock
// record that is abandoned or absent, under a mirror lockgate takes for
// that one delete (policy.leaseMarginMS, at least 100 ms). On a loaded
// machine the delete can reach the database after that mirror lapsed,
// and a holder may have acquired the record meanwhile, through another
// proxy (removing the abandoned record as read, then inserting its own).
// Sent as the client wrote it, by _id alone, the delete then removed the
// holder's live record: a stolen lock, what tests/schemes
// TestSchemeWorkload/lockCollection's rogue did at load 15 to 20. Here
// the holder's acquire runs in that window (the hook waits for it to
// stop being busy, which it is while the mirror holds), for a record
// that was absent and for abandoned ones (deleteOne, findOneAndDelete).
func TestNonHolderDeleteAfterItsMirrorLapsed(t *testing.T) {
	db := "ndel_" + time.Now().Format("150405.000000")[7:]
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{{Match: db + ".*", Mode: config.ModeEnforce,
			Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 60000}}}}
	coll := "locks_ndel"
	s1 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	s2 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct := connect(t, upstreamURI(t), "direct").Database(db).Collection("c.lock")
	holder := connect(t, s2.uri, "holder").Database(db).Collection("c.lock")
	rogue := connect(t, s1.uri, "rogue").Database(db).Collection("c.lock")
	// Records 2 and 3 are abandoned: written straight at the database,
	// their ts older than the lease.
	for _, id := range []int32{2, 3} {
		if _, err := direct.InsertOne(ctx, bson.D{{"_id", id}, {"ts", time.Now().Add(-2 * time.Minute)}, {"aid", "gone"}}); err != nil {
			t.Fatal(err)
		}
	}
	var current, windows atomic.Int32
	s1.guard.schemes.Test = &scheme.TestHooks{
		BeforeDelete: func(ns namespace.Namespace, id docid.ID) {
			id32 := current.Load()
			acquired := testkit.Within(30*time.Second, func() bool {
				_, err := holder.InsertOne(ctx, bson.D{{"_id", id32}, {"ts", time.Now()}, {"aid", "H"}})
				return err == nil
			})
			if !acquired {
				t.Errorf("record %d: the holder's acquire never landed while the rogue's delete waited", id32)
				return
			}
			windows.Add(1)
		},
	}
	for _, id := range []int32{1, 2, 3} {
		current.Store(id)
		var deleted int64
		var err error
		if id == 3 {
			var old bson.M
			err = rogue.FindOneAndDelete(ctx, bson.D{{"_id", id}}).Decode(&old)
			if err == nil {
				deleted = 1
			} else if errors.Is(err, mongo.ErrNoDocuments) {
				err = nil
			}
		} else {
			var r *mongo.DeleteResult
			if r, err = rogue.DeleteOne(ctx, bson.D{{"_id", id}}); err == nil {
				deleted = r.DeletedCount
			}
		}
		if err != nil {
			t.Fatalf("record %d: the rogue's delete: %v", id, err)
		}
		if windows.Load() != id {
			t.Fatalf("record %d: the holder's acquire ran in %d of %d windows: the test no longer reaches the race", id, windows.Load(), id)
		}
		var rec bson.M
		err = direct.FindOne(ctx, bson.D{{"_id", id}}).Decode(&rec)
		if deleted != 0 || err != nil || rec["aid"] != "H" {
			t.Errorf("record %d: the rogue's delete, sent after its mirror lapsed, deleted %d record(s); the holder's record now: %v (%v), want it there",
				id, deleted, rec, err)
		}
	}
}
