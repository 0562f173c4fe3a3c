package guard_test

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// processCPU is the process's user+system CPU time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// sink takes records and keeps the last: the hook's cost without a writer.
type sink struct{ last audittrail.Event }

func (s *sink) Append(ev audittrail.Event) bool { s.last = ev; return true }

func (s *sink) Commit(_ context.Context, ev audittrail.Event) error { s.last = ev; return nil }

// BenchmarkEnforcedWriteAuditTrail is BenchmarkEnforcedPinnedUpdate's
// enforced leg without and with the audit trail in bestEffort mode (a
// real file trail in a temporary directory, its writer running), side by
// side in one run; the ratio of the two is the trail's cost on the
// request path (docs/AUDIT.md); "enforced+required" waits for each
// record's fsync (audit.mode required), on the disk of the test's
// temporary directory; "enforced+hook" is the hook alone, the
// record built and handed to a sink that keeps it. "dropped/op" shows whether the writer
// kept up (records dropped because the buffer was full). "cpu-ns/op" is
// the whole process's CPU time per write, the trail's writer goroutine
// included: unlike ns/op it hardly moves when other processes take the
// cores, and the ratio of two legs' is the throughput the CPU cost alone
// implies.
//
//	go test ./guard -run '^$' -bench EnforcedWriteAuditTrail -benchmem
func BenchmarkEnforcedWriteAuditTrail(b *testing.B) {
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	parse := func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
		return guard.BenchRequest(b, client, body, seqs...)
	}
	update := guard.BenchUpdate(b, client, lsid, "locked", 7)
	acquire := parse(bsoncore.NewDocumentBuilder().AppendString("acquireLock", "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", int32(10*time.Minute/time.Millisecond)).
		AppendDocument("lsid", lsid).AppendString("$db", "bench").Build())
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "bench.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		b.Fatal(err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeDuration = zapcore.StringDurationEncoder
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	for _, leg := range []string{"enforced", "enforced+hook", "enforced+trail", "enforced+required"} {
		b.Run(leg, func(b *testing.B) {
			opts := guard.Options{Store: memstore.New(memstore.Config{}), Reserved: guard.ReservedFor("lockgate", "locks"), Logger: logger}
			var m *audittrail.Metrics
			var tr *audittrail.Trail
			if leg == "enforced+trail" || leg == "enforced+required" {
				m = audittrail.NewMetrics()
				tr, err = audittrail.Open(audittrail.Options{Dir: b.TempDir(), Instance: "bench",
					Key: audittrail.NewKey([]byte("bench-bench-bench-bench-bench-bench")), Metrics: m})
				if err != nil {
					b.Fatal(err)
				}
				opts.Trail = tr
				// required: every write waits for its record's fsync.
				opts.AuditRequired = leg == "enforced+required"
			}
			if leg == "enforced+hook" {
				// The request path's part alone: the record built and
				// handed over, no writer.
				opts.Trail = &sink{}
			}
			g := guard.New(opts)
			g.SetPolicy(pol)
			ctx := context.Background()
			if d := g.Intercept(ctx, acquire); d.Action != proxy.Reply || !ok(d.Reply) {
				b.Fatalf("acquireLock: %+v %s", d, d.Reply)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				update.Plan = nil // each request is planned anew, as the proxy makes a new one per message
				d := g.Intercept(ctx, update)
				if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
					b.Fatalf("%+v %s", d, d.Reply)
				}
				if d.OnReply != nil {
					d.OnReply.Reply(ctx, nil)
				}
			}
			b.StopTimer()
			if tr != nil {
				// Close writes what is left in the buffer: the writer's
				// whole share of these writes is in the CPU time.
				if err := tr.Close(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(m.Dropped()/float64(b.N), "dropped/op")
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
