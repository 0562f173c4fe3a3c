package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	mongoopts "go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

var update = flag.Bool("update", false, "rewrite docs/CONFIGURATION.md's generated tables")

const configDoc = "../../docs/CONFIGURATION.md"

// configTables renders the flags of flagSet and the variables of
// config.EnvVars as the Markdown tables of docs/CONFIGURATION.md.
func configTables() (flags, env string) {
	var b strings.Builder
	b.WriteString("| flag | default | what |\n|---|---|---|\n")
	var o options
	flagSet(&o, func(string) string { return "" }).VisitAll(func(f *flag.Flag) {
		def := "(none)"
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		fmt.Fprintf(&b, "| `-%s` | %s | %s |\n", f.Name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
	})
	flags = b.String()
	b.Reset()
	b.WriteString("| variable | key | type | default |\n|---|---|---|---|\n")
	for _, v := range config.EnvVars() {
		name := "`" + v.Name + "`"
		if v.Alias != "" {
			name += " (or `" + v.Alias + "`)"
		}
		def := strings.ReplaceAll(v.Default, "\n", " ")
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | `%s` |\n", name, v.Key, v.Type, def)
	}
	fmt.Fprintf(&b, "| `%s` | (the file) | string | `\"\"` |\n", EnvConfig)
	return flags, b.String()
}

func replaceBetween(doc, name, body string) (string, error) {
	begin, end := "<!-- BEGIN GENERATED "+name+" -->\n", "<!-- END GENERATED "+name+" -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("markers for %s not found", name)
	}
	return doc[:i+len(begin)] + body + doc[j:], nil
}

// The tables of flags and environment variables in docs/CONFIGURATION.md
// are generated from the code; a flag or key added without regenerating
// fails here. Regenerate: go test ./cmd/proxy -run TestConfigurationDoc -update
func TestConfigurationDocIsGenerated(t *testing.T) {
	b, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	flags, env := configTables()
	doc, err := replaceBetween(string(b), "flags", flags)
	if err == nil {
		doc, err = replaceBetween(doc, "env", env)
	}
	if err != nil {
		t.Fatal(err)
	}
	if doc == string(b) {
		return
	}
	if *update {
		if err := os.WriteFile(configDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is out of date: run go test ./cmd/proxy -run TestConfigurationDoc -update", configDoc)
}

func TestCheckMode(t *testing.T) {
	file := writeFile(t, "upstream:\n  uri: mongodb://127.0.0.1:1/\n  dialTimeout: 200ms\n")
	code, out, _ := runOnce(t, []string{"-config", file, "-check"}, env(nil))
	if code != exitFailure || !strings.Contains(out, "ok      configuration") || !strings.Contains(out, "FAILED  upstream") || !strings.Contains(out, "FAILED  lockstore") {
		t.Errorf("unreachable upstream: exit %d\n%s", code, out)
	}
	bad := writeFile(t, "shutdownDrainDelay: -1s\n")
	if code, _, errOut := runOnce(t, []string{"-config", bad, "-check"}, env(nil)); code != exitUsage || !strings.Contains(errOut, "shutdownDrainDelay") {
		t.Errorf("invalid config: exit %d %s", code, errOut)
	}
	if code, _, errOut := runOnce(t, []string{"-check"}, env(map[string]string{"LOCKGATE_LIMITS_MAX_LOCK_IDS": "many"})); code != exitUsage || !strings.Contains(errOut, "LOCKGATE_LIMITS_MAX_LOCK_IDS") {
		t.Errorf("invalid environment: exit %d %s", code, errOut)
	}
}

// After SIGTERM with shutdownDrainDelay, /readyz reports draining while
// the proxy still accepts clients, and the shutdown starts only when the
// delay's timer fires. /metrics carries the version from the first
// scrape on: the test scrapes while "lockgate started" is being written,
// before the run loop goes on (a CI run once scraped between the start
// and a later registration of lockgate_build_info). The timer is the
// test's: the checks run inside the drain however slow the machine, and
// the shutdown provably waits for the timer, not for the test's pace.
func TestDrainDelayAndVersionMetric(t *testing.T) {
	// Beside the other run-loop tests: they wait on server selection
	// against the absent upstream (the lock store at start, the policy
	// check), bounded by the URI's serverSelectionTimeoutMS.
	t.Parallel()
	const delay = 1500 * time.Millisecond
	file := writeFile(t, "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nshutdownTimeout: 2s\nshutdownDrainDelay: 1500ms\n"+
		"upstream:\n  uri: mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200\n  dialTimeout: 200ms\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout syncBuffer
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	addrs := regexp.MustCompile(`"listen":"([^"]+)","admin":"([^"]+)"`)
	stderr := &scrapeAtStart{client: client, addrs: addrs, done: make(chan struct{})}
	done := make(chan int, 1)
	asked := make(chan time.Duration, 1)
	fire := make(chan time.Time)
	drainTimer := func(d time.Duration) <-chan time.Time { asked <- d; return fire }
	go func() { done <- runWith(ctx, []string{"-config", file}, env(nil), &stdout, stderr, nil, drainTimer) }()
	testkit.Eventually(t, 10*time.Second, "the log line lockgate started", func() bool { return strings.Contains(stderr.String(), "lockgate started") })
	m := addrs.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no addresses in the start line:\n%s", stderr.String())
	}
	listen, adminAddr := m[1], m[2]
	if first := stderr.firstScrape(t); !strings.Contains(first, fmt.Sprintf(`version=%q} 1`, versionString())) || !strings.Contains(first, "lockgate_build_info{") {
		t.Errorf("the scrape made as lockgate started has no lockgate_build_info with version %q:\n%s", versionString(), first)
	}
	get := func(path string) (int, string) {
		resp, err := client.Get("http://" + adminAddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if _, body := get("/metrics"); !strings.Contains(body, fmt.Sprintf(`version=%q} 1`, versionString())) || !strings.Contains(body, "lockgate_build_info{") {
		t.Errorf("/metrics has no lockgate_build_info with version %q", versionString())
	}
	if _, body := get("/readyz"); strings.Contains(body, "draining") {
		t.Fatalf("draining before any signal: %s", body)
	}
	cancel()
	select {
	case d := <-asked:
		if d != delay {
			t.Errorf("the drain waits %v, want shutdownDrainDelay %v", d, delay)
		}
	case code := <-done:
		t.Fatalf("run returned %d without waiting for the drain delay\n%s", code, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("no drain started within 10s of the signal")
	}
	testkit.Eventually(t, 10*time.Second, "/readyz to say draining", func() bool { _, body := get("/readyz"); return strings.Contains(body, `"draining"`) })
	c, err := net.DialTimeout("tcp", listen, 10*time.Second)
	if err != nil {
		t.Fatalf("the proxy stopped accepting during the drain: %v", err)
	}
	c.Close()
	select {
	case code := <-done:
		t.Fatalf("run returned %d before the drain delay's timer fired\n%s", code, stderr.String())
	default:
	}
	fire <- time.Now()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after the drain")
	}
	if !bytes.Contains([]byte(stderr.String()), []byte("draining before shutdown")) {
		t.Error("the drain was not logged")
	}
}

// TestCheckShowsPolicyWarnings: -check printed "ok configuration" for a
// rule misspelt next to the real one (issue 26). It now prints the
// warning with the close name, passes without -strict (a collection may
// be created later) and fails with it (CI before a policy ships).
func TestCheckShowsPolicyWarnings(t *testing.T) {
	up, err := embedded.Start(embedded.Options{Addr: "127.0.0.1:0", Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, mongoopts.Client().ApplyURI(up.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	if _, err := c.Database("shop").Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, "upstream:\n  uri: "+up.URI()+"\npolicy:\n  namespaces:\n    - match: shop.orders\n      mode: enforce\n    - match: shop.ordres\n      mode: enforce\n")
	// runOnce's context is cancelled (it stops a serving run at once);
	// -check needs a live one to reach the upstream.
	check := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, env(nil), &stdout, &stderr, nil)
		return code, stdout.String() + stderr.String()
	}
	code, out := check("-config", file, "-check")
	warn := `warning policy: rule "shop.ordres" matches no existing namespace: collection shop.ordres does not exist (yet); did you mean "shop.orders"?`
	if code != exitOK || !strings.Contains(out, "ok      policy: 2 rules, 1 warnings") || !strings.Contains(out, warn) {
		t.Errorf("-check: exit %d, want 0 with the warning\n%s", code, out)
	}
	code, out = check("-config", file, "-check", "-strict")
	if code != exitFailure || !strings.Contains(out, "FAILED  policy: 2 rules, 1 warnings (-strict)") || !strings.Contains(out, warn) {
		t.Errorf("-check -strict: exit %d, want 1 with the warning\n%s", code, out)
	}
	if code, _, errOut := runOnce(t, []string{"-config", file, "-strict"}, env(nil)); code != exitUsage || !strings.Contains(errOut, "-strict applies to -check only") {
		t.Errorf("-strict alone: exit %d %s", code, errOut)
	}
}

// scrapeAtStart is a log output that, when the line "lockgate started"
// is written, scrapes /metrics at the line's admin address before the
// write returns: the run loop waits on it, so the scrape sees what was
// registered by the time lockgate said it started, however fast a later
// step would have been.
type scrapeAtStart struct {
	syncBuffer
	client  *http.Client
	addrs   *regexp.Regexp
	scraped sync.Once
	done    chan struct{} // closed once body is set
	body    string
}

func (s *scrapeAtStart) Write(p []byte) (int, error) {
	n, err := s.syncBuffer.Write(p)
	if bytes.Contains(p, []byte("lockgate started")) {
		s.scraped.Do(func() {
			defer close(s.done)
			m := s.addrs.FindSubmatch(p)
			if m == nil {
				s.body = "no admin address in the start line"
				return
			}
			resp, err := s.client.Get("http://" + string(m[2]) + "/metrics")
			if err != nil {
				s.body = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			s.body = string(b)
		})
	}
	return n, err
}

// firstScrape is the scrape made as lockgate started.
func (s *scrapeAtStart) firstScrape(t *testing.T) string {
	select {
	case <-s.done:
		return s.body
	case <-time.After(20 * time.Second):
		t.Fatal("no scrape was made as lockgate started")
		return ""
	}
}
