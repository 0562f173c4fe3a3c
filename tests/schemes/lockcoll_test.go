package schemes

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// The lockCollection scheme as a state machine (docs/SCHEMES.md,
// "lockCollection"): each test is one of issue 22's attacks on it, through
// lockgate, checked against a direct read of the database. The rule
// lockCollection.* has leaseMS 1500 (main_test.go); lockcoll2.* keeps
// named records {_id: "lock_<_id>", ExpireAt} in one resourceLocks
// collection.

// lcSetup empties db.coll and its lock collection and seeds documents ids.
func lcSetup(t *testing.T, db, coll, locks string, ids ...any) (data, lock *mongo.Collection) {
	t.Helper()
	ctx := context.Background()
	direct := connect(t, directURI, "seed").Database(db)
	data, lock = direct.Collection(coll), direct.Collection(locks)
	for _, c := range []*mongo.Collection{data, lock} {
		if _, err := c.DeleteMany(ctx, bson.D{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if _, err := data.InsertOne(ctx, bson.D{{"_id", id}, {"n", 0}}); err != nil {
			t.Fatal(err)
		}
	}
	return data, lock
}

func lcRecord(t *testing.T, lock *mongo.Collection, id any) bson.M {
	t.Helper()
	var m bson.M
	err := lock.FindOne(context.Background(), bson.D{{"_id", id}}).Decode(&m)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func lcN(t *testing.T, data *mongo.Collection, id any) int32 {
	t.Helper()
	var m struct{ N int32 }
	if err := data.FindOne(context.Background(), bson.D{{"_id", id}}).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m.N
}

func msNow() time.Time { return time.Now().Truncate(time.Millisecond) }

var upsert = options.Update().SetUpsert(true)

// A deleteOne by aid deletes one record; only that record's lock is
// freed. On the unfixed code it freed the mirrors of every record of the
// holder, and a rogue's $set upsert of the surviving record then counted
// as an acquire: it rewrote the record and its data write landed.
func TestLockCollReleaseOneFreesOnlyThatRecord(t *testing.T) {
	ctx := context.Background()
	data, lock := lcSetup(t, "lockCollection", "lc_one", "lc_one.lock", 1, 2)
	h := connect(t, proxyURI, "lc-holder").Database("lockCollection")
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection")
	for _, id := range []int{1, 2} {
		if _, err := h.Collection("lc_one.lock").InsertOne(ctx, bson.D{{"_id", id}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
			t.Fatalf("holder's acquire of %d: %v", id, err)
		}
	}
	del, err := h.Collection("lc_one.lock").DeleteOne(ctx, bson.D{{"aid", "A"}})
	if err != nil || del.DeletedCount != 1 {
		t.Fatalf("holder's deleteOne({aid}): %+v, %v; want one deleted", del, err)
	}
	left := 1
	if lcRecord(t, lock, 1) == nil {
		left = 2
	}
	if lcRecord(t, lock, left) == nil {
		t.Fatalf("both records are gone after a deleteOne")
	}
	ur, err := r.Collection("lc_one.lock").UpdateOne(ctx, bson.D{{"_id", left}}, bson.D{{"$set", bson.D{{"ts", msNow()}, {"aid", "R"}}}}, upsert)
	if err != nil || ur.ModifiedCount != 0 || ur.UpsertedCount != 0 {
		t.Errorf("rogue's $set upsert of the surviving record: %+v, %v; want busy (matched, not modified)", ur, err)
	}
	if _, err := r.Collection("lc_one").UpdateOne(ctx, bson.D{{"_id", left}}, bson.D{{"$inc", bson.D{{"n", 1000}}}}); code(err) != 46 {
		t.Errorf("rogue's data write on the surviving record's document: %v, want LockBusy", err)
	}
	if ur, err := h.Collection("lc_one").UpdateOne(ctx, bson.D{{"_id", left}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("holder's data write under its surviving record: %+v, %v", ur, err)
	}
	if rec := lcRecord(t, lock, left); rec["aid"] != "A" {
		t.Errorf("surviving record = %v, want the holder's", rec)
	}
	if n := lcN(t, data, left); n != 1 {
		t.Errorf("n = %d, want 1 (the holder's write only)", n)
	}
}

// A record carries the aid of the client that inserted it: another
// client's insert or upsert with that aid is refused, and a record
// planted behind lockgate's back does not stop the holder's release of
// all its records (nor is it deleted by it). On the unfixed code the
// rogue's record was accepted and the holder's deleteMany({aid}) refused.
func TestLockCollAidBoundToInserter(t *testing.T) {
	ctx := context.Background()
	_, lock := lcSetup(t, "lockCollection", "lc_aid", "lc_aid.lock", 1, 8, 9, 10)
	h := connect(t, proxyURI, "lc-holder").Database("lockCollection").Collection("lc_aid.lock")
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection").Collection("lc_aid.lock")
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 1}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.InsertOne(ctx, bson.D{{"_id", 9}, {"ts", msNow()}, {"aid", "A"}}); code(err) != 46 {
		t.Errorf("rogue's insert of a record with the holder's aid: %v, want LockBusy", err)
	}
	if _, err := r.UpdateOne(ctx, bson.D{{"_id", 10}}, bson.D{{"$setOnInsert", bson.D{{"ts", msNow()}, {"aid", "A"}}}}, upsert); code(err) != 46 {
		t.Errorf("rogue's upsert of a record with the holder's aid: %v, want LockBusy", err)
	}
	// Planted straight at the database, live.
	if _, err := lock.InsertOne(ctx, bson.D{{"_id", 8}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	del, err := h.DeleteMany(ctx, bson.D{{"aid", "A"}})
	if err != nil || del.DeletedCount != 1 {
		t.Errorf("holder's deleteMany({aid}): %+v, %v; want its one record deleted", del, err)
	}
	for id, want := range map[int]bool{1: false, 8: true, 9: false, 10: false} {
		if got := lcRecord(t, lock, id) != nil; got != want {
			t.Errorf("record %d present = %v, want %v", id, got, want)
		}
	}
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 1}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Errorf("holder's acquire after its release: %v", err)
	}
}

// The binding of an aid lasts while its client refreshes a record with
// it: past the lease of the record's acquire, another client's record
// with that aid is still refused. Without the renewal on refresh, the
// rogue's insert landed once the acquire's lease had passed.
func TestLockCollAidBindingLastsWhileRefreshed(t *testing.T) {
	// Lease-long waits: beside the other waiting tests (waitPhase).
	waitPhase.join(t)
	t.Parallel()
	ctx := context.Background()
	_, lock := lcSetup(t, "lockCollection", "lc_bind", "lc_bind.lock", 1, 2)
	h := connect(t, proxyURI, "lc-holder").Database("lockCollection").Collection("lc_bind.lock")
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection").Collection("lc_bind.lock")
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 1}, {"ts", msNow()}, {"aid", "Abind"}}); err != nil {
		t.Fatal(err)
	}
	// Refresh at a fifth of the lease for two leases: the pacing is what
	// is tested (a binding that lasts while refreshed), not an ordering.
	end := time.Now().Add(2 * lease)
	for time.Now().Before(end) {
		if _, err := h.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"ts", msNow()}}}}); err != nil {
			t.Fatalf("holder's refresh: %v", err)
		}
		time.Sleep(lease / 5)
	}
	if _, err := r.InsertOne(ctx, bson.D{{"_id", 2}, {"ts", msNow()}, {"aid", "Abind"}}); code(err) != 46 {
		t.Errorf("rogue's record with the aid of a client that keeps refreshing: %v, want LockBusy", err)
	}
	if lcRecord(t, lock, 2) != nil {
		t.Errorf("the rogue's record was inserted")
	}
}

// An upsert onto an existing record is busy, never an acquire, never a
// write on the record: here a live record lockgate did not see inserted
// (no mirror), which it adopts. On the unfixed code the rogue's $set
// upsert rewrote the record, took the lock and its data write landed.
func TestLockCollUpsertOntoLiveRecordIsBusy(t *testing.T) {
	ctx := context.Background()
	data, lock := lcSetup(t, "lockCollection", "lc_live", "lc_live.lock", 3)
	if _, err := lock.InsertOne(ctx, bson.D{{"_id", 3}, {"ts", msNow()}, {"aid", "X"}}); err != nil {
		t.Fatal(err)
	}
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection")
	ur, err := r.Collection("lc_live.lock").UpdateOne(ctx, bson.D{{"_id", 3}}, bson.D{{"$set", bson.D{{"ts", msNow()}, {"aid", "R"}}}}, upsert)
	if err != nil || ur.MatchedCount != 1 || ur.ModifiedCount != 0 || ur.UpsertedCount != 0 {
		t.Errorf("rogue's $set upsert of a live record: %+v, %v; want busy (matched, not modified)", ur, err)
	}
	if _, err := r.Collection("lc_live.lock").InsertOne(ctx, bson.D{{"_id", 3}, {"ts", msNow()}, {"aid", "R"}}); code(err) != 11000 {
		t.Errorf("rogue's insert of a live record: %v, want DuplicateKey", err)
	}
	if _, err := r.Collection("lc_live").UpdateOne(ctx, bson.D{{"_id", 3}}, bson.D{{"$inc", bson.D{{"n", 1000}}}}); code(err) != 46 {
		t.Errorf("rogue's data write: %v, want LockBusy", err)
	}
	if _, err := r.Collection("lc_live.lock").DeleteOne(ctx, bson.D{{"_id", 3}}); code(err) != 46 {
		t.Errorf("rogue's delete of a live record it did not insert: %v, want LockBusy", err)
	}
	if rec := lcRecord(t, lock, 3); rec == nil || rec["aid"] != "X" {
		t.Errorf("record = %v, want it unchanged", rec)
	}
	if n := lcN(t, data, 3); n != 0 {
		t.Errorf("n = %d, want 0", n)
	}
}

// A release that matches nothing frees nothing. On the unfixed code the
// holder's deleteOne({_id, aid: <not its aid>}) dropped the mirror while
// the record stayed, and a rogue's $set upsert then took the lock.
func TestLockCollReleaseMatchingNothingFreesNothing(t *testing.T) {
	ctx := context.Background()
	data, lock := lcSetup(t, "lockCollection", "lc_none", "lc_none.lock", 7)
	h := connect(t, proxyURI, "lc-holder").Database("lockCollection")
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection")
	if _, err := h.Collection("lc_none.lock").InsertOne(ctx, bson.D{{"_id", 7}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if del, err := h.Collection("lc_none.lock").DeleteOne(ctx, bson.D{{"_id", 7}, {"aid", "someone"}}); err != nil || del.DeletedCount != 0 {
		t.Fatalf("holder's release matching nothing: %+v, %v", del, err)
	}
	ur, err := r.Collection("lc_none.lock").UpdateOne(ctx, bson.D{{"_id", 7}}, bson.D{{"$set", bson.D{{"ts", msNow()}, {"aid", "R"}}}}, upsert)
	if err != nil || ur.ModifiedCount != 0 || ur.UpsertedCount != 0 {
		t.Errorf("rogue's $set upsert: %+v, %v; want busy", ur, err)
	}
	if _, err := r.Collection("lc_none").UpdateOne(ctx, bson.D{{"_id", 7}}, bson.D{{"$inc", bson.D{{"n", 1000}}}}); code(err) != 46 {
		t.Errorf("rogue's data write: %v, want LockBusy", err)
	}
	if ur, err := h.Collection("lc_none").UpdateOne(ctx, bson.D{{"_id", 7}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("holder's data write: %+v, %v", ur, err)
	}
	if rec := lcRecord(t, lock, 7); rec["aid"] != "A" {
		t.Errorf("record = %v, want the holder's", rec)
	}
	if n := lcN(t, data, 7); n != 1 {
		t.Errorf("n = %d, want 1", n)
	}
}

// An acquire that meets a record nobody refreshed for leaseMS succeeds,
// as the TTL monitor would have allowed, on a server without one: by
// insert, by upsert, and after a holder through lockgate vanished. On the
// unfixed code each got DuplicateKey (or "not inserted") for ever.
func TestLockCollAbandonedRecordTakenOver(t *testing.T) {
	// Lease-long waits: beside the other waiting tests (waitPhase).
	waitPhase.join(t)
	t.Parallel()
	ctx := context.Background()
	data, lock := lcSetup(t, "lockCollection", "lc_ttl", "lc_ttl.lock", 4, 5, 6, 7)
	old := msNow().Add(-10 * lease)
	for _, id := range []int{4, 5, 7} {
		if _, err := lock.InsertOne(ctx, bson.D{{"_id", id}, {"ts", old}, {"aid", "gone"}}); err != nil {
			t.Fatal(err)
		}
	}
	a := connect(t, proxyURI, "lc-holder").Database("lockCollection")
	b := connect(t, proxy2URI, "lc-taker").Database("lockCollection")
	if _, err := b.Collection("lc_ttl.lock").InsertOne(ctx, bson.D{{"_id", 4}, {"ts", msNow()}, {"aid", "B"}}); err != nil {
		t.Errorf("insert acquire of an abandoned record: %v", err)
	}
	ur, err := b.Collection("lc_ttl.lock").UpdateOne(ctx, bson.D{{"_id", 5}}, bson.D{{"$setOnInsert", bson.D{{"ts", msNow()}, {"aid", "B"}}}}, upsert)
	if err != nil || ur.UpsertedID != int32(5) {
		t.Errorf("upsert acquire of an abandoned record: %+v, %v", ur, err)
	}
	for _, id := range []int{4, 5} {
		if rec := lcRecord(t, lock, id); rec["aid"] != "B" {
			t.Errorf("record %d = %v, want B's", id, rec)
		}
		if _, err := b.Collection("lc_ttl").UpdateOne(ctx, bson.D{{"_id", id}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil {
			t.Errorf("taker's write on %d: %v", id, err)
		}
	}

	// Anyone may delete an abandoned record, as the TTL monitor would.
	if del, err := a.Collection("lc_ttl.lock").DeleteOne(ctx, bson.D{{"_id", 7}}); err != nil || del.DeletedCount != 1 {
		t.Errorf("delete of an abandoned record: %+v, %v", del, err)
	}

	// A holder through lockgate that stops refreshing.
	if _, err := a.Collection("lc_ttl.lock").InsertOne(ctx, bson.D{{"_id", 6}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Collection("lc_ttl.lock").InsertOne(ctx, bson.D{{"_id", 6}, {"ts", msNow()}, {"aid", "B"}}); code(err) != 11000 {
		t.Errorf("acquire of a live record: %v, want DuplicateKey", err)
	}
	testkit.Eventually(t, 10*lease, "an acquire after the holder's lease", func() bool {
		_, err := b.Collection("lc_ttl.lock").InsertOne(ctx, bson.D{{"_id", 6}, {"ts", msNow()}, {"aid", "B"}})
		if err != nil && code(err) != 11000 {
			t.Fatalf("acquire after the holder's lease: %v", err)
		}
		return err == nil
	})
	if _, err := a.Collection("lc_ttl").UpdateOne(ctx, bson.D{{"_id", 6}}, bson.D{{"$inc", bson.D{{"n", 1000}}}}); code(err) != 46 {
		t.Errorf("vanished holder's late write: %v, want LockBusy", err)
	}
	if n := lcN(t, data, 6); n != 0 {
		t.Errorf("n = %d, want 0", n)
	}
}

// A refresh is the holder's, sets the record's time as a date within
// lockstore.maxLeaseMS, and never moves its aid. On the unfixed code the
// holder could rewrite its aid (another client's, planting a record in
// its name), make ts a string or put it an hour ahead (no TTL index, and
// no takeover, would free the record for that long).
func TestLockCollRefresh(t *testing.T) {
	ctx := context.Background()
	_, lock := lcSetup(t, "lockCollection", "lc_ref", "lc_ref.lock", 11, 12)
	h := connect(t, proxyURI, "lc-holder").Database("lockCollection").Collection("lc_ref.lock")
	r := connect(t, proxyURI, "lc-rogue").Database("lockCollection").Collection("lc_ref.lock")
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 11}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if ur, err := h.UpdateOne(ctx, bson.D{{"_id", 11}}, bson.D{{"$set", bson.D{{"ts", msNow().Add(time.Millisecond)}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("holder's refresh: %+v, %v", ur, err)
	}
	if _, err := h.UpdateOne(ctx, bson.D{{"_id", 11}}, bson.D{{"$currentDate", bson.D{{"ts", true}}}}); err != nil {
		t.Errorf("holder's refresh with $currentDate: %v", err)
	}
	for name, u := range map[string]bson.D{
		"aid moved":      {{"$set", bson.D{{"aid", "Z"}}}},
		"ts not a date":  {{"$set", bson.D{{"ts", "yesterday"}}}},
		"ts removed":     {{"$unset", bson.D{{"ts", ""}}}},
		"aid renamed on": {{"$rename", bson.D{{"x", "aid"}}}},
	} {
		if _, err := h.UpdateOne(ctx, bson.D{{"_id", 11}}, u); code(err) != 46 {
			t.Errorf("holder's update (%s): %v, want LockBusy", name, err)
		}
	}
	if _, err := r.UpdateOne(ctx, bson.D{{"_id", 11}}, bson.D{{"$set", bson.D{{"ts", msNow()}}}}); code(err) != 46 {
		t.Errorf("rogue's refresh: %v, want LockBusy", err)
	}
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 12}, {"ts", "now"}, {"aid", "A"}}); code(err) != 46 {
		t.Errorf("acquire with a ts that is not a date: %v, want LockBusy", err)
	}
	// A ts far ahead would keep the record from ending (a TTL index
	// frees it only after ts + its expiry) for longer than lockgate can
	// mirror a lock (lockstore.maxLeaseMS, 10 minutes).
	later := msNow().Add(time.Hour)
	if _, err := h.InsertOne(ctx, bson.D{{"_id", 12}, {"ts", later}, {"aid", "A"}}); code(err) != 46 {
		t.Errorf("acquire with a ts an hour ahead: %v, want LockBusy", err)
	}
	if _, err := h.UpdateOne(ctx, bson.D{{"_id", 11}}, bson.D{{"$set", bson.D{{"ts", later}}}}); code(err) != 46 {
		t.Errorf("refresh to a ts an hour ahead: %v, want LockBusy", err)
	}
	if rec := lcRecord(t, lock, 12); rec != nil {
		t.Errorf("a refused acquire left record %v", rec)
	}
}

// alistairjevans/mongodb-locks, call for call: one resourceLocks
// collection of {_id: "lock_<resource>", ExpireAt}, acquired with
// findOneAndUpdate({_id}, {$setOnInsert: {_id, ExpireAt}}, upsert,
// returnDocument: before), where null means acquired and a record means
// busy; released by deleteOne({_id}). Through two proxies. On the unfixed
// code the acquire was refused.
func TestLockCollNamedRecords(t *testing.T) {
	ctx := context.Background()
	data, lock := lcSetup(t, "lockcoll2", "items", "resourceLocks", "r1", "r2", "r3", 5)
	a := connect(t, proxyURI, "alistair-a").Database("lockcoll2")
	b := connect(t, proxy2URI, "alistair-b").Database("lockcoll2")
	fam := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)
	acquire := func(db *mongo.Database, res string, expires any) (bson.Raw, error) {
		raw, err := db.Collection("resourceLocks").FindOneAndUpdate(ctx, bson.D{{"_id", "lock_" + res}},
			bson.D{{"$setOnInsert", bson.D{{"_id", "lock_" + res}, {"ExpireAt", expires}}}}, fam).Raw()
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil, nil
		}
		return raw, err
	}
	minute := msNow().Add(time.Minute)
	if rec, err := acquire(a, "r1", minute); rec != nil || err != nil {
		t.Fatalf("a's acquire: %v, %v; want null (acquired)", rec, err)
	}
	busy, err := acquire(b, "r1", minute.Add(time.Second))
	if err != nil || busy == nil {
		t.Fatalf("b's acquire of a held lock: %v, %v; want the record", busy, err)
	}
	direct, err := lock.FindOneAndUpdate(ctx, bson.D{{"_id", "lock_r1"}},
		bson.D{{"$setOnInsert", bson.D{{"_id", "lock_r1"}, {"ExpireAt", minute.Add(time.Second)}}}}, fam).Raw()
	if err != nil || !bytes.Equal(busy, direct) {
		t.Errorf("busy answer %v, the database's own %v (%v)", busy, direct, err)
	}
	if ur, err := a.Collection("items").UpdateOne(ctx, bson.D{{"_id", "r1"}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("holder's write: %+v, %v", ur, err)
	}
	if _, err := b.Collection("items").UpdateOne(ctx, bson.D{{"_id", "r1"}}, bson.D{{"$inc", bson.D{{"n", 1000}}}}); code(err) != 46 {
		t.Errorf("non-holder's write: %v, want LockBusy", err)
	}
	// The holder moves its expiry: within lockstore.maxLeaseMS, as a date.
	if ur, err := a.Collection("resourceLocks").UpdateOne(ctx, bson.D{{"_id", "lock_r1"}}, bson.D{{"$set", bson.D{{"ExpireAt", minute.Add(time.Minute)}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("holder's extension: %+v, %v", ur, err)
	}
	for name, exp := range map[string]any{"a string": "later", "an hour ahead": msNow().Add(time.Hour)} {
		if _, err := a.Collection("resourceLocks").UpdateOne(ctx, bson.D{{"_id", "lock_r1"}}, bson.D{{"$set", bson.D{{"ExpireAt", exp}}}}); code(err) != 46 {
			t.Errorf("holder's extension to %s: %v, want LockBusy", name, err)
		}
	}
	if _, err := b.Collection("resourceLocks").UpdateOne(ctx, bson.D{{"_id", "lock_r1"}}, bson.D{{"$set", bson.D{{"ExpireAt", minute}}}}); code(err) != 46 {
		t.Errorf("non-holder's extension: %v, want LockBusy", err)
	}
	if del, err := a.Collection("resourceLocks").DeleteOne(ctx, bson.D{{"_id", "lock_r1"}}); err != nil || del.DeletedCount != 1 {
		t.Errorf("a's release: %+v, %v", del, err)
	}
	if rec, err := acquire(b, "r1", minute); rec != nil || err != nil {
		t.Errorf("b's acquire after the release: %v, %v; want null", rec, err)
	}
	if ur, err := b.Collection("items").UpdateOne(ctx, bson.D{{"_id", "r1"}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil || ur.ModifiedCount != 1 {
		t.Errorf("new holder's write: %+v, %v", ur, err)
	}
	if n := lcN(t, data, "r1"); n != 2 {
		t.Errorf("n = %d, want 2", n)
	}

	// An expiry that is not a date, or further ahead than a lock store
	// lease can be (lockstore.maxLeaseMS, 10 minutes), cannot be mirrored.
	for name, exp := range map[string]any{"a string": "soon", "an hour ahead": msNow().Add(time.Hour)} {
		if _, err := acquire(a, "r2", exp); code(err) != 46 {
			t.Errorf("acquire with an expiry %s: %v, want LockBusy", name, err)
		}
	}
	if rec := lcRecord(t, lock, "lock_r2"); rec != nil {
		t.Errorf("a refused acquire left record %v", rec)
	}
	if _, err := acquire(a, "r2", msNow().Add(-time.Second)); code(err) != 46 {
		t.Errorf("acquire with an expiry in the past: %v, want LockBusy", err)
	}
	// Past its ExpireAt a record is abandoned (the TTL index, with
	// expireAfterSeconds 0, would delete it).
	if _, err := lock.InsertOne(ctx, bson.D{{"_id", "lock_r3"}, {"ExpireAt", msNow().Add(-time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if rec, err := acquire(a, "r3", minute); rec != nil || err != nil {
		t.Errorf("acquire of an expired record: %v, %v; want null", rec, err)
	}
	// A record held through lockgate but gone from the database (deleted
	// behind lockgate's back, or while its holder's acquire or release is
	// in flight): the busy answer is DuplicateKey, as the database answers
	// an upsert racing another's insert, never a null that says acquired.
	if _, err := lock.DeleteOne(ctx, bson.D{{"_id", "lock_r3"}}); err != nil {
		t.Fatal(err)
	}
	if rec, err := acquire(b, "r3", minute); code(err) != 11000 {
		t.Errorf("acquire of a held lock whose record is gone: %v, %v; want DuplicateKey", rec, err)
	}
	// A document whose _id the template cannot map has no lock record.
	if _, err := a.Collection("items").UpdateOne(ctx, bson.D{{"_id", 5}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); code(err) != 46 {
		t.Errorf("write on a document with a numeric _id under lock_{_id}: %v, want LockBusy", err)
	}
}

// The libraries create their lock collection's TTL index themselves; a
// TTL index on the record's time field that deletes no earlier than the
// scheme counts a record abandoned gets the database's own answer
// (FerretDB: NotImplemented); any other TTL index on a lock collection
// stays a collection write (refused: allowCollectionWrites is false). On
// the unfixed code every one was refused, and the libraries' setup threw.
func TestLockCollTTLIndex(t *testing.T) {
	ctx := context.Background()
	dbCode := func(err error) int32 {
		var ce mongo.CommandError
		if errors.As(err, &ce) {
			return ce.Code
		}
		if err != nil {
			return -1
		}
		return 0
	}
	direct := connect(t, directURI, "seed")
	proxied := connect(t, proxyURI, "lc-setup")
	for _, c := range []struct {
		db, coll string
		key      bson.D
		secs     int32
		allowed  bool
	}{
		{"lockCollection", "lc_ttl_ix.lock", bson.D{{"ts", 1}}, 30, true},
		{"lockcoll2", "resourceLocks", bson.D{{"ExpireAt", 1}}, 0, true},
		{"lockCollection", "lc_ttl_ix.lock", bson.D{{"ts", 1}}, 1, false}, // before the lease of 1.5 s
		{"lockCollection", "lc_ttl_ix.lock", bson.D{{"aid", 1}}, 30, false},
		{"lockcoll2", "resourceLocks", bson.D{{"ExpireAt", 1}, {"x", 1}}, 0, false},
		{"lockcoll2", "items", bson.D{{"ExpireAt", 1}}, 0, false}, // a data collection
	} {
		m := mongo.IndexModel{Keys: c.key, Options: options.Index().SetExpireAfterSeconds(c.secs)}
		_, perr := proxied.Database(c.db).Collection(c.coll).Indexes().CreateOne(ctx, m)
		if !c.allowed {
			if code(perr) != 46 {
				t.Errorf("%s.%s TTL index %v %ds: %v, want LockBusy", c.db, c.coll, c.key, c.secs, perr)
			}
			continue
		}
		_, derr := direct.Database(c.db).Collection(c.coll).Indexes().CreateOne(ctx, m)
		if dbCode(perr) != dbCode(derr) {
			t.Errorf("%s.%s TTL index %v %ds: %v through lockgate, %v on the database", c.db, c.coll, c.key, c.secs, perr, derr)
		}
	}
}

// A non-holder's delete of a lock record is refused while the record
// lives (its ts younger than leaseMS), whether lockgate holds its mirror
// (inserted through the other lockgate) or not (written straight at the
// database, this delete the first write that meets it); only a record
// past its lease is anyone's to delete, as a TTL index would. A lease of
// ten minutes (lockCollectionLong.*), so that no pause of a loaded machine
// ends a lock this test calls live: TestSchemeTakeover's b_delete_early
// once came out 1 where its 1.5 s lease had run out before the delete
// (the last case here).
func TestLockCollNonHolderDeleteOfLiveRecord(t *testing.T) {
	ctx := context.Background()
	const db = "lockCollectionLong"
	_, lock := lcSetup(t, db, "lc_del", "lc_del.lock", 1, 2, 3)
	a := connect(t, proxyURI, "lc-del-holder").Database(db).Collection("lc_del.lock")
	b := connect(t, proxy2URI, "lc-del-other").Database(db).Collection("lc_del.lock")

	// Held through lockgate 1, deleted through lockgate 2.
	if _, err := a.InsertOne(ctx, bson.D{{"_id", 1}, {"ts", msNow()}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteOne(ctx, bson.D{{"_id", 1}}); code(err) != 46 {
		t.Errorf("another client's delete of a record held through the other lockgate: %v, want LockBusy", err)
	}
	if rec := lcRecord(t, lock, 1); rec == nil || rec["aid"] != "A" {
		t.Errorf("record 1 = %v, want A's", rec)
	}

	// Live, with no mirror: the record decides.
	if _, err := lock.InsertOne(ctx, bson.D{{"_id", 2}, {"ts", msNow()}, {"aid", "X"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteOne(ctx, bson.D{{"_id", 2}}); code(err) != 46 {
		t.Errorf("a delete of a live record nobody took through lockgate: %v, want LockBusy", err)
	}
	if rec := lcRecord(t, lock, 2); rec == nil || rec["aid"] != "X" {
		t.Errorf("record 2 = %v, want X's", rec)
	}

	// Past its lease when it lands (a ts taken that long before the
	// insert reached lockgate): abandoned, the TTL's to delete, and so
	// anyone's.
	if _, err := a.InsertOne(ctx, bson.D{{"_id", 3}, {"ts", msNow().Add(-11 * time.Minute)}, {"aid", "A"}}); err != nil {
		t.Fatal(err)
	}
	if del, err := b.DeleteOne(ctx, bson.D{{"_id", 3}}); err != nil || del.DeletedCount != 1 {
		t.Errorf("a delete of a record past its lease: %+v, %v; want it deleted", del, err)
	}
}
