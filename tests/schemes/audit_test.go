package schemes

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
)

// TestSchemeAudit: with a scheme in audit mode, writes that do not follow
// it are forwarded unchanged, and each is logged with the writer's client
// address and application and counted as would_reject; the scheme's own
// flow works as under enforce.
func TestSchemeAudit(t *testing.T) {
	ctx := context.Background()
	direct := connect(t, directURI, "seed")
	rogue := connect(t, proxyURI, "audit-rogue")
	app := connect(t, proxyURI, "audit-app")
	byID := bson.D{{"_id", 1}}
	inc := bson.D{{"$inc", bson.D{{"n", 1}}}}
	cases := []struct {
		db     string
		seed   bson.D
		reason string
		// acquire, write and release as the scheme's application does.
		flow []func() (int64, error)
	}{
		{db: "audit_holderFields", seed: bson.D{{"_id", 1}, {"n", 0}, {"LockId", nil}}, reason: "scheme_not_followed"},
		{db: "audit_lockDocument", seed: bson.D{{"_id", 1}, {"n", 0}, {"Lock", nil}}, reason: "scheme_not_followed"},
		{db: "audit_flag", seed: bson.D{{"_id", 1}, {"n", 0}, {"locked", false}}, reason: "scheme_not_holder"},
		{db: "audit_lockCollection", seed: bson.D{{"_id", 1}, {"n", 0}}, reason: "scheme_not_holder"},
	}
	for _, c := range cases {
		t.Run(c.db, func(t *testing.T) {
			coll := direct.Database(c.db).Collection("jobs")
			coll.Drop(ctx)
			if _, err := coll.InsertOne(ctx, c.seed); err != nil {
				t.Fatal(err)
			}
			rule := c.db + ".*"
			would := map[string]string{"rule": rule, "decision": "would_reject", "reason": c.reason}
			before := metricValue(t, "lockgate_decisions_total", would)
			logged := auditLog.FilterField(zapString("ns", c.db+".jobs")).FilterField(zapString("decision", "would_reject")).Len()
			r, err := rogue.Database(c.db).Collection("jobs").UpdateOne(ctx, byID, inc)
			if err != nil || r.ModifiedCount != 1 {
				t.Fatalf("audited rogue write: %+v, %v; want it applied", r, err)
			}
			if n := metricValue(t, "lockgate_decisions_total", would) - before; n != 1 {
				t.Fatalf("would_reject %s counted %v times, want 1", c.reason, n)
			}
			lines := auditLog.FilterField(zapString("ns", c.db+".jobs")).FilterField(zapString("decision", "would_reject")).All()
			if len(lines) != logged+1 {
				t.Fatalf("%d would_reject lines logged, want 1", len(lines)-logged)
			}
			f := lines[len(lines)-1].ContextMap()
			if f["app"] != "audit-rogue" || f["client"] == "" || f["reason"] != c.reason {
				t.Fatalf("decision line %v: want app audit-rogue, the client address and reason %s", f, c.reason)
			}

			// The scheme's own flow, audited: acquire, write, release.
			jobs := app.Database(c.db).Collection("jobs")
			var filter bson.D
			switch c.db {
			case "audit_holderFields":
				if err := jobs.FindOneAndUpdate(ctx, bson.D{{"_id", 1}, {"LockId", nil}}, bson.D{{"$set", bson.D{{"LockId", "me"}}}}).Err(); err != nil {
					t.Fatal(err)
				}
				filter = bson.D{{"_id", 1}, {"LockId", "me"}}
				defer jobs.UpdateOne(ctx, filter, bson.D{{"$set", bson.D{{"LockId", nil}}}})
			case "audit_lockDocument":
				if _, err := jobs.UpdateOne(ctx, bson.D{{"_id", 1}, {"Lock", nil}}, bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", "me"}}}}}}); err != nil {
					t.Fatal(err)
				}
				filter = bson.D{{"_id", 1}, {"Lock.actor", "me"}}
			case "audit_lockCollection":
				direct.Database(c.db).Collection("jobs.lock").Drop(ctx)
				if _, err := app.Database(c.db).Collection("jobs.lock").InsertOne(ctx, bson.D{{"_id", 1}, {"ts", msNow()}, {"aid", "me"}}); err != nil {
					t.Fatal(err)
				}
				filter = byID
			default:
				if r, err := jobs.UpdateOne(ctx, bson.D{{"_id", 1}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}}}}); err != nil || r.ModifiedCount != 1 {
					t.Fatal(r, err)
				}
				filter = byID
			}
			followed := map[string]string{"rule": rule, "decision": "would_reject"}
			before = metricValue(t, "lockgate_decisions_total", followed)
			if r, err := jobs.UpdateOne(ctx, filter, inc); err != nil || r.ModifiedCount != 1 {
				t.Fatalf("holder's write: %+v, %v", r, err)
			}
			if n := metricValue(t, "lockgate_decisions_total", followed) - before; n != 0 {
				t.Fatalf("a write that follows the scheme was counted as would_reject")
			}
		})
	}
}

func zapString(k, v string) zap.Field { return zap.String(k, v) }
