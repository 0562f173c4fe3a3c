package testkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireTool stops t when a program it needs is missing: a skip on a
// developer's machine, a failure under CI (the CI environment variable
// set), where every tool is installed and a skip would hide a test that no
// longer runs. missing is the result of checking for the tool (nil when it
// is there); its message should say how to install it.
func RequireTool(t testing.TB, tool string, missing error) {
	t.Helper()
	if missing == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s missing (CI is set, so this is a failure): %v", tool, missing)
	}
	t.Skipf("%s missing: %v (set CI=1 to make this a failure)", tool, missing)
}

// Pymongo checks that /usr/bin/python3 imports pymongo.
func Pymongo() error {
	if err := exec.Command("/usr/bin/python3", "-c", "import pymongo").Run(); err != nil {
		return fmt.Errorf("/usr/bin/python3 cannot import pymongo (%v): apt-get install -y python3-pymongo", err)
	}
	return nil
}

// OnPath checks that program is on PATH.
func OnPath(program, install string) error {
	if _, err := exec.LookPath(program); err != nil {
		return fmt.Errorf("%s is not on PATH: %s", program, install)
	}
	return nil
}

// NodeModule checks that node is on PATH and that pkg is installed in
// nodeModules (tests/compat/node/node_modules, the one npm ci fills).
func NodeModule(nodeModules, pkg string) error {
	const install = "install Node.js 20, then run `npm ci --ignore-scripts` in tests/compat/node"
	if err := OnPath("node", install); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(nodeModules, pkg, "package.json")); err != nil {
		return errors.New("tests/compat/node/node_modules/" + pkg + " is missing: run `npm ci --ignore-scripts` in tests/compat/node")
	}
	return nil
}
