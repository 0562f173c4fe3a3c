package scheme

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// abandonByID is Tharga.MongoDB's abandon of _id 1 of shop.ld: a
// findAndModify by _id alone that clears the lock, naming no holder.
func abandonByID(t *testing.T) *proxy.Request {
	t.Helper()
	return requestOf(t, bsoncore.NewDocumentBuilder().AppendString("findAndModify", "ld").
		AppendDocument("query", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).
		AppendDocument("update", bsoncore.NewDocumentBuilder().AppendDocument("$set",
			bsoncore.NewDocumentBuilder().AppendNull("Lock").Build()).Build()).
		AppendString("$db", "shop").Build())
}

// TestIdentityWriteHeadMovedBack: the CI failure of tharga's workload
// (docs/TESTING.md, "Issue 25: the eleventh box's tharga failure"). The
// lock store's head record of a key can be moved back by a late head
// write of the change before the newest (a release through the other
// proxy, overtaken by this client's acquire): it then shows the key free
// while the claims, which decide every grant, say this client's lock is
// held. The holder's abandon by _id alone must go on; once the lock is
// really released it must still be refused. The store is the real one on
// FerretDB, and the head is moved back by writing the release's head
// document again after the acquire, as the late writer does.
func TestIdentityWriteHeadMovedBack(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	pol, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.ld", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockDocument}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace.Of("shop.ld")
	r := pol.Lookup(ns)
	mns := r.Scheme.MirrorNS(ns)
	ids := []docid.ID{lockstoretest.ID(1)}
	str := func(s string) bsoncore.Value {
		return bsoncore.Value{Type: bson.TypeString, Data: bsoncore.AppendString(nil, s)}
	}
	cl, err := mongo.Connect(ctx, options.Client().ApplyURI(srv.URI()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Disconnect(context.Background()) })

	for _, c := range []struct {
		name string
		// released: the client's lock was really released (no head moved
		// back): the abandon is no holder's.
		released bool
	}{
		{"head moved back behind the holder's acquire", false},
		{"really released", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			coll := "locks_" + map[bool]string{false: "back", true: "released"}[c.released]
			store, err := lockstore.Open(ctx, lockstore.Config{URI: srv.URI(), Database: "headlag", Collection: coll,
				OpTimeout: 20 * time.Second, CleanupAfter: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close(context.Background()) })
			var d decisions
			sc := newUnit(store, &d)
			sc.cfg.Confirmed = store.ConfirmedStatus
			sc.cfg.Bind = func(v string) string { return v }
			sc.cfg.CommitStep = func(*proxy.Request, *policy.Policy, *Verdict, policy.Rule, policy.Write) *Violation { return nil }
			live := bson.D{{"_id", 1}, {"Lock", bson.D{{"actor", "kA"}, {"expiresAt", primitive.NewDateTimeFromTime(time.Now().Add(time.Minute))}}}}
			sc.cfg.Reader = &docsReader{docs: []bson.D{live}}
			req := abandonByID(t)

			// The lock before: another holder's, taken and released.
			x, _ := sc.owner(req, ns, r.Scheme, str("kX"))
			if _, err := store.Acquire(ctx, x, mns, ids, time.Minute, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Release(ctx, x, mns, ids, ""); err != nil {
				t.Fatal(err)
			}
			heads := cl.Database("headlag").Collection(coll)
			var releaseHead bson.Raw
			if err := heads.FindOne(ctx, bson.D{{"head", true}}).Decode(&releaseHead); err != nil {
				t.Fatal(err)
			}
			// This client's lock, as its pick took it.
			a, _ := sc.owner(req, ns, r.Scheme, str("kA"))
			locks, err := store.Acquire(ctx, a, mns, ids, time.Minute, 0)
			if err != nil || len(locks) != 1 {
				t.Fatal(locks, err)
			}
			cli := sc.client(req)
			sc.keys.holdings().Add(docid.KeyOf(mns, ids[0]), holding{session: cli.Session, bind: cli.Bind, holder: str("kA"), token: locks[0].Token})
			if c.released {
				if n, err := store.Release(ctx, a, mns, ids, ""); err != nil || n != 1 {
					t.Fatal(n, err)
				}
			} else {
				// The release's late head write.
				if _, err := heads.ReplaceOne(ctx, bson.D{{"_id", releaseHead.Lookup("_id")}}, releaseHead); err != nil {
					t.Fatal(err)
				}
				sts, err := store.Status(ctx, a, mns, ids)
				if err != nil || len(sts) != 1 || sts[0].HeldByYou {
					t.Fatalf("Status on the moved-back head = %+v, %v; the test wants it to say not held", sts, err)
				}
				sts, err = store.ConfirmedStatus(ctx, a, mns, ids)
				if err != nil || !heldWith(sts, locks[0].Token) {
					t.Fatalf("ConfirmedStatus = %+v, %v; want held by the client with token %d", sts, err, locks[0].Token)
				}
			}

			writes, err := policy.NewPlan(req.Message, req.Command).Writes()
			if err != nil || len(writes) != 1 {
				t.Fatalf("writes %v, %v", writes, err)
			}
			dec, ok := sc.Enforce(ctx, req, pol, writes, []policy.Rule{r}, time.Now())
			if !ok {
				t.Fatal("a write under a scheme was not the schemes'")
			}
			if c.released {
				if len(d.decided) != 1 || len(d.decided[0].Violations) != 1 || d.decided[0].Violations[0].Reason != ReasonNotHolder {
					t.Fatalf("decided %+v, want the abandon of a released lock refused as no holder's", d.decided)
				}
				return
			}
			// Allowed, the proxy runs the write itself on the client's
			// upstream connection, which this request has none of: that
			// is where it must end, not in a refusal.
			if len(d.decided) != 0 || dec.Action != proxy.Close || !strings.Contains(dec.Reason, "scheme release") {
				for _, v := range d.decided {
					t.Logf("violations: %+v", v.Violations)
				}
				t.Fatalf("decision %v %q, decided %d verdicts; want the holder's abandon run (ending at the missing upstream)", dec.Action, dec.Reason, len(d.decided))
			}
		})
	}
}
