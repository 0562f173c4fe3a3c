package enforce

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestImportsPointDown: enforcement's unit imports nothing of package
// guard, which assembles it, nor of any stage; of the guard's units only
// those it calls.
func TestImportsPointDown(t *testing.T) {
	// go test puts its own go command first on PATH.
	cmd := exec.Command("go", "list", "-deps", ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	allowed := map[string]bool{"authority": true, "inflight": true, "refuse": true, "scheme": true, "txn": true, "enforce": true}
	for _, dep := range strings.Fields(string(out)) {
		rest, ok := strings.CutPrefix(dep, "github.com/lockgate/lockgate/guard")
		if !ok {
			continue
		}
		if rest == "" || !allowed[strings.TrimPrefix(rest, "/")] {
			t.Errorf("guard/enforce imports %s", dep)
		}
	}
}
