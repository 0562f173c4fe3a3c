package admin

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Check reports whether one dependency is usable. It must honour ctx: the
// readiness handler stops waiting when ctx is done and reports a timeout.
type Check func(ctx context.Context) error

// Options configure a Server.
type Options struct {
	// Registry is gathered by /metrics. Required.
	Registry *prometheus.Registry
	// Logger; nil discards.
	Logger *zap.Logger
	// CheckTimeout bounds all readiness checks of one /readyz request. A
	// kubelet probe times out after 1s by default, so the default is
	// shorter than that: a slow dependency reads as "not ready" with a
	// reason instead of as a failed probe without one.
	CheckTimeout time.Duration
	// ShutdownTimeout bounds how long Serve waits for in-flight requests
	// once its context is done. Default 2s.
	ShutdownTimeout time.Duration
}

const (
	defaultCheckTimeout    = 800 * time.Millisecond
	defaultShutdownTimeout = 2 * time.Second
)

// Server is the admin HTTP listener. AddCheck and Handle are safe to call
// at any time, including while Serve runs.
type Server struct {
	reg             *prometheus.Registry
	logger          *zap.Logger
	checkTimeout    time.Duration
	shutdownTimeout time.Duration
	mux             *http.ServeMux
	serving         atomic.Bool

	mu       sync.Mutex
	checks   []namedCheck
	patterns []string
	// ready is the evaluation of the checks in progress, nil when none:
	// callers that arrive meanwhile share it, so a burst of /readyz
	// probes and /metrics scrapes runs the checks (lock store and
	// upstream round trips) once, not once each.
	ready *readyRun
	// joined, when set (tests), is called by each caller that shares an
	// evaluation in progress.
	joined func()
}

type readyRun struct {
	done chan struct{}
	rd   Readiness
}

type namedCheck struct {
	name  string
	check Check
}

// New returns a Server with /metrics, /healthz and /readyz mounted.
func New(opts Options) (*Server, error) {
	if opts.Registry == nil {
		return nil, errors.New("admin: Options.Registry is required")
	}
	s := &Server{
		reg:             opts.Registry,
		logger:          opts.Logger,
		checkTimeout:    opts.CheckTimeout,
		shutdownTimeout: opts.ShutdownTimeout,
		mux:             http.NewServeMux(),
	}
	if s.logger == nil {
		s.logger = zap.NewNop()
	}
	if s.checkTimeout <= 0 {
		s.checkTimeout = defaultCheckTimeout
	}
	if s.shutdownTimeout <= 0 {
		s.shutdownTimeout = defaultShutdownTimeout
	}
	s.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{
		ErrorLog: zapErrorLog{s.logger},
		// One broken collector must not hide every other metric.
		ErrorHandling: promhttp.ContinueOnError,
	}))
	s.Handle("/healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Liveness says only that the process can answer HTTP. It must not
		// depend on the upstream: a restart does not fix an unreachable
		// database, and restarting every sidecar at once makes it worse.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	}))
	s.Handle("/readyz", http.HandlerFunc(s.serveReady))
	// The index lists what is mounted, so an operator who only knows the
	// port can find the rest. It is not listed itself.
	s.mux.Handle("/{$}", readOnly(JSON(func(*http.Request) (any, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return map[string]any{"endpoints": slices.Clone(s.patterns)}, nil
	})))
	return s, nil
}

// AddCheck adds a named readiness check. Names must be unique and
// non-empty; violating that is a programming error and panics, as
// http.ServeMux does for duplicate patterns.
func (s *Server) AddCheck(name string, check Check) {
	if name == "" || check == nil {
		panic("admin: AddCheck needs a name and a check")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.checks {
		if c.name == name {
			panic("admin: duplicate readiness check " + name)
		}
	}
	s.checks = append(s.checks, namedCheck{name, check})
}

// Handle mounts a read-only view. Only GET and HEAD reach h; other methods
// get 405, so a view cannot become a way to change state by accident.
// Patterns follow net/http.ServeMux; a duplicate panics.
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mux.Handle(pattern, readOnly(h))
	s.mu.Lock()
	s.patterns = append(s.patterns, pattern)
	s.mu.Unlock()
}

// Handler is the server's root handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve serves HTTP on ln until ctx is done, then shuts down gracefully
// within ShutdownTimeout and returns nil. It returns an error if serving
// fails for any other reason. ln is closed on return. Serve may be called
// once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if !s.serving.CompareAndSwap(false, true) {
		ln.Close()
		return errors.New("admin: Serve called twice")
	}
	srv := &http.Server{
		Handler: s.mux,
		// Slow-loris bounds: the admin port is often reachable from the
		// whole cluster network.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          zap.NewStdLog(s.logger),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.logger.Warn("admin shutdown timed out; closing remaining connections", zap.Error(err))
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

// CheckResult is one check's outcome in the /readyz body.
type CheckResult struct {
	Name            string  `json:"name"`
	OK              bool    `json:"ok"`
	Error           string  `json:"error,omitempty"`
	DurationSeconds float64 `json:"durationSeconds"`
}

// Readiness is the /readyz body.
type Readiness struct {
	// Status is "ready" or "not ready".
	Status string        `json:"status"`
	Checks []CheckResult `json:"checks"`
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	rd := s.Ready(r.Context())
	code := http.StatusOK
	if rd.Status != "ready" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

// Ready runs every check concurrently, each bounded by CheckTimeout, and
// reports them in the order they were added. Callers that arrive while an
// evaluation runs get its result instead of starting their own; the
// evaluation does not end with the caller that started it (its timeout
// bounds it), so one client going away does not fail the others.
func (s *Server) Ready(ctx context.Context) Readiness {
	s.mu.Lock()
	if run := s.ready; run != nil {
		joined := s.joined
		s.mu.Unlock()
		if joined != nil {
			joined()
		}
		<-run.done
		return run.rd
	}
	run := &readyRun{done: make(chan struct{})}
	s.ready = run
	checks := slices.Clone(s.checks)
	s.mu.Unlock()

	run.rd = s.evaluate(context.WithoutCancel(ctx), checks)
	s.mu.Lock()
	s.ready = nil
	s.mu.Unlock()
	close(run.done)
	return run.rd
}

func (s *Server) evaluate(ctx context.Context, checks []namedCheck) Readiness {
	ctx, cancel := context.WithTimeout(ctx, s.checkTimeout)
	defer cancel()
	res := make([]CheckResult, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() { res[i] = runCheck(ctx, c) })
	}
	wg.Wait()

	rd := Readiness{Status: "ready", Checks: res}
	for _, c := range res {
		if !c.OK {
			rd.Status = "not ready"
		}
	}
	return rd
}

func runCheck(ctx context.Context, c namedCheck) CheckResult {
	start := time.Now()
	// Buffered so a check that ignores ctx can still finish and exit after
	// we stopped waiting for it.
	done := make(chan error, 1)
	go func() { done <- c.check(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = fmt.Errorf("no answer within the readiness timeout: %w", ctx.Err())
	}
	cr := CheckResult{Name: c.name, OK: err == nil, DurationSeconds: time.Since(start).Seconds()}
	if err != nil {
		cr.Error = err.Error()
	}
	return cr
}

// JSON adapts a function returning a value into a read-only JSON view: the
// value is written with status 200, an error as {"error": "..."} with 500.
func JSON(fn func(r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := fn(r)
		if err != nil {
			code := http.StatusInternalServerError
			var bad badRequest
			if errors.As(err, &bad) {
				code = http.StatusBadRequest
			}
			writeJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
}

// BadRequest marks an error of a JSON view as the caller's (a malformed
// query parameter): the view answers 400 with the message, not 500.
func BadRequest(err error) error { return badRequest{err} }

type badRequest struct{ error }

func (b badRequest) Unwrap() error { return b.error }

func writeJSON(w http.ResponseWriter, code int, v any) {
	// Not HTML-escaped: these bodies are read by people and scripts, never
	// inlined in a page, and "<_id as extended JSON>" should read as such,
	// not as "\u003c_id as extended JSON\u003e".
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		code = http.StatusInternalServerError
		body.Reset()
		json.NewEncoder(&body).Encode(map[string]string{"error": err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(body.Bytes())
}

// HandleAction mounts an operator action that changes state. Only POST
// reaches h, and only with "Authorization: Bearer <token>"; an empty token
// disables the action (403), so that a deployment without a configured
// credential has no way to change state over HTTP.
func (s *Server) HandleAction(pattern, token string, h http.Handler) {
	s.mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "operator action: POST only", http.StatusMethodNotAllowed)
			return
		}
		if token == "" {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "operator actions are disabled: configure adminAuth.tokenFile or the LOCKGATE_ADMIN_TOKEN_FILE environment variable"})
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="lockgate-admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong bearer token"})
			return
		}
		h.ServeHTTP(w, r)
	}))
	s.mu.Lock()
	s.patterns = append(s.patterns, "POST "+pattern)
	s.mu.Unlock()
}

// WriteJSON writes v as an indented JSON response with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) { writeJSON(w, code, v) }

func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only endpoint", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// zapErrorLog adapts zap to promhttp's Println-style logger.
type zapErrorLog struct{ l *zap.Logger }

func (z zapErrorLog) Println(v ...any) {
	z.l.Error("metrics gathering failed", zap.String("error", fmt.Sprint(v...)))
}
