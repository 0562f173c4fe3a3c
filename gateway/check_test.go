package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	res := Check(ctx, cfg)
	names := []string{}
	for _, r := range res {
		names = append(names, r.Name)
		if r.Err != nil {
			t.Errorf("%s: %v", r.Name, r.Err)
		}
	}
	if got := strings.Join(names, ","); got != "tls,adminAuth,ownerSecret,upstream,lockstore" {
		t.Errorf("checks %s", got)
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
