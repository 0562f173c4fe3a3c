package gateway

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// TestDecisionSinkWritesTheLoggersLines: the JSON logger hands the guard
// its output (so production writes decision lines without zap), and the
// line the guard writes there is the line it writes through the logger
// itself, but for its time and took; a logger with fields of its own, or
// the console format, hands nothing, and a level above info silences the
// sink too.
func TestDecisionSinkWritesTheLoggersLines(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.*", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	// An update without a session: refused, with a decision line.
	body := bsoncore.NewDocumentBuilder().AppendString("update", "c\"\n").AppendString("$db", "db").Build()
	stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	line := func(level config.LogLevel, sink bool) (string, *guard.LineSink) {
		var buf bytes.Buffer
		l, err := NewLoggerTo(config.Log{Level: level, Format: config.LogFormatJSON}, &buf)
		if err != nil {
			t.Fatal(err)
		}
		opts := guard.Options{Store: memstore.New(memstore.Config{}), Logger: l}
		var written int
		if sink {
			s := decisionSink(l)
			if s == nil {
				t.Fatal("the JSON logger hands the guard no sink")
			}
			counted := *s // the same output, counted: the line must go there
			counted.Out = zapcore.AddSync(writerFunc(func(p []byte) (int, error) { written++; return s.Out.Write(p) }))
			opts.DecisionSink = &counted
		}
		g := guard.New(opts)
		g.SetPolicy(pol)
		d := g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "[::1]:1"}})
		if d.Action != proxy.Reply {
			t.Fatalf("the write was not refused: %+v", d)
		}
		if sink && level == config.LogLevelInfo && written != 1 {
			t.Fatalf("%d lines went through the sink", written)
		}
		return buf.String(), opts.DecisionSink
	}
	viaZap, _ := line(config.LogLevelInfo, false)
	viaSink, _ := line(config.LogLevelInfo, true)
	varying := regexp.MustCompile(`"(ts|took)":"[^"]*"`)
	if z, s := varying.ReplaceAllString(viaZap, "_"), varying.ReplaceAllString(viaSink, "_"); z != s || z == "" {
		t.Fatalf("through zap:\n%s\nthrough the sink:\n%s", viaZap, viaSink)
	}
	if quiet, _ := line(config.LogLevelWarn, true); quiet != "" {
		t.Fatalf("a warn logger's sink wrote %q", quiet)
	}
	l, err := NewLoggerTo(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if decisionSink(l.With(zap.String("instance", "a"))) != nil {
		t.Fatal("a logger with fields of its own hands a sink whose lines would lack them")
	}
	if decisionSink(l.Named("x").WithOptions(zap.WithCaller(false))) == nil {
		t.Fatal("a named logger lost its sink")
	}
	c, err := NewLoggerTo(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatConsole}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if decisionSink(c) != nil {
		t.Fatal("the console logger hands a sink for JSON lines")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// syncBuffer is a writer the test reads while a logger writes to it.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBufferedLogKeepsLinesUntilAWarning: with log.flushInterval set, info
// lines and decision lines wait in the buffer (many lines, one write), a
// warning writes them out before it returns, so that what led to a failure
// is out even if the process dies next, and closing the log writes the
// rest.
func TestBufferedLogKeepsLinesUntilAWarning(t *testing.T) {
	var out syncBuffer
	l, closeLog, err := OpenLogger(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON,
		FlushInterval: config.Duration(config.MaxLogFlushInterval)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	sink := decisionSink(l)
	if sink == nil {
		t.Fatal("the buffered JSON logger hands the guard no sink")
	}
	l.Info("first")
	if _, err := sink.Out.Write([]byte(`{"msg":"decision"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	l.Info("second")
	if s := out.String(); s != "" {
		t.Fatalf("lines written before the interval, a warning or the close: %q", s)
	}
	l.Warn("trouble")
	s := out.String()
	for _, want := range []string{`"msg":"first"`, `{"msg":"decision"}`, `"msg":"second"`, `"msg":"trouble"`} {
		if !strings.Contains(s, want) {
			t.Fatalf("after the warning returned, %s is not written: %q", want, s)
		}
	}
	if out.writes != 1 {
		t.Errorf("four lines in %d writes, want 1", out.writes)
	}
	l.Info("last")
	closeLog()
	if !strings.Contains(out.String(), `"msg":"last"`) {
		t.Fatalf("closing the log did not write its last line: %q", out.String())
	}
}

// TestBufferedLogWritesWithinItsInterval: a buffered line is written
// without any warning or close once the interval has passed.
func TestBufferedLogWritesWithinItsInterval(t *testing.T) {
	var out syncBuffer
	l, closeLog, err := OpenLogger(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON,
		FlushInterval: config.Duration(20 * time.Millisecond)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	l.Info("quiet")
	testkit.Eventually(t, 10*time.Second, "the buffered line is written", func() bool {
		return strings.Contains(out.String(), `"msg":"quiet"`)
	})
}

// TestUnbufferedLogWritesEachLine: the default writes every line at once,
// and NewLoggerTo, which has no close, refuses a flush interval.
func TestUnbufferedLogWritesEachLine(t *testing.T) {
	var out syncBuffer
	l, closeLog, err := OpenLogger(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON}, &out)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	l.Info("now")
	if !strings.Contains(out.String(), `"msg":"now"`) {
		t.Fatalf("an unbuffered line waited: %q", out.String())
	}
	if _, err := NewLoggerTo(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON,
		FlushInterval: config.Duration(time.Second)}, &out); err == nil || !strings.Contains(err.Error(), "log.flushInterval") {
		t.Fatalf("NewLoggerTo with a flush interval: %v, want an error naming log.flushInterval", err)
	}
	for _, d := range []time.Duration{-time.Second, config.MaxLogFlushInterval + time.Second} {
		if _, _, err := OpenLogger(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON,
			FlushInterval: config.Duration(d)}, &out); err == nil {
			t.Errorf("OpenLogger with flushInterval %v: no error", d)
		}
	}
}

// BenchmarkDecisionLineOutput is what writing one decision line (about
// 430 bytes, one Write, as guard's line writer does) costs on the sinks a
// production lockgate writes to: a file, a pipe to a log collector, each
// unbuffered and with log.flushInterval, against the discard sink the
// benchmarks of the enforced write use.
func BenchmarkDecisionLineOutput(b *testing.B) {
	line := append([]byte(`{"level":"info","ts":"2026-11-27T18:00:00.123456789Z","msg":"decision",`), bytes.Repeat([]byte("x"), 350)...)
	line = append(line, "}\n"...)
	file := func(b *testing.B) io.Writer {
		f, err := os.Create(filepath.Join(b.TempDir(), "log"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		return f
	}
	pipe := func(b *testing.B) io.Writer {
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { io.Copy(io.Discard, r); close(done) }()
		b.Cleanup(func() { w.Close(); <-done; r.Close() })
		return w
	}
	for _, c := range []struct {
		name  string
		out   func(*testing.B) io.Writer
		flush time.Duration
	}{
		{"discard", func(*testing.B) io.Writer { return io.Discard }, 0},
		{"file", file, 0},
		{"pipe", pipe, 0},
		{"file-buffered", file, 100 * time.Millisecond},
		{"pipe-buffered", pipe, 100 * time.Millisecond},
	} {
		b.Run(c.name, func(b *testing.B) {
			l, closeLog, err := OpenLogger(config.Log{Level: config.LogLevelInfo, Format: config.LogFormatJSON,
				FlushInterval: config.Duration(c.flush)}, c.out(b))
			if err != nil {
				b.Fatal(err)
			}
			sink := decisionSink(l).Out
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := sink.Write(line); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			closeLog()
		})
	}
}
