package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
)

// TestForceReleaseOfALockThatChangedHands: an operator looks at /locks (or
// the console), sees a stuck holder and force-releases it with the token
// shown; meanwhile that holder released and another session took the
// lock. The force-release must not free the new holder, whom nobody chose
// to free: 409, naming who holds it now, and the new holder keeps its
// lock. The token of the new holding releases it.
func TestForceReleaseOfALockThatChangedHands(t *testing.T) {
	up := startEmbedded(t)
	const adminToken = "s3cret-operator-token"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.AdminAuth.TokenFile = secretFile(t, adminToken+"\n")
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}
	gw := startGateway(t, cfg)
	admin := gw.admin
	session := func(app string) (*mongo.Database, context.Context) {
		c, sctx := gw.session(t, app)
		return c.Database("shop"), sctx
	}
	acquire := func(db *mongo.Database, sctx context.Context) int64 {
		t.Helper()
		var acq bson.M
		if err := db.RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&acq); err != nil {
			t.Fatalf("acquireLock: %v", err)
		}
		return acq["locks"].(bson.A)[0].(bson.M)["token"].(int64)
	}
	stuck, stuckCtx := session("stuck-job")
	seen := acquire(stuck, stuckCtx) // what the operator sees listed
	if err := stuck.RunCommand(stuckCtx, bson.D{{Key: "releaseLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Err(); err != nil {
		t.Fatal(err)
	}
	editor, editorCtx := session("editor")
	now := acquire(editor, editorCtx)

	release := func(token string) (int, string) {
		return post(t, admin+"/locks/release", adminToken,
			fmt.Sprintf(`{"namespace": "shop.orders", "key": "{\"$numberInt\":\"42\"}", "token": %s, "reason": "stuck job"}`, token))
	}
	// As the console sends it (a string: 64 bits), and as a number.
	for _, tok := range []string{fmt.Sprintf(`"%d"`, seen), fmt.Sprint(seen)} {
		code, body := release(tok)
		if code != http.StatusConflict || !strings.Contains(body, "no longer the one with token") || !strings.Contains(body, `app \"editor\"`) {
			t.Fatalf("force-release of the holding seen (token %s) after it changed hands: %d %s, want 409 naming the editor", tok, code, body)
		}
	}
	// The editor still holds its lock: its write goes through.
	if _, err := editor.Collection("orders").UpdateOne(editorCtx, bson.D{{Key: "_id", Value: 42}}, bson.D{{Key: "$set", Value: bson.D{{Key: "by", Value: "editor"}}}}, options.Update().SetUpsert(true)); err != nil {
		t.Fatalf("the editor's write after a refused force-release: %v", err)
	}
	if code, body := post(t, admin+"/locks/release", adminToken, `{"namespace": "orders", "key": "{\"$numberInt\":\"42\"}", "reason": "stuck job"}`); code != http.StatusBadRequest || !strings.Contains(body, "db.coll") {
		t.Fatalf("a namespace without its database: %d %s, want 400 asking for db.coll", code, body)
	}
	if code, body := release(`"junk"`); code != http.StatusBadRequest {
		t.Fatalf("a token that is no integer: %d %s, want 400", code, body)
	}
	if code, body := release(fmt.Sprintf(`"%d"`, now)); code != 200 || !strings.Contains(body, `"released": true`) {
		t.Fatalf("force-release of the current holding: %d %s", code, body)
	}
	err := editor.RunCommand(editorCtx, bson.D{{Key: "renewLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Err()
	if err == nil || !strings.Contains(err.Error(), "an operator force-released it") {
		t.Fatalf("renewLock after the force-release: %v", err)
	}
}
