package gateway

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
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
