package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/policy"
)

// TestPolicyViewUsesConfigKeys: /policy shows each rule with the keys and
// units of the configuration file (it used to show Go field names and a
// lease margin in nanoseconds).
func TestPolicyViewUsesConfigKeys(t *testing.T) {
	b, err := json.Marshal(viewOfRule(policy.Rule{
		Match: "shop.orders", Mode: policy.Enforce, Inserts: policy.InsertsRequireUnlocked,
		AllowCollectionWrites: true, MaxCandidates: 50, LeaseMargin: 1500 * time.Millisecond,
		RefuseLocksOnMissingCollection: true,
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"match":"shop.orders","mode":"enforce","inserts":"requireUnlocked","allowCollectionWrites":true,"allowCappedInserts":false,"maxCandidates":50,"leaseMarginMS":1500,"refuseLocksOnMissingCollection":true,"fence":"none"}`
	if string(b) != want {
		t.Errorf("rule view\n got  %s\n want %s", b, want)
	}
	b, _ = json.Marshal(viewOfRule(policy.Rule{Match: "shop.orders", Mode: policy.Enforce, FenceField: "_lockgateToken"}))
	if !strings.Contains(string(b), `"fence":"document","fenceField":"_lockgateToken"`) {
		t.Errorf("fenced rule view: %s", b)
	}
}

func TestLocksLimitParameter(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
		bad  bool
	}{{"", 0, false}, {"25", 25, false}, {"abc", 0, true}, {"0", 0, true}, {"-3", 0, true}} {
		n, err := queryLimit(tt.in)
		if (err != nil) != tt.bad || n != tt.want {
			t.Errorf("queryLimit(%q) = %d, %v", tt.in, n, err)
		}
		if err != nil && !strings.Contains(err.Error(), "positive whole number") {
			t.Errorf("queryLimit(%q): unhelpful error %v", tt.in, err)
		}
	}
}

func TestLocksNSParameter(t *testing.T) {
	if n, err := queryNS(""); err != nil || !n.IsZero() {
		t.Errorf(`queryNS("") = %v, %v, want no filter`, n, err)
	}
	if n, err := queryNS("shop.orders"); err != nil || n.String() != "shop.orders" {
		t.Errorf(`queryNS("shop.orders") = %v, %v`, n, err)
	}
	for _, bad := range []string{"orders", "shop.", ".orders"} {
		if _, err := queryNS(bad); err == nil || !strings.Contains(err.Error(), `want "db.coll"`) {
			t.Errorf("queryNS(%q): %v, want an error asking for db.coll", bad, err)
		}
	}
}

// TestPolicyWarningsForRulesThatProtectNothing: a misspelt rule and one
// that differs from the real namespace only by case are logged and shown
// in /policy (issue 9), at start and again at reload; a rule for an
// existing collection is not. And /locks?limit= that is not a positive
// number is a 400 that says so, not silently the default.
func TestPolicyWarningsForRulesThatProtectNothing(t *testing.T) {
	up := startEmbedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	if _, err := c.Database("shop").Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce},
		{Match: "shop.ordres", Mode: config.ModeEnforce},
		{Match: "Shop.orders", Mode: config.ModeEnforce},
	}
	core, logs := observer.New(zap.WarnLevel)
	logger := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	gw, err := Start(ctx, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	admin := "http://" + gw.AdminAddr().String()
	var view struct{ Warnings []string }
	// The start-up check runs beside serving, and /policy checks again on
	// its own: wait for both, the log line may come after the view.
	startLogged := func() bool { return logs.FilterMessageSnippet("policy rule matches no existing namespace").Len() >= 2 }
	testkit.Eventually(t, 15*time.Second, "the policy warnings on /policy and in the log", func() bool {
		_, body := httpGet(t, admin+"/policy")
		json.Unmarshal([]byte(body), &view)
		return len(view.Warnings) > 0 && startLogged()
	})
	all := strings.Join(view.Warnings, "\n")
	if len(view.Warnings) != 2 || !strings.Contains(all, `rule "shop.ordres" matches no existing namespace`) ||
		!strings.Contains(all, `rule "Shop.orders": database "Shop" does not exist, "shop" does: names differ only by case`) {
		t.Errorf("/policy warnings:\n%s\nwant one for the misspelt rule and one for the case-only difference", all)
	}
	if n := logs.FilterMessageSnippet("policy rule matches no existing namespace").Len(); n != 2 {
		t.Errorf("%d warnings logged at start, want 2", n)
	}

	next := *cfg
	next.Policy.Namespaces = []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce},
		{Match: "shop.Orders", Mode: config.ModeAudit},
		{Match: "shop.later", Mode: config.ModeAudit},
	}
	if err := gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	warnings := func() []string {
		_, body := httpGet(t, admin+"/policy")
		var v struct{ Warnings []string }
		json.Unmarshal([]byte(body), &v)
		return v.Warnings
	}
	caseOnly := `rule "shop.Orders": collection shop.Orders does not exist, shop.orders does: names differ only by case`
	if w := warnings(); len(w) != 2 || !strings.Contains(w[0], caseOnly) || !strings.Contains(w[1], `rule "shop.later" matches no existing namespace`) {
		t.Errorf("/policy warnings after reload: %q, want the case-only difference and the missing collection of the new rules", w)
	}
	if n := logs.FilterMessageSnippet("policy rule matches no existing namespace").Len(); n != 4 {
		t.Errorf("%d warnings logged after the reload, want 4 (2 at start, 2 at reload)", n)
	}
	// /policy checks again: a collection created since is no longer flagged.
	if _, err := c.Database("shop").Collection("later").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	if w := warnings(); len(w) != 1 || !strings.Contains(w[0], caseOnly) {
		t.Errorf("/policy warnings once shop.later exists: %q, want only the case-only difference", w)
	}

	for _, bad := range []string{"abc", "0", "-3"} {
		code, body := httpGet(t, admin+"/locks?limit="+bad)
		if code != 400 || !strings.Contains(body, "positive whole number") {
			t.Errorf("/locks?limit=%s = %d %s, want 400 saying it must be a positive whole number", bad, code, body)
		}
	}
	if code, body := httpGet(t, admin+"/locks?limit=5"); code != 200 || !strings.Contains(body, `"locks"`) {
		t.Errorf("/locks?limit=5 = %d %s", code, body)
	}
	cancel()
	gw.Wait()
}
