package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
)

// forbiddenDeps must never be linked into the production binary.
// The in-memory lock store and resolver keep locks in one process, which
// would make enforcement across proxies meaningless.
var forbiddenDeps = []string{"github.com/FerretDB/", "sqlite", "github.com/lockgate/lockgate/testserver/embedded", "github.com/chromedp/",
	"github.com/lockgate/lockgate/lockstore/memstore", "github.com/lockgate/lockgate/lockstore/lockstoretest", "github.com/lockgate/lockgate/guard/guardtest"}

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	// go test puts its own go command first on PATH.
	cmd := exec.Command("go", "list", "-deps", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	return strings.Fields(string(out))
}

func forbidden(deps []string) []string {
	var bad []string
	for _, d := range deps {
		for _, f := range forbiddenDeps {
			if strings.Contains(d, f) {
				bad = append(bad, d)
				break
			}
		}
	}
	return bad
}

func TestProductionBinaryHasNoFerretDB(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	if bad := forbidden(goListDeps(t, "github.com/lockgate/lockgate/cmd/proxy")); len(bad) > 0 {
		t.Fatalf("cmd/proxy links packages that must stay out of production:\n%s", strings.Join(bad, "\n"))
	}
	// The detector itself must work: the embedded upstream is exactly what
	// it has to catch.
	if bad := forbidden(goListDeps(t, "github.com/lockgate/lockgate/testserver/embedded")); len(bad) == 0 {
		t.Fatal("the forbidden-dependency check does not recognise testserver/embedded's dependencies")
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lockgate.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func runOnce(t *testing.T, args []string, getenv func(string) string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // anything that gets as far as serving stops at once
	code := run(ctx, args, getenv, &stdout, &stderr, nil)
	return code, stdout.String(), stderr.String()
}

func TestExitCodes(t *testing.T) {
	bad := writeFile(t, "lockstore:\n  defaultLeaseMS: 0\n")
	unknown := writeFile(t, "listen: 127.0.0.1:1\nlisten_addr: x\n")
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"version", []string{"-version"}, nil, exitOK, "lockgate ", ""},
		{"help", []string{"-h"}, nil, exitOK, "", "Usage: lockgate"},
		{"unknown flag", []string{"-nope"}, nil, exitUsage, "", "flag provided but not defined: -nope"},
		{"stray argument", []string{"extra"}, nil, exitUsage, "", `unexpected arguments: ["extra"]`},
		{"invalid value", []string{"-config", bad}, nil, exitUsage, "",
			"lockstore.defaultLeaseMS: must be between 1 and lockstore.maxLeaseMS (600000), got 0"},
		{"config from env", nil, map[string]string{EnvConfig: bad}, exitUsage, "", bad},
		{"unknown key", []string{"-config", unknown}, nil, exitUsage, "", "line 2: listen_addr: unknown key"},
		{"missing file", []string{"-config", "/nonexistent/lockgate.yaml"}, nil, exitUsage, "", "/nonexistent/lockgate.yaml"},
		{"invalid flag value", []string{"-log-level", "loud"}, nil, exitUsage, "", `log.level: must be one of debug, info, warn, error, got "loud"`},
		{"invalid env value", nil, map[string]string{"LOCKGATE_LISTEN": "nope"}, exitUsage, "", `listen: must be host:port`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runOnce(t, tt.args, env(tt.env))
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstderr: %s", code, tt.wantCode, stderr)
			}
			if !strings.Contains(stdout, tt.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout, tt.wantStdout)
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr, tt.wantStderr)
			}
		})
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "listen: 127.0.0.1:1001\nadmin: 127.0.0.1:2001\nupstream:\n  uri: mongodb://file/\nlog:\n  level: warn\n")
	o, err := parseFlags([]string{"-config", file, "-admin", "127.0.0.1:2003", "-log-level", "debug"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(o, env(map[string]string{
		"LOCKGATE_ADMIN":        "127.0.0.1:2002",
		"LOCKGATE_UPSTREAM_URI": "mongodb://env/",
		"LOCKGATE_LOG_LEVEL":    "error",
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"listen from file", cfg.Listen, "127.0.0.1:1001"},
		{"admin from flag over env", cfg.Admin, "127.0.0.1:2003"},
		{"upstream from env over file", cfg.Upstream.URI, "mongodb://env/"},
		{"log level from flag", string(cfg.Log.Level), "debug"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	// -config beats LOCKGATE_CONFIG.
	o, _ = parseFlags([]string{"-config", file}, env(map[string]string{EnvConfig: "/other.yaml"}), &bytes.Buffer{})
	if o.configPath != file {
		t.Errorf("configPath = %q, want the flag's %q", o.configPath, file)
	}
}

// TestReloadAppliesPolicyAndRefusesInvalid drives the run loop: SIGHUP
// applies a changed policy, an edit of the file is picked up without a
// signal, and an invalid file is refused while the gateway keeps running.
func TestReloadAppliesPolicyAndRefusesInvalid(t *testing.T) {
	// Beside the other run-loop tests: they wait on server selection
	// against the absent upstream (the lock store at start, the policy
	// check), bounded by the URI's serverSelectionTimeoutMS.
	t.Parallel()
	base := "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nshutdownTimeout: 2s\n" +
		"upstream:\n  uri: mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200\n  dialTimeout: 200ms\n"
	file := writeFile(t, base+"policy:\n  namespaces:\n    - match: shop.orders\n      mode: audit\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"-config", file}, env(nil), &stdout, &stderr, hup) }()
	testkit.Eventually(t, 10*time.Second, "the log line lockgate started", func() bool { return strings.Contains(stderr.String(), "lockgate started") })

	os.WriteFile(file, []byte(base+"policy:\n  namespaces:\n    - match: shop.orders\n      mode: enforce\n"), 0o600)
	hup <- os.Interrupt // any value: the channel stands for SIGHUP
	testkit.Eventually(t, 10*time.Second, "the log line policy reloaded", func() bool { return strings.Count(stderr.String(), "policy reloaded") >= 1 })

	// No signal: the file watcher notices the edit.
	os.WriteFile(file, []byte(base+"policy:\n  default: block\n"), 0o600)
	testkit.Eventually(t, 10*time.Second, "the log line reload refused", func() bool { return strings.Contains(stderr.String(), "reload refused") })
	if !strings.Contains(stderr.String(), `policy.default: must be one of off, audit, enforce, got \"block\"`) {
		t.Errorf("refusal does not name the key:\n%s", stderr.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit code %d after a refused reload\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestRunServesUntilCancelled starts the real binary's run loop against an
// upstream that is not there (the gateway starts anyway and reports not
// ready), then stops it as SIGTERM would.
func TestRunServesUntilCancelled(t *testing.T) {
	// Beside the other run-loop tests: they wait on server selection
	// against the absent upstream (the lock store at start, the policy
	// check), bounded by the URI's serverSelectionTimeoutMS.
	t.Parallel()
	file := writeFile(t, "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nshutdownTimeout: 2s\n"+
		"upstream:\n  uri: mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200\n  dialTimeout: 200ms\n")
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal, 1)
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-config", file, "-log-level", "debug"}, env(nil), &stdout, &stderr, hup)
	}()

	testkit.Eventually(t, 10*time.Second, "the log line lockgate started", func() bool { return strings.Contains(stderr.String(), "lockgate started") })
	hup <- os.Interrupt // any value: the channel stands for SIGHUP
	testkit.Eventually(t, 10*time.Second, "the log line reload requested", func() bool { return strings.Contains(stderr.String(), "reload requested") })
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit code %d\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if !strings.Contains(stderr.String(), "lockgate stopped") {
		t.Errorf("no clean stop logged:\n%s", stderr.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBufferedLogIsWrittenAtExit: with log.flushInterval set, the lines
// still in the buffer when lockgate stops (here its last, "lockgate
// stopped", an info line no warning follows) are written before run
// returns.
func TestBufferedLogIsWrittenAtExit(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nshutdownTimeout: 2s\n"+
		"upstream:\n  uri: mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200\n  dialTimeout: 200ms\n"+
		"log:\n  flushInterval: 10s\n")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stop as soon as it has started
	var stdout, stderr syncBuffer
	if code := run(ctx, []string{"-config", file}, env(nil), &stdout, &stderr, make(chan os.Signal, 1)); code != exitOK {
		t.Fatalf("exit code %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "lockgate stopped") {
		t.Fatalf("the buffered last line was not written at exit:\n%s", stderr.String())
	}
}
