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

// logBufferBytes is the buffer of a log with a flush interval: about 500
// decision lines, so that a busy lockgate writes well under once per
// interval's worth of lines only when the buffer fills.
const logBufferBytes = 256 << 10

// OpenLogger builds the process logger writing to w, as NewLoggerTo does,
// and honours c.FlushInterval: above 0, lines are buffered (zap's
// BufferedWriteSyncer) and written when the interval has passed, when the
// buffer fills, and at once with any line at warn or above, so that what
// precedes a failure is on disk before the failure's own line returns.
// closeLog writes what is buffered and stops the flushing goroutine; call
// it last (after the gateway has stopped), as the mains defer it.
func OpenLogger(c config.Log, w io.Writer) (_ *zap.Logger, closeLog func(), err error) {
	d := c.FlushInterval.D()
	if d < 0 || d > config.MaxLogFlushInterval {
		return nil, nil, fmt.Errorf("log.flushInterval: must be between 0s and %v, got %v", config.MaxLogFlushInterval, d)
	}
	if d == 0 {
		l, err := newLogger(c, zapcore.Lock(zapcore.AddSync(w)), false)
		if err != nil {
			return nil, nil, err
		}
		return l, func() { _ = l.Sync() }, nil
	}
	// BufferedWriteSyncer serializes its own writes.
	bw := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(w), Size: logBufferBytes, FlushInterval: d}
	l, err := newLogger(c, bw, true)
	if err != nil {
		_ = bw.Stop()
		return nil, nil, err
	}
	return l, func() { _ = bw.Stop() }, nil
}

// NewLoggerTo builds a logger writing every line to w at once: JSON lines
// for production log collectors, or zap's human-readable console encoding
// for development. Writes to w are serialized. A buffered log needs a
// close at the end (OpenLogger), so a c.FlushInterval above 0 is refused
// here.
//
// Stack traces are kept for DPanic and above: lockgate's errors are
// operational (a refused reload, an unreachable upstream), and a stack
// under each would bury the reason.
//
// There is deliberately no sampling: it would silently drop repeated lines,
// and the audit trail of policy decisions must keep every one of them.
func NewLoggerTo(c config.Log, w io.Writer) (*zap.Logger, error) {
	if c.FlushInterval != 0 {
		return nil, fmt.Errorf("log.flushInterval: a buffered log is opened with OpenLogger, which closes it")
	}
	return newLogger(c, zapcore.Lock(zapcore.AddSync(w)), false)
}

// newLogger builds the logger on ws, whose writes are serialized; flushOnWarn
// makes ws written out after every line at warn or above (ws buffers).
func newLogger(c config.Log, ws zapcore.WriteSyncer, flushOnWarn bool) (*zap.Logger, error) {
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
	var core zapcore.Core = zapcore.NewCore(enc, ws, lvl)
	if flushOnWarn {
		core = flushingCore{Core: core, ws: ws}
	}
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

// flushingCore writes its buffered output out after each line at warn or
// above: the lines leading to a failure are the ones a reader needs, and
// a process that then dies would lose them from the buffer.
type flushingCore struct {
	zapcore.Core
	ws zapcore.WriteSyncer
}

func (c flushingCore) With(fields []zapcore.Field) zapcore.Core {
	return flushingCore{Core: c.Core.With(fields), ws: c.ws}
}

func (c flushingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c flushingCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	err := c.Core.Write(e, fields)
	if e.Level >= zapcore.WarnLevel {
		if serr := c.ws.Sync(); err == nil {
			err = serr
		}
	}
	return err
}
