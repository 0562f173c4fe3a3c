package guard

import (
	"io"
	"testing"

	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
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

// BenchRequest is the request a connection of client would hand the
// guard for the OP_MSG of body and seqs.
func BenchRequest(tb testing.TB, client *proxy.ClientInfo, body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
	tb.Helper()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, seqs...), wire.Limits{})
	if err != nil {
		tb.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		tb.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: client}
}

// BenchUpdate is the benchmarks' enforced write: updateOne({_id: id},
// {$inc: {n: 1}}) on bench.<coll> in the session of lsid, as the Go driver
// sends it (the statement in a kind-1 section).
func BenchUpdate(tb testing.TB, client *proxy.ClientInfo, lsid bsoncore.Document, coll string, id int32) *proxy.Request {
	tb.Helper()
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", id).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	body := bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendBoolean("ordered", true).
		AppendDocument("lsid", lsid).AppendInt64("txnNumber", 1).AppendString("$db", "bench").Build()
	return BenchRequest(tb, client, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
}
