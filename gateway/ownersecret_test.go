package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/config"
)

// TestOwnerSecretSources: the owner secret comes from LOCKGATE_OWNER_SECRET
// (the value) before lockstore.ownerSecretFile or LOCKGATE_OWNER_SECRET_FILE
// (a path); a short secret is refused at start whichever way it came;
// nothing configured means a random per-process secret (nil here).
func TestOwnerSecretSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "owner.secret")
	fromFile := strings.Repeat("f", 64)
	if err := os.WriteFile(file, []byte(fromFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromEnv := strings.Repeat("e", 64)
	env := func(vars map[string]string) config.Lockstore {
		c := config.Default()
		c.ApplyEnv(func(k string) string { return vars[k] })
		return c.Lockstore
	}
	for _, tt := range []struct {
		name    string
		ls      config.Lockstore
		want    string
		wantErr string
	}{
		{"nothing", env(nil), "", ""},
		{"file by env", env(map[string]string{config.EnvOwnerSecret: file}), fromFile, ""},
		{"value by env wins", env(map[string]string{config.EnvOwnerSecret: file, config.EnvOwnerSecretValue: fromEnv}), fromEnv, ""},
		{"short value", env(map[string]string{config.EnvOwnerSecretValue: "short"}), "", config.EnvOwnerSecretValue},
		{"missing file", config.Lockstore{OwnerSecretFile: filepath.Join(dir, "none")}, "", "ownerSecretFile"},
	} {
		got, err := readOwnerSecret(tt.ls)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want one naming %s", tt.name, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case string(got) != tt.want:
			t.Errorf("%s: secret %q, want %q", tt.name, got, tt.want)
		}
	}
}
