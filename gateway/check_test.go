package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
)

func TestCheckPassesAgainstEmbeddedUpstream(t *testing.T) {
	up := startEmbedded(t)
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	cfg.AdminAuth.TokenFile = tok
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	if _, err := c.Database("shop").Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	cfg.Policy.Namespaces = []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce},
		{Match: "shop.ordres", Mode: config.ModeEnforce},
	}
	res := Check(ctx, cfg)
	names := []string{}
	var warnings []string
	for _, r := range res {
		names = append(names, r.Name)
		if r.Err != nil {
			t.Errorf("%s: %v", r.Name, r.Err)
		}
		warnings = append(warnings, r.Warnings...)
	}
	if got := strings.Join(names, ","); got != "tls,adminAuth,ownerSecret,upstream,lockstore,policy" {
		t.Errorf("checks %s", got)
	}
	// Issue 26: a misspelt rule next to the real one was "ok configuration".
	if len(warnings) != 1 || !strings.Contains(warnings[0], `rule "shop.ordres" matches no existing namespace`) || !strings.Contains(warnings[0], `did you mean "shop.orders"?`) {
		t.Errorf("policy warnings %q, want one for shop.ordres suggesting shop.orders", warnings)
	}
}

func TestDidYouMean(t *testing.T) {
	names := []string{"orders", "orders_archive", "users", "jobs", "logs"}
	for _, tt := range []struct{ n, want string }{
		{"ordres", `; did you mean "shop.orders"?`},            // transposition
		{"order", `; did you mean "shop.orders"?`},             // deletion
		{"oders", `; did you mean "shop.orders"?`},             // deletion
		{"user", `; did you mean "shop.users"?`},               // deletion
		{"jbs", `; did you mean "shop.jobs"?`},                 // one edit in three runes
		{"ab", ""},                                             // too short to suggest
		{"invoices", ""},                                       // nothing close
		{"logz", `; did you mean "shop.logs"?`},                // substitution
		{"jogs", `; did you mean "shop.jobs" or "shop.logs"?`}, // ties: both
	} {
		if got := didYouMean(names, tt.n, "shop."); got != tt.want {
			t.Errorf("didYouMean(%q) = %q, want %q", tt.n, got, tt.want)
		}
	}
	if d := editDistance("ordres", "orders"); d != 1 {
		t.Errorf("editDistance(ordres, orders) = %d, want 1 (a transposition)", d)
	}
}

func TestCheckNamesWhatFails(t *testing.T) {
	cfg := testConfig()
	cfg.Upstream.URI = "mongodb://127.0.0.1:1/"
	cfg.Upstream.DialTimeout = config.Duration(200 * time.Millisecond)
	cfg.Lockstore.OwnerSecretFile = filepath.Join(t.TempDir(), "missing")
	failed := map[string]bool{}
	for _, r := range Check(context.Background(), cfg) {
		failed[r.Name] = r.Err != nil
	}
	if !failed["upstream"] || !failed["lockstore"] || !failed["ownerSecret"] || failed["tls"] || failed["adminAuth"] {
		t.Errorf("failed checks: %v", failed)
	}
}

func TestRedactURI(t *testing.T) {
	for in, want := range map[string]string{
		"mongodb://u:s3cr%40t@db:27017/":                "mongodb://u:xxxxx@db:27017/",
		"mongodb+srv://app:pw@cluster0.example.net/":    "mongodb+srv://app:xxxxx@cluster0.example.net/",
		"mongodb://db1:27017,db2:27017/?replicaSet=rs0": "mongodb://db1:27017,db2:27017/?replicaSet=rs0",
	} {
		if got := redactURI(in); got != want {
			t.Errorf("redactURI(%q) = %q, want %q", in, got, want)
		}
	}
}
