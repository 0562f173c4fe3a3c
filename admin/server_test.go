package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

func newServer(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func get(t *testing.T, h http.Handler, method, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code, rec.Header(), rec.Body.String()
}

func TestNewNeedsRegistry(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without a registry succeeded")
	}
}

func TestHealthz(t *testing.T) {
	s := newServer(t, Options{})
	// Liveness must not depend on readiness checks.
	s.AddCheck("down", func(context.Context) error { return errors.New("down") })
	code, _, body := get(t, s.Handler(), "GET", "/healthz")
	if code != 200 || body != "ok\n" {
		t.Errorf("GET /healthz = %d %q", code, body)
	}
}

func TestMetricsUsesInjectedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "lockgate_test_things_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	s := newServer(t, Options{Registry: reg})
	code, _, body := get(t, s.Handler(), "GET", "/metrics")
	if code != 200 || !strings.Contains(body, "lockgate_test_things_total 3") {
		t.Errorf("GET /metrics = %d\n%s", code, body)
	}
	// Nothing from the global registry leaks in.
	if strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics serves the default registry:\n%s", body)
	}
}

func TestReadyz(t *testing.T) {
	tests := []struct {
		name     string
		checks   map[string]Check
		order    []string
		wantCode int
		want     Readiness
	}{
		{"no checks", nil, nil, 200, Readiness{Status: "ready", Checks: []CheckResult{}}},
		{"all ok", map[string]Check{
			"upstream":  func(context.Context) error { return nil },
			"lockstore": func(context.Context) error { return nil },
		}, []string{"upstream", "lockstore"}, 200, Readiness{Status: "ready", Checks: []CheckResult{
			{Name: "upstream", OK: true}, {Name: "lockstore", OK: true},
		}}},
		{"one failing", map[string]Check{
			"upstream":  func(context.Context) error { return nil },
			"lockstore": func(context.Context) error { return errors.New("connection refused") },
		}, []string{"upstream", "lockstore"}, 503, Readiness{Status: "not ready", Checks: []CheckResult{
			{Name: "upstream", OK: true}, {Name: "lockstore", OK: false, Error: "connection refused"},
		}}},
		{"one hanging past the timeout", map[string]Check{
			"upstream": func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		}, []string{"upstream"}, 503, Readiness{Status: "not ready", Checks: []CheckResult{
			{Name: "upstream", OK: false, Error: "no answer within the readiness timeout: context deadline exceeded"},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, Options{CheckTimeout: 50 * time.Millisecond})
			for _, name := range tt.order {
				s.AddCheck(name, tt.checks[name])
			}
			code, hdr, body := get(t, s.Handler(), "GET", "/readyz")
			if code != tt.wantCode {
				t.Errorf("code = %d, want %d", code, tt.wantCode)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var got Readiness
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			for i := range got.Checks {
				got.Checks[i].DurationSeconds = 0
			}
			if got.Status != tt.want.Status || len(got.Checks) != len(tt.want.Checks) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got.Checks {
				if got.Checks[i] != tt.want.Checks[i] {
					t.Errorf("check %d = %+v, want %+v", i, got.Checks[i], tt.want.Checks[i])
				}
			}
		})
	}
}

// A check that ignores its context must not hold /readyz past the timeout.
func TestReadyzBoundedWhenCheckIgnoresContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := newServer(t, Options{CheckTimeout: 30 * time.Millisecond})
	s.AddCheck("stuck", func(context.Context) error { <-release; return nil })
	start := time.Now()
	code, _, _ := get(t, s.Handler(), "GET", "/readyz")
	if code != 503 {
		t.Errorf("code = %d", code)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("/readyz took %v", d)
	}
}

// TestReadyChecksAreShared: probes and scrapes that arrive while the
// checks run share that run; without it every caller runs its own lock
// store and upstream round trips, and a burst of them multiplies the load
// on what is already slow.
func TestReadyChecksAreShared(t *testing.T) {
	s := newServer(t, Options{CheckTimeout: 10 * time.Second})
	const followers = 8
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	s.AddCheck("slow", func(context.Context) error {
		if runs.Add(1) == 1 {
			close(entered)
		}
		<-release
		return errors.New("still slow")
	})
	var waiting sync.WaitGroup
	waiting.Add(followers)
	s.joined = waiting.Done

	results := make(chan Readiness, followers+1)
	go func() { results <- s.Ready(context.Background()) }()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a caller that has gone away still gets the shared answer
	for range followers {
		go func() { results <- s.Ready(ctx) }()
	}
	joinedAll := make(chan struct{})
	go func() { waiting.Wait(); close(joinedAll) }()
	select {
	case <-joinedAll: // every follower shares the run in progress
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatalf("followers did not join the run in progress; the check ran %d times", runs.Load())
	}
	close(release)
	for range followers + 1 {
		rd := <-results
		if rd.Status != "not ready" || len(rd.Checks) != 1 || rd.Checks[0].Error != "still slow" {
			t.Errorf("result %+v, want the shared run's", rd)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the check ran %d times for %d concurrent callers, want once", n, followers+1)
	}
	// Once the run is over, the next caller runs the checks again.
	s.Ready(context.Background())
	if n := runs.Load(); n != 2 {
		t.Errorf("the check ran %d times after a later call, want 2", n)
	}
}

func TestAddCheckMisuse(t *testing.T) {
	s := newServer(t, Options{})
	s.AddCheck("a", func(context.Context) error { return nil })
	for name, f := range map[string]func(){
		"duplicate": func() { s.AddCheck("a", func(context.Context) error { return nil }) },
		"empty":     func() { s.AddCheck("", func(context.Context) error { return nil }) },
		"nil":       func() { s.AddCheck("b", nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: AddCheck did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestHandleIsReadOnly(t *testing.T) {
	s := newServer(t, Options{})
	called := 0
	s.Handle("/policy", JSON(func(*http.Request) (any, error) {
		called++
		return map[string]string{"default": "off"}, nil
	}))
	s.Handle("/broken", JSON(func(*http.Request) (any, error) { return nil, errors.New("lockstore down") }))

	code, _, body := get(t, s.Handler(), "GET", "/policy")
	if code != 200 || strings.TrimSpace(body) != "{\n  \"default\": \"off\"\n}" {
		t.Errorf("GET /policy = %d %q", code, body)
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		code, hdr, _ := get(t, s.Handler(), m, "/policy")
		if code != http.StatusMethodNotAllowed || hdr.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /policy = %d, Allow %q", m, code, hdr.Get("Allow"))
		}
	}
	if called != 1 {
		t.Errorf("view called %d times, want 1 (only for GET)", called)
	}
	code, _, body = get(t, s.Handler(), "GET", "/broken")
	if code != 500 || !strings.Contains(body, `"error": "lockstore down"`) {
		t.Errorf("GET /broken = %d %q", code, body)
	}
	code, _, body = get(t, s.Handler(), "GET", "/")
	if code != 200 || !strings.Contains(body, `"/policy"`) || !strings.Contains(body, `"/readyz"`) {
		t.Errorf("GET / = %d %q", code, body)
	}
	if code, _, _ := get(t, s.Handler(), "GET", "/nope"); code != 404 {
		t.Errorf("GET /nope = %d", code)
	}
}

func TestServeAndGracefulShutdown(t *testing.T) {
	s := newServer(t, Options{ShutdownTimeout: time.Second})
	inView := make(chan struct{})
	finish := make(chan struct{})
	s.Handle("/slow", JSON(func(*http.Request) (any, error) {
		close(inView)
		<-finish
		return "done", nil
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()

	base := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz = %d", resp.StatusCode)
	}

	// An in-flight request finishes even though shutdown began meanwhile.
	slow := make(chan string, 1)
	go func() {
		resp, err := client.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-inView
	cancel()
	// Shutdown has begun once the listener refuses new connections.
	testkit.Eventually(t, 5*time.Second, "the listener to close", func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(finish)
	if got := <-slow; strings.TrimSpace(got) != `"done"` {
		t.Errorf("in-flight request got %q", got)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := client.Get(base + "/healthz"); err == nil {
		t.Error("listener still accepts after shutdown")
	}
	if err := s.Serve(context.Background(), ln); err == nil {
		t.Error("second Serve succeeded")
	}
}

func TestServeReturnsListenerError(t *testing.T) {
	s := newServer(t, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := s.Serve(context.Background(), ln); err == nil {
		t.Fatal("Serve on a closed listener returned nil")
	}
}

// TestActionDisabledNamesTheVariable: the refusal of a disabled action
// tells the operator the exact config key and environment variable that
// enable it (it used to name a variable that does not exist).
func TestActionDisabledNamesTheVariable(t *testing.T) {
	s := newServer(t, Options{})
	s.HandleAction("/act", "", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a disabled action ran") }))
	code, _, body := get(t, s.Handler(), "POST", "/act")
	if code != http.StatusForbidden {
		t.Fatalf("POST /act = %d, want 403", code)
	}
	for _, want := range []string{"adminAuth.tokenFile", "LOCKGATE_ADMIN_TOKEN_FILE"} {
		if !strings.Contains(body, want) {
			t.Errorf("403 body %q does not name %s", body, want)
		}
	}
}

// TestJSONBadRequest: a view that blames the request answers 400 with its
// message; any other error stays a 500.
func TestJSONBadRequest(t *testing.T) {
	s := newServer(t, Options{})
	s.Handle("/bad", JSON(func(*http.Request) (any, error) { return nil, BadRequest(errors.New("limit=\"x\": nope")) }))
	s.Handle("/broken", JSON(func(*http.Request) (any, error) { return nil, errors.New("down") }))
	if code, _, body := get(t, s.Handler(), "GET", "/bad"); code != http.StatusBadRequest || !strings.Contains(body, "nope") {
		t.Errorf("GET /bad = %d %q, want 400 with the message", code, body)
	}
	if code, _, _ := get(t, s.Handler(), "GET", "/broken"); code != http.StatusInternalServerError {
		t.Errorf("GET /broken = %d, want 500", code)
	}
}

func TestReadinessCollector(t *testing.T) {
	s := newServer(t, Options{CheckTimeout: 50 * time.Millisecond})
	s.AddCheck("fine", func(context.Context) error { return nil })
	s.AddCheck("broken", func(context.Context) error { return errors.New("down") })
	reg := prometheus.NewRegistry()
	reg.MustRegister(ReadinessCollector(s))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if len(got) != 2 || got["fine"] != 1 || got["broken"] != 0 {
		t.Errorf("lockgate_ready_check = %v", got)
	}
}

// TestJSONIsNotHTMLEscaped: error bodies read "\u003c_id as extended
// JSON\u003e" where the text says "<_id as extended JSON>" (issue 26):
// encoding/json escapes for HTML by default, and these bodies are never
// put in a page.
func TestJSONIsNotHTMLEscaped(t *testing.T) {
	s := newServer(t, Options{})
	s.Handle("/bad", JSON(func(*http.Request) (any, error) {
		return nil, BadRequest(errors.New(`want {"id": <_id as extended JSON>} & a reason`))
	}))
	_, _, body := get(t, s.Handler(), "GET", "/bad")
	if !strings.Contains(body, `want {\"id\": <_id as extended JSON>} & a reason`) || strings.Contains(body, `\u003c`) || strings.Contains(body, `\u0026`) {
		t.Errorf("GET /bad = %q, want < > & as they are", body)
	}
}
