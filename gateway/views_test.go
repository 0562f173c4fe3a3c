package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"go.mongodb.org/mongo-driver/bson"
)

func post(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestLockViewsForceReleaseAndReload: a lock taken through the proxy shows
// in /locks; an operator with the token force-releases it (without the
// token: refused); the fencing token grows; a reload changes the policy
// version shown by /policy, and an invalid one is refused.
func TestLockViewsForceReleaseAndReload(t *testing.T) {
	up := startEmbedded(t)
	const token = "s3cret-operator-token"
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.AdminAuth.TokenFile = secretFile(t, token+"\n")
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeAudit}}
	gw := startGateway(t, cfg)
	admin := gw.admin
	client, sctx := gw.session(t, "viewer")
	var acq bson.M
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&acq); err != nil {
		t.Fatalf("acquireLock through the gateway: %v", err)
	}
	firstToken := acq["locks"].(bson.A)[0].(bson.M)["token"].(int64)

	code, body := httpGet(t, admin+"/locks")
	var view struct {
		Locks []lockView `json:"locks"`
	}
	if err := json.Unmarshal([]byte(body), &view); code != 200 || err != nil || len(view.Locks) != 1 {
		t.Fatalf("/locks = %d %s", code, body)
	}
	if l := view.Locks[0]; l.NS != "shop.orders" || l.Holder == nil || l.Holder.App != "viewer" || !l.Held || len(l.Holder.Tag) != 8 || l.Token != firstToken ||
		l.Key != `{"$numberInt":"42"}` {
		t.Fatalf("/locks shows %+v", l)
	}

	release := `{"namespace": "shop.orders", "id": 42, "reason": "stuck job"}`
	if code, _ := post(t, admin+"/locks/release", "", release); code != http.StatusUnauthorized {
		t.Fatalf("force-release without a token: %d, want 401", code)
	}
	if code, _ := post(t, admin+"/locks/release", "wrong-token-wrong-token", release); code != http.StatusUnauthorized {
		t.Fatalf("force-release with a wrong token: %d, want 401", code)
	}
	if code, body := post(t, admin+"/locks/release", token, release); code != 200 || !strings.Contains(body, `"released": true`) {
		t.Fatalf("force-release: %d %s", code, body)
	}
	// The old holder is told what happened, not that its lock "expired or
	// was never taken" (issue 9).
	err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "renewLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Err()
	if err == nil || !strings.Contains(err.Error(), `an operator force-released it (reason: "stuck job")`) {
		t.Fatalf("renewLock after a force-release: %v, want it to say an operator force-released it and why", err)
	}
	// A force-release naming the id with another type than the lock's
	// releases nothing, and says so with a 404 that points at the type.
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{43}}}).Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := post(t, admin+"/locks/release", token, `{"namespace": "shop.orders", "id": "43", "reason": "typo"}`); code != http.StatusNotFound ||
		!strings.Contains(body, `a lock is held on _id 43, of another type`) {
		t.Fatalf("force-release of \"43\" where 43 is locked: %d %s", code, body)
	}
	// The lock's key, as /locks lists it, names exactly that lock; with
	// an id as well the request is ambiguous, and refused.
	byKey := `{"namespace": "shop.orders", "key": "{\"$numberInt\":\"43\"}", "reason": "by key"}`
	if code, body := post(t, admin+"/locks/release", token, `{"namespace": "shop.orders", "id": 43, "key": "{\"$numberInt\":\"43\"}", "reason": "both"}`); code != http.StatusBadRequest {
		t.Fatalf("force-release naming both an id and a key: %d %s, want 400", code, body)
	}
	if code, body := post(t, admin+"/locks/release", token, byKey); code != 200 || !strings.Contains(body, `"released": true`) {
		t.Fatalf("force-release by key: %d %s", code, body)
	}
	// The old holder no longer holds it; the next holder gets a larger token.
	var st bson.M
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "lockStatus", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if held := st["locks"].(bson.A)[0].(bson.M)["held"]; held != false {
		t.Fatalf("still held after force-release: %v", st)
	}
	if err := client.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{42}}}).Decode(&acq); err != nil {
		t.Fatal(err)
	}
	if tok := acq["locks"].(bson.A)[0].(bson.M)["token"].(int64); tok <= firstToken+1 {
		t.Fatalf("token after force-release and re-acquire = %d, want > %d (force-release raises it)", tok, firstToken+1)
	}

	_, body = httpGet(t, admin+"/policy")
	var pv struct{ Version string }
	json.Unmarshal([]byte(body), &pv)
	before := pv.Version
	next := *cfg
	next.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}
	if err := gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	_, body = httpGet(t, admin+"/policy")
	json.Unmarshal([]byte(body), &pv)
	if pv.Version == before || !strings.Contains(body, `"enforce"`) {
		t.Fatalf("/policy after reload: %s (version before %s)", body, before)
	}
	bad := next
	bad.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.orders", Mode: "strict"}}
	if err := gw.Reload(&bad); err == nil {
		t.Fatal("invalid policy accepted")
	}
	_, body2 := httpGet(t, admin+"/policy")
	if body2 != body {
		t.Fatalf("refused reload changed the policy:\n%s\n%s", body, body2)
	}
	if err := gw.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
