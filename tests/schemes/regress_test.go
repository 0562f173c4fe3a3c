package schemes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// The regressions of issue 22 for holderFields, lockDocument and flag:
// each write below landed (or took or dropped a mirror it should not
// have) when lockgate read a write's syntax instead of the lock's state.

// seed replaces db.coll with docs, straight at the database.
func seed(t *testing.T, db, coll string, docs ...bson.D) {
	t.Helper()
	ctx := context.Background()
	c := connect(t, directURI, "seed").Database(db).Collection(coll)
	c.Drop(ctx)
	for _, d := range docs {
		if _, err := c.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// stored reads one document straight at the database; nil if absent.
func stored(t *testing.T, db, coll string, id any) bson.M {
	t.Helper()
	var m bson.M
	err := connect(t, directURI, "seed").Database(db).Collection(coll).FindOne(context.Background(), bson.D{{"_id", id}}).Decode(&m)
	if err == mongo.ErrNoDocuments {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mirror is lockStatus of one _id through the proxy: held, and its end.
func mirror(t *testing.T, c *mongo.Client, db, coll string, id any) (bool, time.Time) {
	t.Helper()
	var st bson.M
	if err := c.Database(db).RunCommand(context.Background(), bson.D{{"lockStatus", coll}, {"ids", bson.A{id}}}).Decode(&st); err != nil {
		t.Fatalf("lockStatus: %v", err)
	}
	locks, _ := st["locks"].(bson.A)
	if len(locks) != 1 {
		t.Fatalf("lockStatus = %v", st)
	}
	l := locks[0].(bson.M)
	end, _ := l["expiresAt"].(primitive.DateTime)
	return l["held"] == true, end.Time()
}

// refused says that err is lockgate's refusal (46 LockBusy).
func refused(t *testing.T, what string, err error) {
	t.Helper()
	if code(err) != 46 {
		t.Errorf("%s: %v, want 46 LockBusy", what, err)
	}
}

func now() primitive.DateTime { return primitive.NewDateTimeFromTime(time.Now()) }

func in(d time.Duration) primitive.DateTime { return primitive.NewDateTimeFromTime(time.Now().Add(d)) }

// schemeCase is one scheme's fields and its application's own acquire.
type schemeCase struct {
	db string
	// setHolder sets the lock to holder h in an update.
	setHolder func(h string) bson.D
	// holderPath is the holder's field path in filters.
	holderPath string
	// acquire runs the application's own acquire of _id id as h.
	acquire func(ctx context.Context, c *mongo.Collection, id any, h string) bool
}

func holderFieldsCase(db string, lease time.Duration) schemeCase {
	return schemeCase{db: db, holderPath: "LockId",
		setHolder: func(h string) bson.D { return bson.D{{"LockId", h}, {"LockTime", now()}} },
		acquire: func(ctx context.Context, c *mongo.Collection, id any, h string) bool {
			var got bson.M
			err := c.FindOneAndUpdate(ctx,
				bson.D{{"_id", id}, {"$or", bson.A{bson.D{{"LockId", nil}}, bson.D{{"LockTime", bson.D{{"$lt", primitive.NewDateTimeFromTime(time.Now().Add(-lease))}}}}}}},
				bson.D{{"$set", bson.D{{"LockId", h}, {"LockTime", now()}}}},
				options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&got)
			return err == nil && got["LockId"] == h
		}}
}

func lockDocumentCase() schemeCase {
	return schemeCase{db: "lockDocument", holderPath: "Lock.actor",
		setHolder: func(h string) bson.D {
			return bson.D{{"Lock", bson.D{{"actor", h}, {"expiresAt", in(time.Minute)}, {"error", nil}}}}
		},
		acquire: func(ctx context.Context, c *mongo.Collection, id any, h string) bool {
			r, err := c.UpdateOne(ctx,
				bson.D{{"_id", id}, {"$or", bson.A{bson.D{{"Lock.actor", nil}}, bson.D{{"Lock.expiresAt", bson.D{{"$lt", now()}}}}}}},
				bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", h}, {"expiresAt", in(time.Minute)}, {"error", nil}}}}}})
			return err == nil && r.ModifiedCount == 1
		}}
}

func flagCase() schemeCase {
	return schemeCase{db: "flag", holderPath: "locked",
		setHolder: func(string) bson.D { return bson.D{{"locked", true}} },
		acquire: func(ctx context.Context, c *mongo.Collection, id any, _ string) bool {
			r, err := c.UpdateOne(ctx, bson.D{{"_id", id}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}}}})
			return err == nil && r.ModifiedCount == 1
		}}
}

// TestRegressSetOnInsertIsNoAcquire: $setOnInsert sets nothing on an
// existing document. A data write that also "sets" the holder with it is
// no acquire (it landed, and kept a mirror that made the application's
// own acquire "busy"), nor is a findOneAndUpdate of $setOnInsert alone.
func TestRegressSetOnInsertIsNoAcquire(t *testing.T) {
	ctx := context.Background()
	for name, sc := range map[string]schemeCase{
		"holderFields": holderFieldsCase("holderFields", lease),
		"lockDocument": lockDocumentCase(),
		"flag":         flagCase(),
	} {
		t.Run(name, func(t *testing.T) {
			coll := "regress_setoninsert"
			seed(t, sc.db, coll, bson.D{{"_id", 1}, {"value", 1}, {"locked", false}})
			rogue := connect(t, proxyURI, "rogue").Database(sc.db).Collection(coll)
			onInsert := bson.D{}
			for _, e := range sc.setHolder("x") {
				onInsert = append(onInsert, e)
			}
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$setOnInsert", onInsert}, {"$set", bson.D{{"value", 7000}}}})
			refused(t, "a data write with the holder in $setOnInsert", err)
			for i := 0; i < 2; i++ {
				rogue.FindOneAndUpdate(ctx, bson.D{{"_id", 1}}, bson.D{{"$setOnInsert", onInsert}})
			}
			if d := stored(t, sc.db, coll, 1); d["value"] != int32(1) {
				t.Fatalf("document = %v, want value 1", d)
			}
			app := connect(t, proxy2URI, "app").Database(sc.db).Collection(coll)
			if !sc.acquire(ctx, app, 1, "app") {
				t.Fatalf("the application's own acquire of a free document failed; document %v", stored(t, sc.db, coll, 1))
			}
		})
	}
}

// TestRegressCurrentDateRenews: a holder refreshing LockTime with
// $currentDate renews the mirror, as $set of a date does.
func TestRegressCurrentDateRenews(t *testing.T) {
	ctx := context.Background()
	const lease = 3 * time.Second
	seed(t, "regress_hf", "renew", bson.D{{"_id", 1}, {"value", 1}})
	c := connect(t, proxyURI, "app")
	coll := c.Database("regress_hf").Collection("renew")
	if !holderFieldsCase("regress_hf", lease).acquire(ctx, coll, 1, "g") {
		t.Fatal("acquire failed")
	}
	// Let a third of the lease go by: the renewal must move the end.
	testkit.Eventually(t, 10*time.Second, "the mirror's end to come closer", func() bool {
		held, end := mirror(t, c, "regress_hf", "renew", 1)
		if !held {
			t.Fatal("the mirror ended before the renewal")
		}
		return time.Until(end) < lease*2/3
	})
	// The renewal's LockTime is the database's time when it applies the
	// update, after sent: a renewed mirror ends a lease after sent or
	// later, an unrenewed one at most two thirds of one. Measured from
	// sent, not from the read after it, so that a loaded machine's slow
	// round trips do not count against the renewal (at load 14 the
	// update and the read took 0.7 s).
	sent := time.Now()
	r, err := coll.UpdateOne(ctx, bson.D{{"_id", 1}, {"LockId", "g"}}, bson.D{{"$currentDate", bson.D{{"LockTime", true}}}})
	if err != nil || r.ModifiedCount != 1 {
		t.Fatalf("renewal by $currentDate: %+v, %v", r, err)
	}
	if held, end := mirror(t, c, "regress_hf", "renew", 1); !held || end.Sub(sent) < lease*5/6 {
		t.Fatalf("after $currentDate of LockTime the mirror ends %v after the renewal was sent (held %v), want about %v", end.Sub(sent), held, lease)
	}
}

// TestRegressDocumentLockWithoutMirror: a live lock the document shows
// and the mirror does not (taken before lockgate ran) is adopted: an
// acquire without the free-or-expired condition does not steal it, a
// regex "holder" does not write as the holder, and the holder's own
// writes go on.
func TestRegressDocumentLockWithoutMirror(t *testing.T) {
	ctx := context.Background()
	for name, sc := range map[string]schemeCase{
		"holderFields": holderFieldsCase("holderFields", lease),
		"lockDocument": lockDocumentCase(),
	} {
		t.Run(name, func(t *testing.T) {
			coll := "regress_adopt"
			seed(t, sc.db, coll, append(bson.D{{"_id", 1}, {"value", 1}}, sc.setHolder("old")...))
			rogue := connect(t, proxyURI, "rogue").Database(sc.db).Collection(coll)
			rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", sc.setHolder("thief")}})
			if d := stored(t, sc.db, coll, 1); !strings.Contains(bsonString(d), `"old"`) {
				t.Errorf("an acquire without the free condition stole the document's live lock: %v", d)
			}
			if sc.acquire(ctx, rogue, 1, "thief") {
				t.Errorf("the scheme's acquire took a live lock: %v", stored(t, sc.db, coll, 1))
			}
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}, {sc.holderPath, primitive.Regex{Pattern: "."}}}, bson.D{{"$set", bson.D{{"value", 7000}}}})
			refused(t, "a regex as the holder value", err)
			if d := stored(t, sc.db, coll, 1); d["value"] != int32(1) {
				t.Errorf("a regex holder wrote: %v", d)
			}
			r, err := connect(t, proxyURI, "old").Database(sc.db).Collection(coll).UpdateOne(ctx, bson.D{{"_id", 1}, {sc.holderPath, "old"}}, bson.D{{"$set", bson.D{{"value", 2}}}})
			if err != nil || r.ModifiedCount != 1 {
				t.Fatalf("the document's holder's write: %+v, %v", r, err)
			}
		})
	}
}

// TestRegressUnmirrorableLock: a document lock lockgate cannot mirror (an
// expiry that is no date, or longer than lockstore.maxLeaseMS) makes the
// write refused with the reason, never allowed silently; a holder cannot
// extend past maxLeaseMS.
func TestRegressUnmirrorableLock(t *testing.T) {
	ctx := context.Background()
	rogue := connect(t, proxyURI, "rogue").Database("lockDocument").Collection("regress_unmirrorable")
	seed(t, "lockDocument", "regress_unmirrorable",
		bson.D{{"_id", 1}, {"value", 1}, {"Lock", bson.D{{"actor", "old"}, {"expiresAt", time.Now().Add(time.Hour).UnixMilli()}}}})
	_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", "thief"}, {"expiresAt", in(time.Minute)}}}}}})
	refused(t, "an acquire over an expiry stored as a number", err)
	if err != nil && !strings.Contains(err.Error(), "expiresAt") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	if d := stored(t, "lockDocument", "regress_unmirrorable", 1); !strings.Contains(bsonString(d), `"old"`) {
		t.Errorf("the lock was stolen: %v", d)
	}

	// holderFields: a LockTime that is no date.
	hf := connect(t, proxyURI, "rogue").Database("holderFields").Collection("regress_unmirrorable")
	seed(t, "holderFields", "regress_unmirrorable", bson.D{{"_id", 1}, {"value", 1}, {"LockId", "old"}, {"LockTime", "yesterday"}})
	_, err = hf.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"LockId", "thief"}, {"LockTime", now()}}}})
	refused(t, "an acquire over a LockTime that is no date", err)
	if err != nil && !strings.Contains(err.Error(), "LockTime") {
		t.Errorf("the refusal does not say why: %v", err)
	}

	seed(t, "lockDocument", "regress_unmirrorable", bson.D{{"_id", 2}, {"value", 1}}, bson.D{{"_id", 3}, {"value", 1}})
	_, err = rogue.UpdateOne(ctx, bson.D{{"_id", 3}, {"Lock", nil}}, bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", "me"}, {"expiresAt", in(time.Hour)}}}}}})
	refused(t, "an acquire for longer than lockstore.maxLeaseMS", err)
	if err != nil && !strings.Contains(err.Error(), "maxLeaseMS") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	if !lockDocumentCase().acquire(ctx, rogue, 2, "me") {
		t.Fatal("acquire failed")
	}
	_, err = rogue.UpdateOne(ctx, bson.D{{"_id", 2}, {"Lock.actor", "me"}}, bson.D{{"$set", bson.D{{"Lock.expiresAt", in(time.Hour)}}}})
	refused(t, "an extension past lockstore.maxLeaseMS", err)
	if err != nil && !strings.Contains(err.Error(), "maxLeaseMS") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	_, err = rogue.UpdateOne(ctx, bson.D{{"_id", 2}, {"Lock.actor", "me"}}, bson.D{{"$set", bson.D{{"Lock.expiresAt", time.Now().Add(time.Minute).UnixMilli()}}}})
	refused(t, "an expiry that is no date", err)
	d := stored(t, "lockDocument", "regress_unmirrorable", 2)
	if exp, _ := d["Lock"].(bson.M)["expiresAt"].(primitive.DateTime); exp.Time().After(time.Now().Add(2 * time.Minute)) {
		t.Errorf("the extension landed: %v", d)
	}
}

// TestRegressUpsertNamingHolder: an upsert whose filter names a holder
// would create an already-locked document that no mirror covers.
func TestRegressUpsertNamingHolder(t *testing.T) {
	ctx := context.Background()
	for name, sc := range map[string]schemeCase{
		"holderFields": holderFieldsCase("holderFields", lease),
		"lockDocument": lockDocumentCase(),
	} {
		t.Run(name, func(t *testing.T) {
			coll := "regress_upsert"
			seed(t, sc.db, coll)
			c := connect(t, proxyURI, "rogue")
			c.Database(sc.db).Collection(coll).UpdateOne(ctx, bson.D{{"_id", "new"}, {sc.holderPath, "x"}}, bson.D{{"$set", bson.D{{"value", 1}}}}, options.Update().SetUpsert(true))
			if d := stored(t, sc.db, coll, "new"); d != nil {
				// Treated as an acquire, it would hold a mirror for a
				// lease, not for the moment of one write.
				if held, end := mirror(t, c, sc.db, coll, "new"); !held || time.Until(end) < time.Second {
					t.Fatalf("the upsert created a locked document without a lock's mirror (held %v, for %v): %v", held, time.Until(end), d)
				}
			}
		})
	}
}

// TestRegressFlagNonHolder: under flag nobody but the holder changes
// data, whatever the flag's new value; clearing a flag whose holder's
// lease ended is allowed only by a write that changes nothing else.
func TestRegressFlagNonHolder(t *testing.T) {
	ctx := context.Background()
	const coll = "regress_flag"
	rogue := connect(t, proxyURI, "rogue").Database("flag").Collection(coll)
	writes := map[string]func() error{
		"replacement": func() error {
			_, err := rogue.ReplaceOne(ctx, bson.D{{"_id", 1}}, bson.D{{"value", 7000}})
			return err
		},
		"clear and data": func() error {
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"locked", false}, {"value", 7000}}}})
			return err
		},
		"unset both": func() error {
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$unset", bson.D{{"locked", ""}, {"value", ""}}}})
			return err
		},
		"flag 1 and data": func() error {
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"locked", 1}, {"value", 7000}}}})
			return err
		},
		"flag true and data": func() error {
			_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}, {"value", 7000}}}})
			return err
		},
	}
	for _, locked := range []bool{false, true} {
		for name, w := range writes {
			seed(t, "flag", coll, bson.D{{"_id", 1}, {"locked", locked}, {"value", 1}})
			refused(t, name, w())
			if d := stored(t, "flag", coll, 1); d["value"] != int32(1) || d["locked"] != locked {
				t.Errorf("%s (flag %v, nobody holding it) landed: %v", name, locked, d)
			}
		}
	}
	// Held by another client: neither a data write nor a clear. Under a
	// lease that outlasts the six writes on a loaded machine (flagLong.*):
	// at load 15 with the lease scaled by 2 (3 s) the holder's lease ended
	// before the clear, which the scheme then rightly allowed. A
	// collection per run: the lock outlives it.
	held := fmt.Sprintf("%s_%d", coll, time.Now().UnixNano())
	seed(t, "flagLong", held, bson.D{{"_id", 1}, {"locked", false}, {"value", 1}})
	if !flagCase().acquire(ctx, connect(t, proxyURI, "holder").Database("flagLong").Collection(held), 1, "") {
		t.Fatal("acquire failed")
	}
	rogue = connect(t, proxyURI, "rogue").Database("flagLong").Collection(held)
	for name, w := range writes {
		refused(t, name+" of a held flag", w())
	}
	_, err := rogue.UpdateOne(ctx, bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"locked", false}}}})
	refused(t, "clearing a held flag", err)
	if d := stored(t, "flagLong", held, 1); d["value"] != int32(1) || d["locked"] != true {
		t.Errorf("a write to the held flag landed: %v", d)
	}
	rogue = connect(t, proxyURI, "rogue").Database("flag").Collection(coll)
	// A flag nobody holds (set before lockgate ran): anyone may clear it
	// with a write that changes nothing else.
	seed(t, "flag", coll, bson.D{{"_id", 2}, {"locked", true}, {"value", 1}})
	if r, err := rogue.UpdateOne(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"locked", false}}}}); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("clearing an abandoned flag: %+v, %v", r, err)
	}
}

// TestRegressReleaseMatchingNothing: a release the database did not
// apply frees nothing.
func TestRegressReleaseMatchingNothing(t *testing.T) {
	ctx := context.Background()
	seed(t, "regress_hf", "release", bson.D{{"_id", 1}, {"value", 1}})
	c := connect(t, proxyURI, "app")
	coll := c.Database("regress_hf").Collection("release")
	if !holderFieldsCase("regress_hf", 3*time.Second).acquire(ctx, coll, 1, "g") {
		t.Fatal("acquire failed")
	}
	r, err := coll.UpdateOne(ctx, bson.D{{"_id", 1}, {"LockId", "g"}, {"value", 999}}, bson.D{{"$set", bson.D{{"LockId", nil}, {"LockTime", nil}}}})
	if err != nil || r.ModifiedCount != 0 {
		t.Fatalf("release matching nothing: %+v, %v", r, err)
	}
	if held, _ := mirror(t, c, "regress_hf", "release", 1); !held {
		t.Fatalf("a release that matched nothing dropped the mirror; document %v", stored(t, "regress_hf", "release", 1))
	}
	r, err = coll.UpdateOne(ctx, bson.D{{"_id", 1}, {"LockId", "g"}}, bson.D{{"$set", bson.D{{"LockId", nil}, {"LockTime", nil}}}})
	if err != nil || r.ModifiedCount != 1 {
		t.Fatalf("release: %+v, %v", r, err)
	}
	if held, _ := mirror(t, c, "regress_hf", "release", 1); held {
		t.Fatal("the release did not drop the mirror")
	}
}

// TestRegressTharga: Tharga.MongoDB's lock (Lock: {LockKey, ExpireTime,
// Actor}, holder named by LockKey): its commit replaces the document by
// LockKey, its abandon clears Lock by _id alone, which is the holder's
// write only from the client that took the lock.
func TestRegressTharga(t *testing.T) {
	ctx := context.Background()
	const db, coll = "regress_tharga", "entities"
	seed(t, db, coll, bson.D{{"_id", 1}, {"value", 1}, {"Lock", nil}}, bson.D{{"_id", 2}, {"value", 1}, {"Lock", nil}})
	app := connect(t, proxyURI, "tharga").Database(db).Collection(coll)
	lockFor := func(id int, key string, d time.Duration) bson.D {
		t.Helper()
		l := bson.D{{"LockKey", key}, {"LockTime", now()}, {"ExpireTime", in(d)}, {"Actor", "worker"}, {"ExceptionInfo", nil}}
		var got bson.M
		err := app.FindOneAndUpdate(ctx,
			bson.D{{"_id", id}, {"$or", bson.A{bson.D{{"Lock", nil}}, bson.D{{"Lock.ExpireTime", bson.D{{"$lt", now()}}}}}}},
			bson.D{{"$set", bson.D{{"Lock", l}}}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&got)
		if err != nil || got["Lock"].(bson.M)["LockKey"] != key {
			t.Fatalf("lock %d: %v, %v", id, got, err)
		}
		return l
	}
	lock := func(id int, key string) { t.Helper(); lockFor(id, key, time.Minute) }
	lock(1, "k1")
	var got bson.M
	err := app.FindOneAndReplace(ctx, bson.D{{"_id", 1}, {"Lock", bson.D{{"$ne", nil}}}, {"Lock.LockKey", "k1"}},
		bson.D{{"_id", 1}, {"value", 2}, {"Lock", nil}}, options.FindOneAndReplace().SetReturnDocument(options.After)).Decode(&got)
	if err != nil || got["value"] != int32(2) {
		t.Fatalf("commit: %v, %v", got, err)
	}
	lock(2, "k2")
	other := connect(t, proxyURI, "other").Database(db).Collection(coll)
	err = other.FindOneAndUpdate(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"Lock", nil}}}}).Err()
	refused(t, "another client's abandon", err)
	if err := app.FindOneAndUpdate(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"Lock", nil}}}}).Err(); err != nil {
		t.Fatalf("abandon: %v", err)
	}
	if d := stored(t, db, coll, 2); d["Lock"] != nil {
		t.Fatalf("after the abandon: %v", d)
	}
	lock(2, "k3")
	// The client that took it writes by _id alone; the proxy binds the
	// write to its holder value. Nobody extends it past maxLeaseMS.
	if r, err := app.UpdateOne(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"value", 5}}}}); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("the holder's write by _id: %+v, %v", r, err)
	}
	_, err = other.UpdateOne(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"value", 6}}}})
	refused(t, "another client's write by _id", err)
	_, err = app.UpdateOne(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"Lock.ExpireTime", in(time.Hour)}}}})
	refused(t, "an extension past maxLeaseMS by _id", err)
	if d := stored(t, db, coll, 2); d["value"] != int32(5) {
		t.Fatalf("document = %v, want value 5", d)
	}

	// The error state: the client sets its own lock again, with an
	// exception, by _id. Once it has expired, anyone may clear it with a
	// write that changes nothing else (ReleaseOneAsync); before, nobody
	// but its client.
	seed(t, db, coll, bson.D{{"_id", 3}, {"value", 1}, {"Lock", nil}})
	l := lockFor(3, "k4", 2*time.Second)
	l[4].Value = bson.D{{"Type", "Exception"}, {"Message", "boom"}}
	if err := app.FindOneAndUpdate(ctx, bson.D{{"_id", 3}}, bson.D{{"$set", bson.D{{"Lock", l}}}}).Err(); err != nil {
		t.Fatalf("error state: %v", err)
	}
	if d := stored(t, db, coll, 3); d["Lock"].(bson.M)["ExceptionInfo"] == nil {
		t.Fatalf("the error state did not land: %v", d)
	}
	releaseOne := func() error {
		return other.FindOneAndUpdate(ctx, bson.D{{"_id", 3}, {"Lock", bson.D{{"$ne", nil}}}, {"Lock.ExceptionInfo", bson.D{{"$ne", nil}}}},
			bson.D{{"$set", bson.D{{"Lock", nil}}}}).Err()
	}
	refused(t, "another client's release of a live lock", releaseOne())
	c := connect(t, proxyURI, "observer")
	// Expired means past the document's own ExpireTime, which is what
	// lockgate judges the lock by (and what Tharga's release looks for).
	// The mirror alone is not enough: its lease is measured on the lock
	// store's estimate of the server's clock, and on a loaded machine it
	// read "not held" a few milliseconds before ExpireTime had passed on
	// the proxy's clock, when the lock was still live and the release
	// rightly refused.
	expires := l[2].Value.(primitive.DateTime).Time()
	testkit.Eventually(t, 10*time.Second, "the lock to expire", func() bool {
		held, _ := mirror(t, c, db, coll, 3)
		return !held && time.Now().After(expires)
	})
	if err := releaseOne(); err != nil {
		t.Fatalf("release of an expired lock in its error state: %v", err)
	}
	if d := stored(t, db, coll, 3); d["Lock"] != nil {
		t.Fatalf("after the release: %v", d)
	}
}

// TestRegressRefusedBulkLeavesNoMirror (FINDINGS-schemes.md F1): a
// refused command that clears a flag nobody holds and writes data must
// leave no mirror behind, or a writer that never takes a lock keeps a
// free flag unlockable.
func TestRegressRefusedBulkLeavesNoMirror(t *testing.T) {
	ctx := context.Background()
	const coll = "regress_bulk"
	seed(t, "flag", coll, bson.D{{"_id", 2}, {"locked", false}, {"n", 0}})
	rc := connect(t, proxyURI, "rogue")
	_, err := rc.Database("flag").Collection(coll).BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", 2}}).SetUpdate(bson.D{{"$set", bson.D{{"locked", false}}}}),
		mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", 2}}).SetUpdate(bson.D{{"$set", bson.D{{"n", 1}}}}),
	})
	refused(t, "a bulk that clears a free flag and writes data", err)
	if held, _ := mirror(t, rc, "flag", coll, 2); held {
		t.Fatal("the refused bulk left a mirror on a free flag")
	}
	if !flagCase().acquire(ctx, connect(t, proxyURI, "follower").Database("flag").Collection(coll), 2, "") {
		t.Fatalf("a follower's acquire of a free flag failed; document %v", stored(t, "flag", coll, 2))
	}
}

// TestRegressNamingAnotherHolderTakesNothing: a write naming a holder the
// document does not have matches nothing; it must not leave a mirror that
// keeps a free document busy (a loop of such writes would keep it
// unlockable), least of all a lease long one when it also sets the time.
func TestRegressNamingAnotherHolderTakesNothing(t *testing.T) {
	ctx := context.Background()
	for name, sc := range map[string]schemeCase{
		"holderFields": holderFieldsCase("holderFields", lease),
		"lockDocument": lockDocumentCase(),
	} {
		t.Run(name, func(t *testing.T) {
			const coll = "regress_naming"
			seed(t, sc.db, coll, bson.D{{"_id", 1}, {"value", 1}})
			rc := connect(t, proxyURI, "rogue")
			set := bson.D{{"LockTime", now()}}
			if sc.db == "lockDocument" {
				set = bson.D{{"Lock.expiresAt", in(time.Minute)}}
			}
			r, err := rc.Database(sc.db).Collection(coll).UpdateOne(ctx, bson.D{{"_id", 1}, {sc.holderPath, "x"}}, bson.D{{"$set", set}})
			if err != nil || r.ModifiedCount != 0 {
				t.Errorf("a write naming a holder the document does not have: %+v, %v; want modifiedCount 0", r, err)
			}
			if held, end := mirror(t, rc, sc.db, coll, 1); held {
				t.Errorf("it left a mirror on a free document, for %v", time.Until(end))
			}
			if !sc.acquire(ctx, connect(t, proxyURI, "follower").Database(sc.db).Collection(coll), 1, "f") {
				t.Errorf("the follower's acquire of a free document failed")
			}
		})
	}
}

// TestRegressFlagClearToFalseOnly (FINDINGS-schemes.md F3): a non-holder
// may clear a flag nobody holds only back to false; unset or null, the
// scheme's acquire ({locked: false}) could never take it again.
func TestRegressFlagClearToFalseOnly(t *testing.T) {
	ctx := context.Background()
	const coll = "regress_flagclear"
	rogue := connect(t, proxyURI, "rogue").Database("flag").Collection(coll)
	for _, locked := range []bool{false, true} {
		for name, u := range map[string]bson.D{
			"unset":    {{"$unset", bson.D{{"locked", ""}}}},
			"set null": {{"$set", bson.D{{"locked", nil}}}},
		} {
			seed(t, "flag", coll, bson.D{{"_id", 3}, {"locked", locked}})
			err := rogue.FindOneAndUpdate(ctx, bson.D{{"_id", 3}}, u).Err()
			refused(t, name+" of a flag nobody holds", err)
			if d := stored(t, "flag", coll, 3); d["locked"] != locked {
				t.Errorf("%s (flag %v) landed: %v", name, locked, d)
			}
		}
	}
	seed(t, "flag", coll, bson.D{{"_id", 3}, {"locked", false}})
	rogue.UpdateOne(ctx, bson.D{{"_id", 3}}, bson.D{{"$unset", bson.D{{"locked", ""}}}})
	if !flagCase().acquire(ctx, connect(t, proxyURI, "follower").Database("flag").Collection(coll), 3, "") {
		t.Errorf("the follower's acquire failed after a rogue's $unset; document %v", stored(t, "flag", coll, 3))
	}
}

// TestRegressAcquireExpiredAtOnce (FINDINGS-schemes.md F4): an acquire
// whose LockTime is already older than the lease takes a lock that has
// expired by its own time; it keeps no mirror that makes the scheme's
// next acquire "busy".
func TestRegressAcquireExpiredAtOnce(t *testing.T) {
	ctx := context.Background()
	const coll = "regress_expired"
	seed(t, "holderFields", coll, bson.D{{"_id", 2}, {"value", 1}})
	rc := connect(t, proxyURI, "rogue")
	old := primitive.NewDateTimeFromTime(time.Now().Add(-2 * lease))
	if _, err := rc.Database("holderFields").Collection(coll).UpdateOne(ctx, bson.D{{"_id", 2}}, bson.D{{"$set", bson.D{{"LockId", "R-1"}, {"LockTime", old}}}}); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if held, end := mirror(t, rc, "holderFields", coll, 2); held {
		t.Errorf("a lock expired by its own LockTime keeps a mirror for %v", time.Until(end))
	}
	if !holderFieldsCase("holderFields", lease).acquire(ctx, connect(t, proxyURI, "follower").Database("holderFields").Collection(coll), 2, "F1-1") {
		t.Errorf("the follower's acquire of an expired lock failed; document %v", stored(t, "holderFields", coll, 2))
	}
}

// BenchmarkSchemeAcquireRelease is one holderFields acquire and release
// (the application's own calls) through lockgate, which now reads the
// document's lock before and after an acquire and after a release, and
// straight at the database:
//
//	go test -run '^$' -bench SchemeAcquireRelease -benchtime 300x ./tests/schemes
func BenchmarkSchemeAcquireRelease(b *testing.B) {
	ctx := context.Background()
	for _, leg := range []struct{ name, uri string }{{"lockgate", proxyURI}, {"direct", directURI}} {
		b.Run(leg.name, func(b *testing.B) {
			c := connect(b, directURI, "seed").Database("holderFields").Collection("bench_acquire")
			c.Drop(ctx)
			if _, err := c.InsertOne(ctx, bson.D{{"_id", 1}, {"LockId", nil}}); err != nil {
				b.Fatal(err)
			}
			coll := connect(b, leg.uri, "bench").Database("holderFields").Collection("bench_acquire")
			hf := holderFieldsCase("holderFields", lease)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !hf.acquire(ctx, coll, 1, "g") {
					b.Fatal("acquire failed")
				}
				if r, err := coll.UpdateOne(ctx, bson.D{{"_id", 1}, {"LockId", "g"}}, bson.D{{"$set", bson.D{{"LockId", nil}, {"LockTime", nil}}}}); err != nil || r.ModifiedCount != 1 {
					b.Fatalf("release: %+v, %v", r, err)
				}
			}
		})
	}
}

// TestRegressThargaPick: Tharga.MongoDB's PickForUpdateAsync(filter) locks
// the first free document of several with one findOneAndUpdate whose
// filter names no _id; lockgate runs it pinned to each match in turn.
func TestRegressThargaPick(t *testing.T) {
	ctx := context.Background()
	const db, coll = "regress_tharga", "group"
	live := bson.D{{"LockKey", "k-other"}, {"LockTime", now()}, {"ExpireTime", in(time.Minute)}, {"Actor", "other"}, {"ExceptionInfo", nil}}
	seed(t, db, coll, bson.D{{"_id", 4}, {"Group", "g"}, {"Lock", live}}, bson.D{{"_id", 5}, {"Group", "g"}, {"Lock", nil}}, bson.D{{"_id", 6}, {"Group", "h"}, {"Lock", nil}})
	app := connect(t, proxyURI, "tharga").Database(db).Collection(coll)
	pick := func(key string) (bson.M, error) {
		var before bson.M
		at := now()
		err := app.FindOneAndUpdate(ctx,
			bson.D{{"$or", bson.A{
				bson.D{{"Group", "g"}, {"Lock", nil}},
				bson.D{{"Group", "g"}, {"Lock", bson.D{{"$ne", nil}}}, {"Lock.ExceptionInfo", nil}, {"Lock.ExpireTime", bson.D{{"$lt", at}}}},
			}}},
			bson.D{{"$set", bson.D{{"Lock", bson.D{{"LockKey", key}, {"LockTime", at}, {"ExpireTime", in(time.Minute)}, {"Actor", "worker"}}}}}}).Decode(&before)
		return before, err
	}
	before, err := pick("k5")
	if err != nil || before["_id"] != int32(5) {
		t.Fatalf("pick: %v, %v; want document 5 as it was", before, err)
	}
	if d := stored(t, db, coll, 5); d["Lock"].(bson.M)["LockKey"] != "k5" {
		t.Fatalf("document 5 after the pick: %v", d)
	}
	if d := stored(t, db, coll, 4); d["Lock"].(bson.M)["LockKey"] != "k-other" {
		t.Fatalf("document 4, locked by another, changed: %v", d)
	}
	if _, err := pick("k6"); err != mongo.ErrNoDocuments {
		t.Fatalf("pick with none free: %v, want no document", err)
	}
	c := connect(t, proxyURI, "observer")
	if held, _ := mirror(t, c, db, coll, 5); !held {
		t.Fatal("the picked document has no mirror")
	}
}

// TestRegressLockCollAcquireExpiredAtOnce: the lockCollection form of
// TestRegressAcquireExpiredAtOnce, found by the long model run (seed
// 1795733984867832023, step 58). A record inserted with a ts already
// older than the lease is abandoned by the scheme's own rule the moment
// it lands; it must keep no mirror that makes the scheme's next acquire
// "busy" (the unfixed code mirrored it for leaseMS from the write's
// arrival, however old its ts).
func TestRegressLockCollAcquireExpiredAtOnce(t *testing.T) {
	ctx := context.Background()
	lcSetup(t, "lockCollection", "regress_lc_old", "regress_lc_old.lock", 3)
	rc := connect(t, proxyURI, "rogue")
	old := primitive.NewDateTimeFromTime(time.Now().Add(-2 * lease))
	if _, err := rc.Database("lockCollection").Collection("regress_lc_old.lock").InsertOne(ctx, bson.D{{"_id", 3}, {"ts", old}}); err != nil {
		t.Fatalf("insert of an expired record: %v", err)
	}
	if held, end := mirror(t, rc, "lockCollection", "regress_lc_old.lock", 3); held {
		t.Errorf("a record expired by its own ts keeps a mirror for %v", time.Until(end))
	}
	f := connect(t, proxyURI, "follower").Database("lockCollection").Collection("regress_lc_old.lock")
	if _, err := f.InsertOne(ctx, bson.D{{"_id", 3}, {"ts", msNow()}, {"aid", "F1"}}); err != nil {
		t.Errorf("the follower's acquire of the abandoned record: %v", err)
	}
}
