package devstack

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/goleak"

	"github.com/lockgate/lockgate/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	cfg, err := devConfig(o)
	if err != nil {
		t.Fatal(err)
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
	cfg, err := devConfig(o)
	if err != nil {
		t.Fatal(err)
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
		if code := Run(context.Background(), tt.args, &stdout, &stderr); code != 2 {
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
		done <- Run(ctx, []string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-data", data}, &stdout, &stderr)
	}()

	var uri, adminURL string
	deadline := time.Now().Add(30 * time.Second)
	for uri == "" {
		if m := connRE.FindStringSubmatch(stdout.String()); m != nil {
			uri = m[1]
			adminURL = adminRE.FindStringSubmatch(stdout.String())[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("devstack exited %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection string printed\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
		}
	}

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
