package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestHolderDeleteAfterItsLeaseEnded: a holder's release of its lock
// record is decided while its mirror holds, and the mirror can run out
// before the delete reaches the database (a loaded machine, a client
// that released late). By then another client, through another proxy,
// may have taken the record over: removed the holder's abandoned record
// as read and inserted its own. Sent as written, by _id (or aid) alone,
// the holder's late delete removed the successor's live record. Each
// release form is run with the successor's takeover inside that window
// (the hook polls the successor's acquire until the holder's mirror has
// run out and it lands): codecentric's deleteOne, findOneAndDelete and
// release of all of a holder's records by aid (deleteMany), and
// alistairjevans/mongodb-locks' deleteOne of an ExpireAt record; and a
// non-holder's release by aid of an abandoned record.
func TestHolderDeleteAfterItsLeaseEnded(t *testing.T) {
	// Parallel: most of its time is waiting out its 1 s leases; it waits
	// beside the package's other waiting tests.
	t.Parallel()
	db := "odel_" + time.Now().Format("150405.000000")[7:]
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{
			{Match: db + "n.*", Mode: config.ModeEnforce,
				Scheme: &config.Scheme{Type: config.SchemeLockCollection, Collection: "resourceLocks",
					RecordID: "lock_{_id}", ExpiresField: "ExpireAt"}},
			{Match: db + ".*", Mode: config.ModeEnforce,
				Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 1000}},
		}}
	coll := "locks_odel"
	s1 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	s2 := startStackWith(t, stackOptions{noMemoryLocks: true, collection: coll, policy: pol})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	holderC, nextC, directC := connect(t, s1.uri, "holder"), connect(t, s2.uri, "next"), connect(t, upstreamURI(t), "direct")
	lockColl := func(c *mongo.Client) *mongo.Collection { return c.Database(db).Collection("c.lock") }
	named := func(c *mongo.Client) *mongo.Collection { return c.Database(db + "n").Collection("resourceLocks") }

	// successor takes the record over once the holder's lease ran out;
	// the hook runs it before the holder's (or rogue's) delete is sent.
	var successor atomic.Pointer[func() error]
	var windows atomic.Int32
	s1.guard.schemes.Test = &scheme.TestHooks{
		BeforeDelete: func(ns namespace.Namespace, id docid.ID) {
			f := successor.Load()
			if f == nil {
				return
			}
			if !testkit.Within(30*time.Second, func() bool { return (*f)() == nil }) {
				t.Errorf("%s: the successor's acquire never landed while the delete waited", id)
				return
			}
			windows.Add(1)
		},
	}
	type tc struct {
		name    string
		coll    func(*mongo.Client) *mongo.Collection
		id      any
		acquire func(c *mongo.Collection, aid string) error // through the proxy
		plant   bool                                        // the record is abandoned, written straight at the database
		release func(c *mongo.Collection) (int64, error)
		aid     string // the successor's aid
	}
	insertTS := func(id any) func(c *mongo.Collection, aid string) error {
		return func(c *mongo.Collection, aid string) error {
			_, err := c.InsertOne(ctx, bson.D{{"_id", id}, {"ts", time.Now()}, {"aid", aid}})
			return err
		}
	}
	deleteOne := func(id any) func(c *mongo.Collection) (int64, error) {
		return func(c *mongo.Collection) (int64, error) {
			r, err := c.DeleteOne(ctx, bson.D{{"_id", id}})
			if err != nil {
				return 0, err
			}
			return r.DeletedCount, nil
		}
	}
	cases := []tc{
		{name: "deleteOne", coll: lockColl, id: int32(1), acquire: insertTS(int32(1)), release: deleteOne(int32(1)), aid: "S"},
		{name: "findOneAndDelete", coll: lockColl, id: int32(2), acquire: insertTS(int32(2)), aid: "S",
			release: func(c *mongo.Collection) (int64, error) {
				err := c.FindOneAndDelete(ctx, bson.D{{"_id", int32(2)}}).Err()
				if errors.Is(err, mongo.ErrNoDocuments) {
					return 0, nil
				}
				return 1, err
			}},
		// The successor carries the same aid (another instance of the
		// application), once the holder's binding of it ended.
		{name: "deleteMany by aid", coll: lockColl, id: int32(3), acquire: insertTS(int32(3)), aid: "H",
			release: func(c *mongo.Collection) (int64, error) {
				r, err := c.DeleteMany(ctx, bson.D{{"aid", "H"}})
				if err != nil {
					return 0, err
				}
				return r.DeletedCount, nil
			}},
		{name: "deleteMany by aid of an abandoned record", coll: lockColl, id: int32(4), plant: true, aid: "X",
			acquire: insertTS(int32(4)),
			release: func(c *mongo.Collection) (int64, error) {
				r, err := c.DeleteMany(ctx, bson.D{{"aid", "X"}})
				if err != nil {
					return 0, err
				}
				return r.DeletedCount, nil
			}},
		{name: "ExpireAt deleteOne", coll: named, id: "lock_5",
			acquire: func(c *mongo.Collection, _ string) error {
				// alistairjevans/mongodb-locks' acquire, with a short expiry.
				err := c.FindOneAndUpdate(ctx, bson.D{{"_id", "lock_5"}},
					bson.D{{"$setOnInsert", bson.D{{"_id", "lock_5"}, {"ExpireAt", time.Now().Add(time.Second)}}}},
					options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)).Err()
				if errors.Is(err, mongo.ErrNoDocuments) {
					return nil // null: acquired
				}
				if err == nil {
					return errors.New("busy")
				}
				return err
			},
			release: deleteOne("lock_5")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			successor.Store(nil)
			if c.plant {
				if _, err := c.coll(directC).InsertOne(ctx, bson.D{{"_id", c.id}, {"ts", time.Now().Add(-time.Minute)}, {"aid", c.aid}}); err != nil {
					t.Fatal(err)
				}
			} else if err := c.acquire(c.coll(holderC), "H"); err != nil {
				t.Fatalf("the holder's acquire: %v", err)
			}
			next := c.coll(nextC)
			f := func() error { return c.acquire(next, c.aid) }
			successor.Store(&f)
			before := windows.Load()
			deleted, err := c.release(c.coll(holderC))
			successor.Store(nil)
			if err != nil {
				t.Fatalf("the late release: %v", err)
			}
			if windows.Load() != before+1 {
				t.Fatalf("the successor's acquire ran in %d windows, want 1: the test no longer reaches the race", windows.Load()-before)
			}
			var rec bson.M
			err = c.coll(directC).FindOne(ctx, bson.D{{"_id", c.id}}).Decode(&rec)
			if deleted != 0 || err != nil {
				t.Errorf("the late release deleted %d record(s) after the successor took the lock over; the record now: %v (%v), want the successor's there",
					deleted, rec, err)
			}
		})
	}
}
