package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/config"
)

// TestAdminTokenRule: the operator token's length rule is enforced at
// start with a message that states it, and stated where operators
// configure the token, so that they learn it before a start fails
// (issue 9).
func TestAdminTokenRule(t *testing.T) {
	dir := t.TempDir()
	file := func(tok string) string {
		p := filepath.Join(dir, fmt.Sprint(len(tok)))
		if err := os.WriteFile(p, []byte("  "+tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	short := strings.Repeat("x", minAdminToken-1)
	if _, err := adminToken(config.AdminAuth{TokenFile: file(short)}); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("shorter than %d characters", minAdminToken)) {
		t.Errorf("a %d-character token: %v, want a refusal that states the rule", len(short), err)
	}
	ok := strings.Repeat("x", minAdminToken)
	if got, err := adminToken(config.AdminAuth{TokenFile: file(ok)}); err != nil || got != ok {
		t.Errorf("a %d-character token: %q, %v, want it accepted (white space trimmed)", len(ok), got, err)
	}
	for _, doc := range []string{"../config.example.yaml", "../docs/OPERATIONS.md", "../README.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "#", "")), " ")
		if !strings.Contains(text, fmt.Sprintf("at least %d characters", minAdminToken)) {
			t.Errorf("%s does not state the token length rule (\"at least %d characters\")", doc, minAdminToken)
		}
	}
}
