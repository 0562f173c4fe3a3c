package guard

import (
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// BenchLog is what the benchmarks of an enforced write log through: the
// gateway's JSON logger (gateway.NewLoggerTo) at info, writing to
// io.Discard, and the sink it hands the guard for the decision lines.
func BenchLog() (*zap.Logger, *LineSink) {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	enc.EncodeDuration = zapcore.StringDurationEncoder
	out := zapcore.Lock(zapcore.AddSync(io.Discard))
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), out, zapcore.InfoLevel))
	return logger, &LineSink{Out: out, Level: zapcore.InfoLevel, ErrorOutput: out}
}
