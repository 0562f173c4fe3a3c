package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
)

// childEnv makes the test binary run the dev stack's Main instead of the
// tests (TestDevStackProcessSignals starts it so, as a real process).
const childEnv = "LOCKGATE_DEVSTACK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(Main(strings.Fields(os.Getenv(childEnv+"_ARGS")), os.Stdout, os.Stderr))
	}
	os.Exit(testkit.RunMain(m, nil))
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lockgate.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDevConfigDefaults(t *testing.T) {
	o, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, ignored, err := devConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(ignored) != 0 {
		t.Errorf("without -config nothing is ignored, got %q", ignored)
	}
	if cfg.Listen != "127.0.0.1:27018" || cfg.Admin != "127.0.0.1:9218" ||
		cfg.Log != (config.Log{Level: config.LogLevelInfo, Format: config.LogFormatConsole}) {
		t.Errorf("defaults: listen %q admin %q log %+v", cfg.Listen, cfg.Admin, cfg.Log)
	}
}

func TestDevConfigTakesOnlyLockstorePolicyLog(t *testing.T) {
	file := writeFile(t, `
listen: 127.0.0.1:1111
admin: 127.0.0.1:2222
upstream:
  uri: mongodb://production:27017/
lockstore:
  uri: mongodb://production-locks:27017/
  collection: mylocks
  defaultLeaseMS: 5000
policy:
  default: audit
  namespaces:
    - match: shop.orders
      mode: enforce
log:
  level: debug
  format: json
`)
	o, err := parseFlags([]string{"-config", file, "-admin", "127.0.0.1:3333"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, ignored, err := devConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	// Issue 26: the keys it does not use were ignored silently.
	want := []string{"listen (use -listen)", "admin (use -admin)", "upstream (the upstream is the embedded FerretDB (-data DIR keeps its data))", "lockstore.uri (lock records live in the embedded upstream)"}
	if strings.Join(ignored, "\n") != strings.Join(want, "\n") {
		t.Errorf("ignored keys:\n%s\nwant:\n%s", strings.Join(ignored, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []struct{ name, got, want string }{
		{"listen: flag default, not the file", cfg.Listen, "127.0.0.1:27018"},
		{"admin: the flag", cfg.Admin, "127.0.0.1:3333"},
		{"lockstore.uri: always the embedded upstream", cfg.Lockstore.URI, ""},
		{"lockstore.collection from file", cfg.Lockstore.Collection, "mylocks"},
		{"policy.default from file", string(cfg.Policy.Default), "audit"},
		{"log.level from file", string(cfg.Log.Level), "debug"},
		{"log.format from file", string(cfg.Log.Format), "json"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	if cfg.Lockstore.DefaultLeaseMS != 5000 || len(cfg.Policy.Namespaces) != 1 {
		t.Errorf("lockstore/policy not taken from the file: %+v %+v", cfg.Lockstore, cfg.Policy)
	}
	if strings.Contains(cfg.Upstream.URI, "production") {
		t.Errorf("upstream taken from the file: %q", cfg.Upstream.URI)
	}
}

func TestBadInputExits2(t *testing.T) {
	bad := writeFile(t, "policy:\n  namespaces:\n    - match: shop\n      mode: enforce\n")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", bad}, `policy.namespaces[0].match: must be "db.collection" or "db.*", got "shop"`},
		{[]string{"-listen", "nowhere"}, `listen: must be host:port`},
		{[]string{"-bogus"}, "flag provided but not defined"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Run(context.Background(), tt.args, &stdout, &stderr, nil); code != 2 {
			t.Errorf("%v: exit %d, want 2", tt.args, code)
		}
		if !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: stderr %q lacks %q", tt.args, stderr.String(), tt.want)
		}
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

var (
	connRE  = regexp.MustCompile(`connection string: (mongodb://\S+)`)
	adminRE = regexp.MustCompile(`admin: +(http://\S+)`)
)

func TestDevStackRunsAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-data", data}, &stdout, &stderr, nil)
	}()

	logOnFailure(t, &stdout, &stderr)
	var uri, adminURL string
	testkit.Eventually(t, 30*time.Second, "the connection string printed", func() bool {
		select {
		case code := <-done:
			t.Fatalf("devstack exited %d", code)
		default:
		}
		if m := connRE.FindStringSubmatch(stdout.String()); m != nil {
			uri = m[1]
			adminURL = adminRE.FindStringSubmatch(stdout.String())[1]
		}
		return uri != ""
	})

	mctx, mcancel := context.WithTimeout(ctx, 15*time.Second)
	defer mcancel()
	client, err := mongo.Connect(mctx, options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Database("dev").Collection("c").InsertOne(mctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatalf("insert through the printed connection string: %v", err)
	}
	client.Disconnect(mctx)

	resp, err := http.Get(adminURL + "healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("%shealthz = %d", adminURL, resp.StatusCode)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d\nstderr: %s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("devstack did not stop")
	}
	if entries, _ := os.ReadDir(data); len(entries) == 0 {
		t.Error("-data dir is empty: FerretDB did not use it")
	}
}

// startStack runs the dev stack with args until the test ends and returns
// its admin URL.
func startStack(t *testing.T, hup chan os.Signal, args ...string) (adminURL string, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	stderr = &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...), &stdout, stderr, hup)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("exit %d\nstderr: %s", code, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Error("devstack did not stop")
		}
	})
	logOnFailure(t, &stdout, stderr)
	testkit.Eventually(t, 30*time.Second, "the admin URL printed", func() bool {
		select {
		case code := <-done:
			done <- code // for the cleanup above
			t.Fatalf("devstack exited %d", code)
		default:
		}
		if m := adminRE.FindStringSubmatch(stdout.String()); m != nil {
			adminURL = m[1]
		}
		return adminURL != ""
	})
	return adminURL, stderr
}

// logOnFailure logs a dev stack's output at the end of a test that failed.
func logOnFailure(t *testing.T, stdout, stderr *syncBuffer) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stdout: %s\nstderr: %s", stdout.String(), stderr.String())
		}
	})
}

func httpBody(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// TestDevStackReloadsOnHangup: SIGHUP re-reads the -config file's policy
// (it used to kill the dev stack, leaving its temporary directory behind),
// and the file's adminAuth guards operator actions as in cmd/proxy (it used
// to be ignored).
func TestDevStackReloadsOnHangup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(strings.Repeat("t", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	policy := func(ns string) string {
		return "adminAuth:\n  tokenFile: " + token + "\npolicy:\n  namespaces:\n    - match: " + ns + "\n      mode: enforce\n"
	}
	file := filepath.Join(dir, "lockgate.yaml")
	if err := os.WriteFile(file, []byte(policy("shop.orders")), 0o600); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	adminURL, stderr := startStack(t, hup, "-config", file)

	if code, body := httpBody(t, "GET", adminURL+"policy"); code != 200 || !strings.Contains(body, "shop.orders") {
		t.Fatalf("GET /policy = %d %s", code, body)
	}
	if code, body := httpBody(t, "POST", adminURL+"locks/release"); code != http.StatusUnauthorized {
		t.Errorf("POST /locks/release without the token = %d %s, want 401 (adminAuth from the file)", code, body)
	}

	if err := os.WriteFile(file, []byte(policy("shop.invoices")), 0o600); err != nil {
		t.Fatal(err)
	}
	hup <- syscall.SIGHUP
	reloaded := func() bool {
		_, body := httpBody(t, "GET", adminURL+"policy")
		return strings.Contains(body, "shop.invoices") && !strings.Contains(body, "shop.orders")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stderr: %s", stderr.String())
		}
	})
	testkit.Eventually(t, 10*time.Second, "the policy reloaded after SIGHUP", reloaded)
}

// TestDevStackHangupWithoutConfig: with no file to re-read, SIGHUP is
// logged and ignored; the dev stack keeps running.
func TestDevStackHangupWithoutConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	hup := make(chan os.Signal, 1)
	adminURL, stderr := startStack(t, hup)
	hup <- syscall.SIGHUP
	testkit.Eventually(t, 10*time.Second, "the log line for SIGHUP without -config", func() bool {
		return strings.Contains(stderr.String(), "reload ignored")
	})
	if code, _ := httpBody(t, "GET", adminURL+"healthz"); code != 200 {
		t.Errorf("after SIGHUP /healthz = %d", code)
	}
}

func TestPrefixWriter(t *testing.T) {
	var b bytes.Buffer
	w := prefixWriter{prefix: []byte("ferret: "), w: &b}
	if n, err := w.Write([]byte("level=WARN msg=x\n")); err != nil || n != 17 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if b.String() != "ferret: level=WARN msg=x\n" {
		t.Errorf("got %q", b.String())
	}
}

// TestFerretLogLabelled: the embedded FerretDB's log lines say whose they
// are, and its warnings (a dump of every error reply it sends) stay out
// of the dev stack's log (issue 9: they looked like lockgate's errors).
func TestFerretLogLabelled(t *testing.T) {
	var b bytes.Buffer
	l := ferretLogger(&b)
	l.Warn("sent an error reply", "code", 59)
	l.Error("cannot open the database", "err", "disk full")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "embedded FerretDB (upstream): ") || !strings.Contains(lines[0], "cannot open the database") {
		t.Errorf("FerretDB's log:\n%s\nwant only the error, labelled as FerretDB's", b.String())
	}
}

var dataRE = regexp.MustCompile(`data in (\S+), temporary: removed on exit`)

// TestDevStackProcessSignals runs the dev stack as a process, as users
// run it, and sends it real signals: SIGHUP is logged and survived (it
// used to kill the dev stack silently and leave its temporary data
// directory behind), and SIGTERM stops it cleanly, the temporary
// directory removed.
func TestDevStackProcessSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childEnv+"_ARGS=-listen 127.0.0.1:0 -admin 127.0.0.1:0")
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()

	logOnFailure(t, &stdout, &stderr)
	// running fails the test if the dev stack has ended.
	running := func(after string) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the dev stack ended %s: %v", after, err)
		default:
		}
	}
	var adminURL, dataDir string
	testkit.Eventually(t, 60*time.Second, "the admin URL printed", func() bool {
		running("before printing its admin URL")
		if m := adminRE.FindStringSubmatch(stdout.String()); m != nil {
			adminURL = m[1]
			if d := dataRE.FindStringSubmatch(stdout.String()); d != nil {
				dataDir = d[1]
			}
		}
		return adminURL != ""
	})
	if dataDir == "" {
		t.Fatalf("no temporary data directory printed:\n%s", stdout.String())
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("the printed data directory: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the log line for SIGHUP", func() bool {
		running("on SIGHUP")
		return strings.Contains(stderr.String(), "reload ignored")
	})
	if code, _ := httpBody(t, "GET", adminURL+"healthz"); code != 200 {
		t.Errorf("after SIGHUP /healthz = %d", code)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0\nstderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the dev stack did not stop on SIGTERM\nstderr: %s", stderr.String())
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary data directory %s after exit: %v, want it removed", dataDir, err)
	}
}
