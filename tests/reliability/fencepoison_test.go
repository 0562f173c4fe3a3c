package reliability

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// TestFenceOnAPoisonedField is issue 27 item 4: with fence: document, a
// document whose fence field already holds something other than a number
// (written before the fence was turned on, or by a writer the rule does
// not cover). Before the fix acquireLock's $max left such a value in
// place and reported success, and the clause {$in: [token, null]} matched
// any array holding null or the stale holder's token: the stale holder's
// write landed and the current holder was fenced out of its own document.
//
// The stale holder is made the way a partition makes one: two lockgates
// in front of the same collection with lock stores of their own, so each
// proxy's check passes for its own holder and only the database can
// refuse. The holder through the second one takes the lock later, so its
// token (the server clock in nanoseconds for a first lock) is the newer.
func TestFenceOnAPoisonedField(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	collName := uniq("poisoned")
	ns := relDB + "." + collName
	stale := startGateway(t, fencedConfig(upstream.URI(), ns, true))
	current := startGateway(t, fencedConfig(upstream.URI(), ns, true))
	viaStale := connect(t, stale.URI, "stale-holder")
	viaCurrent := connect(t, current.URI, "current-holder")
	direct := connect(t, upstream.URI(), "direct").Database(relDB).Collection(collName)

	acquire := func(t *testing.T, sctx context.Context, c *mongo.Client, id int) int64 {
		t.Helper()
		var r struct {
			Locks []struct {
				Token int64 `bson:"token"`
			} `bson:"locks"`
		}
		// No retry: the later acquire's token comes out above the stamp
		// of the other lock store's holder, which it reads first (guard
		// TestAcquireOverAnotherStoresStamp); before that it could come
		// out lower, its stamp was refused ("another holder's stamp") and
		// this retried.
		err := c.Database(relDB).RunCommand(sctx, bson.D{{Key: "acquireLock", Value: collName}, {Key: "ids", Value: bson.A{id}}, {Key: "leaseMS", Value: 60000}}).Decode(&r)
		if err != nil || len(r.Locks) != 1 {
			t.Fatalf("acquireLock %d: %+v %v", id, r, err)
		}
		return r.Locks[0].Token
	}
	// stamp reads the field as it is, number or not.
	stamp := func(id int) bson.RawValue {
		t.Helper()
		var d bson.Raw
		if err := direct.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return d.Lookup(fenceField)
	}
	isToken := func(v bson.RawValue, tok int64) bool {
		n, ok := v.AsInt64OK()
		return ok && v.Type != bson.TypeArray && n == tok
	}
	set := func(sctx context.Context, c *mongo.Client, id int, by string) (*mongo.UpdateResult, error) {
		return c.Database(relDB).Collection(collName).UpdateOne(sctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "by", Value: by}}}})
	}

	for i, c := range []struct {
		name string
		// before: the field's value before anyone locks; after: the value
		// written into it once the stale holder has its token (nil: none).
		before any
		after  func(token int64) any
	}{
		{name: "[null]", before: bson.A{nil}},
		{name: "string", before: "x"},
		{name: "object", before: bson.D{{Key: "a", Value: 1}}},
		{name: "empty array", before: bson.A{}},
		{name: "boolean", before: true},
		{name: "[stale token]", after: func(tok int64) any { return bson.A{tok} }},
		{name: "[stale token, null]", after: func(tok int64) any { return bson.A{tok, nil} }},
		{name: "[stale token - 1]", after: func(tok int64) any { return bson.A{tok - 1} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := 100 + i
			doc := bson.D{{Key: "_id", Value: id}, {Key: "by", Value: "nobody"}}
			if c.before != nil {
				doc = append(doc, bson.E{Key: fenceField, Value: c.before})
			}
			if _, err := direct.InsertOne(ctx, doc); err != nil {
				t.Fatal(err)
			}
			sa, err := viaStale.StartSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sa.EndSession(ctx)
			sb, err := viaCurrent.StartSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sb.EndSession(ctx)
			actx, bctx := mongo.NewSessionContext(ctx, sa), mongo.NewSessionContext(ctx, sb)

			staleToken := acquire(t, actx, viaStale, id)
			if c.after != nil {
				if _, err := direct.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: fenceField, Value: c.after(staleToken)}}}}); err != nil {
					t.Fatal(err)
				}
			}
			currentToken := acquire(t, bctx, viaCurrent, id)
			if currentToken <= staleToken {
				// Two lock stores order their first tokens by their
				// estimates of the server's clock, and by the document's
				// stamp where there is one (docs/LOCKS.md, "Fencing
				// tokens"); the poison written over the stale holder's
				// stamp leaves only the clocks, which under load can be
				// a few ms apart. The fence does not rest on the order:
				// a holder's write must find its own token, checked
				// below either way.
				t.Logf("the later lock has token %d, not above the stale holder's %d (the two stores' clock estimates)", currentToken, staleToken)
			}
			if v := stamp(id); !isToken(v, currentToken) {
				t.Errorf("after the current holder's acquireLock the field holds %v, want its token %d", v, currentToken)
			}

			_, staleErr := set(actx, viaStale, id, "stale holder")
			var after struct {
				By string `bson:"by"`
			}
			if err := direct.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&after); err != nil {
				t.Fatal(err)
			}
			if after.By != "nobody" {
				t.Errorf("the stale holder's write landed (error %v): by = %q, field %v", staleErr, after.By, stamp(id))
			} else {
				wantFencedOut(t, "stale holder", staleErr)
			}

			res, err := set(bctx, viaCurrent, id, "current holder")
			if res == nil {
				res = &mongo.UpdateResult{}
			}
			if err != nil || res.ModifiedCount != 1 {
				t.Errorf("the current holder could not write its own document: %+v %v", res, err)
			}
			if v := stamp(id); !isToken(v, currentToken) {
				t.Errorf("after the current holder's write the field holds %v, want %d", v, currentToken)
			}
		})
	}

	// A number above every token (written by hand, or by a writer the rule
	// does not cover) cannot be told from a newer holder's stamp: $max
	// keeps it, the read-back sees it, and acquireLock fails and takes
	// nothing rather than hand out a lock its holder could never write
	// under.
	t.Run("number above the token", func(t *testing.T) {
		id := 200
		if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: fenceField, Value: int64(math.MaxInt64)}}); err != nil {
			t.Fatal(err)
		}
		s, err := viaCurrent.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.EndSession(ctx)
		sctx := mongo.NewSessionContext(ctx, s)
		err = viaCurrent.Database(relDB).RunCommand(sctx, bson.D{{Key: "acquireLock", Value: collName}, {Key: "ids", Value: bson.A{id}}}).Err()
		if commandCode(err) != 46 || !strings.Contains(err.Error(), "fence") {
			t.Fatalf("acquireLock on a document stamped above its token: %v, want LockBusy (fence_stamp_failed)", err)
		}
		var st struct {
			Locks []struct {
				Held bool `bson:"held"`
			} `bson:"locks"`
		}
		if err := viaCurrent.Database(relDB).RunCommand(sctx, bson.D{{Key: "lockStatus", Value: collName}, {Key: "ids", Value: bson.A{id}}}).Decode(&st); err != nil || len(st.Locks) != 1 || st.Locks[0].Held {
			t.Fatalf("the lock whose stamp failed is still held: %+v %v", st, err)
		}
	})
}
