package guard

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// BenchmarkRecordAllowedWrite is the decision record of
// BenchmarkEnforcedPinnedUpdate's enforced write alone (recordAt: the
// latency histogram, the decision counter, the decision line through the
// LineSink), replayed on the verdict one real decision made, the clock
// moving 1.5 µs a write so that the line's second turns over as it does
// under load. It isolates what the whole write's benchmark shows as
// recordAt, whose share the machine's noise would otherwise hide.
//
//	go test ./guard -run '^$' -bench RecordAllowedWrite -benchmem
func BenchmarkRecordAllowedWrite(b *testing.B) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "bench.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		b.Fatal(err)
	}
	logger, sink := BenchLog()
	g := New(Options{Store: memstore.New(memstore.Config{}), Logger: logger, DecisionSink: sink})
	g.SetPolicy(pol)
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	parse := func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
		return BenchRequest(b, client, body, seqs...)
	}
	ctx := context.Background()
	acquire := parse(bsoncore.NewDocumentBuilder().AppendString("acquireLock", "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", 600000).
		AppendDocument("lsid", lsid).AppendString("$db", "bench").Build())
	if d := g.Intercept(ctx, acquire); d.Action != proxy.Reply {
		b.Fatalf("acquireLock: %+v", d)
	}
	update := BenchUpdate(b, client, lsid, "locked", 7)
	// The decision's own arguments, caught as it records them; the
	// write is never answered, so its verdict stays as recorded.
	var v *verdict
	var took time.Duration
	record := g.decider.Record
	g.decider.Record = func(req *proxy.Request, p *policy.Policy, vv *verdict, enforced *enforce.Violation, d time.Duration, now time.Time) *enforce.Violation {
		v, took = vv, d
		return record(req, p, vv, enforced, d, now)
	}
	if d := g.Intercept(ctx, update); d.Action != proxy.Forward && d.Action != proxy.Rewrite {
		b.Fatalf("update: %+v", d)
	}
	if v == nil || len(v.Writes) != 1 {
		b.Fatal("no decision recorded")
	}
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(1500)
		if x := g.recordAt(update, pol, v, nil, took+time.Duration(i&1023), now); x != nil {
			b.Fatal(x)
		}
	}
}
