package gateway

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
)

// NewLogger builds the process logger on stderr, leaving stdout to what a
// binary prints on purpose (the dev stack's connection string).
func NewLogger(c config.Log) (*zap.Logger, error) { return NewLoggerTo(c, os.Stderr) }

// NewLoggerTo builds a logger writing to w: JSON lines for production log
// collectors, or zap's human-readable console encoding for development.
// Writes to w are serialized.
//
// Stack traces are kept for DPanic and above: lockgate's errors are
// operational (a refused reload, an unreachable upstream), and a stack
// under each would bury the reason.
//
// There is deliberately no sampling: it would silently drop repeated lines,
// and the audit trail of policy decisions must keep every one of them.
func NewLoggerTo(c config.Log, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(string(c.Level))
	if err != nil || !c.Level.Valid() {
		return nil, fmt.Errorf("log.level: must be one of debug, info, warn, error, got %q", c.Level)
	}
	var enc zapcore.Encoder
	switch c.Format {
	case config.LogFormatJSON:
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		// "15s" rather than 15: a bare number in a log line leaves the
		// reader guessing the unit.
		ec.EncodeDuration = zapcore.StringDurationEncoder
		enc = zapcore.NewJSONEncoder(ec)
	case config.LogFormatConsole:
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000")
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("log.format: must be one of json, console, got %q", c.Format)
	}
	ws := zapcore.Lock(zapcore.AddSync(w))
	var core zapcore.Core = zapcore.NewCore(enc, ws, lvl)
	if c.Format == config.LogFormatJSON {
		core = sinkCore{Core: core, sink: &guard.LineSink{Out: ws, Level: lvl, ErrorOutput: ws}}
	}
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.DPanicLevel), zap.ErrorOutput(ws)), nil
}

// sinkCore is the JSON logger's core, carrying its output for the guard's
// decision lines, which the guard writes itself in this very layout
// (guard.LineSink). A logger given fields of its own (With) loses it:
// its lines would have to carry them.
type sinkCore struct {
	zapcore.Core
	sink *guard.LineSink
}

// decisionSink is the guard's sink for the decision lines of l, nil
// unless l's every line has the layout the guard writes.
func decisionSink(l *zap.Logger) *guard.LineSink {
	if c, ok := l.Core().(sinkCore); ok {
		return c.sink
	}
	return nil
}
