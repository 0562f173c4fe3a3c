package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestReportBuildShowsDownloadsAndProgress(t *testing.T) {
	lines := make(chan string)
	tick := make(chan time.Time)
	var out bytes.Buffer
	done := make(chan []byte)
	go func() { done <- reportBuild(lines, &out, tick) }()

	lines <- "go: downloading github.com/FerretDB/FerretDB v1.24.0"
	lines <- "internal/abi"
	lines <- "runtime"
	tick <- time.Time{}
	lines <- "github.com/lockgate/lockgate/wire"
	lines <- "# github.com/lockgate/lockgate/wire"
	lines <- "wire/x.go:1:2: undefined: y"
	close(lines)
	other := <-done

	got := out.String()
	for _, want := range []string{
		"devstack: building the dev stack",
		"go: downloading github.com/FerretDB/FerretDB v1.24.0",
		"still building: 2 packages compiled so far",
		"devstack: built (3 packages compiled)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("progress output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "undefined: y") {
		t.Errorf("compiler output belongs to a failed build's report, not the progress:\n%s", got)
	}
	if want := "# github.com/lockgate/lockgate/wire\nwire/x.go:1:2: undefined: y\n"; string(other) != want {
		t.Errorf("other output = %q, want %q", other, want)
	}
}

func TestReportBuildIsQuietWhenFast(t *testing.T) {
	var out bytes.Buffer
	reportBuild(scanLines(strings.NewReader("runtime\n")), &out, nil)
	if out.Len() != 0 {
		t.Errorf("a build that ends before the first tick printed %q", out.String())
	}
}

// TestLauncherBuildsTheStack builds the real dev stack the way `go run
// ./cmd/devstack` does and runs the result: its flag usage proves that the
// binary is the dev stack and that it receives the launcher's arguments.
func TestLauncherBuildsTheStack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the dev stack binary")
	}
	// A fresh place for the binary, and the usual build cache kept: the
	// default GOCACHE lives under XDG_CACHE_HOME too.
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOCACHE", strings.TrimSpace(string(gocache)))
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var progress bytes.Buffer
	bin, err := buildStack(context.Background(), &progress, nil)
	if err != nil {
		t.Fatalf("buildStack: %v\n%s", err, progress.String())
	}
	out, err := exec.Command(bin, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -h: %v\n%s", bin, err, out)
	}
	for _, flag := range []string{"-config", "-listen", "-admin", "-data"} {
		if !strings.Contains(string(out), flag) {
			t.Errorf("dev stack usage lacks %s:\n%s", flag, out)
		}
	}
}
