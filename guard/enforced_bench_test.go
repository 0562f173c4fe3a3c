package guard_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// BenchmarkEnforcedPinnedUpdate is the guard's whole part of the enforce
// benchmark's write (bench/enforce.go): updateOne({_id}, {$inc: {n: 1}}) in
// a session that holds the lock, decided, launched as a write in flight
// (lease deadline, maxTimeMS, renewal timer), audited as the gateway logs
// (JSON at info, the decision line through the logger's LineSink, to
// io.Discard) and landed by its reply; against the same
// update on a namespace no rule protects. The difference of the two legs
// is the CPU the guard adds to an enforced write (docs/BENCHMARKS.md).
//
//	go test ./guard -run '^$' -bench EnforcedPinnedUpdate -benchmem
func BenchmarkEnforcedPinnedUpdate(b *testing.B) {
	// lsidOf is session s's lsid: a driver's {id: <UUID>}.
	lsidOf := func(s int32) bsoncore.Document {
		id := make([]byte, 16)
		id[0] = byte(s)
		return bsoncore.NewDocumentBuilder().AppendBinary("id", 4, id).Build()
	}
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "bench.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		b.Fatal(err)
	}
	logger, sink := guard.BenchLog()
	// The enforced leg writes one _id, as a client updating one document
	// over and over; enforced-64ids cycles through 64 locked _ids, as a
	// client updating many documents does, which the connection's memo
	// of its last 8 pinned ids (pinnedIDs) cannot hold. enforced-16sessions
	// is the enforce family's workload as one connection of a driver's
	// pool sees it: 16 sessions, each holding its 4 documents, write in
	// turn on the connection (an operation goes out on whichever pooled
	// connection is idle), so that the connection's memos, keyed by
	// session and document, see 64 keys (docs/BENCHMARKS.md, "the third
	// box's merges"). The -256conns legs write in turn on 256
	// connections, each in its own session on its own document, as the
	// proxy's connections do with other work between two writes of one:
	// a connection's state, memos and verdict are no longer in the L1
	// cache when its next write comes, which the one-connection legs,
	// whose whole loop stays cached, never pay (docs/BENCHMARKS.md, "the
	// seventh box's proxy path").
	for _, leg := range []struct {
		name, coll    string
		sessions, ids int32 // ids per session
		conns         int32 // session s writes on connection s mod conns
	}{{"unprotected", "open", 1, 1, 1}, {"enforced", "locked", 1, 1, 1}, {"enforced-64ids", "locked", 1, 64, 1}, {"enforced-16sessions", "locked", 16, 4, 1},
		{"unprotected-256conns", "open", 256, 1, 256}, {"enforced-256conns", "locked", 256, 1, 256}} {
		b.Run(leg.name, func(b *testing.B) {
			clients := []*proxy.ClientInfo{client}
			for c := int32(1); c < leg.conns; c++ {
				port := 5000 + int(c)
				clients = append(clients, &proxy.ClientInfo{ID: uint64(1 + c), Addr: fmt.Sprintf("127.0.0.1:%d", port), RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}})
			}
			store := memstore.New(memstore.Config{})
			g := guard.New(guard.Options{Store: store, Reserved: guard.ReservedFor("lockgate", "locks"), Logger: logger, DecisionSink: sink})
			g.SetPolicy(pol)
			ctx := context.Background()
			for s := range leg.sessions {
				// The locks, taken as acquireLock through the guard takes them.
				acquire := bsoncore.NewDocumentBuilder().AppendString("acquireLock", "locked").
					AppendArray("ids", lockIDs(7+s*leg.ids, leg.ids)).AppendInt32("leaseMS", int32(10*time.Minute/time.Millisecond)).
					AppendDocument("lsid", lsidOf(s)).AppendString("$db", "bench").Build()
				if d := g.Intercept(ctx, guard.BenchRequest(b, clients[s%leg.conns], acquire)); d.Action != proxy.Reply || !ok(d.Reply) {
					b.Fatalf("acquireLock: %+v %s", d, d.Reply)
				}
			}
			if st, _ := store.Status(ctx, lockstore.Owner{}, namespace.Of("bench.locked"), lockstoretest.IDs(int32(7))); len(st) != 1 || !st[0].Held {
				b.Fatal("the lock is not held", st)
			}
			// Request i is session i mod sessions's, on its documents in turn.
			reqs := make([]*proxy.Request, leg.sessions*leg.ids)
			for i := range reqs {
				s, k := int32(i)%leg.sessions, int32(i)/leg.sessions
				reqs[i] = guard.BenchUpdate(b, clients[s%leg.conns], lsidOf(s), leg.coll, 7+s*leg.ids+k)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := reqs[i%len(reqs)]
				req.Plan = nil // each request is planned anew, into its connection's plan (Request.Scratch), as the proxy does
				d := g.Intercept(ctx, req)
				if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
					b.Fatalf("%+v %s", d, d.Reply)
				}
				if d.MessageDone != nil {
					d.MessageDone.ReleaseMessage(d.Message) // written upstream
				}
				if d.OnReply != nil {
					d.OnReply.Reply(ctx, nil) // answered: the flight lands
				}
			}
		})
	}
}

// lockIDs are the _ids from to from+n-1, as acquireLock's ids.
func lockIDs(from, n int32) bsoncore.Array {
	a := bsoncore.NewArrayBuilder()
	for i := range n {
		a.AppendInt32(from + i)
	}
	return a.Build()
}

func ok(reply bsoncore.Document) bool {
	v, ok := reply.Lookup("ok").AsInt64OK()
	return ok && v == 1
}

// BenchmarkManyPinnedIDs is the guard deciding an update whose filter
// names 50,000 _ids in a session that holds none of them: with the
// default maxCandidates (1000) it reads 1001 values and refuses the write
// (too_many_candidates); with the limit raised to its maximum (100000)
// it reads them all and checks every lock (not_locked). In-memory lock
// store, so the figure is the guard's own work.
//
//	go test ./guard -run '^$' -bench ManyPinnedIDs -benchmem
func BenchmarkManyPinnedIDs(b *testing.B) {
	const n = 50000
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	in := bsoncore.NewArrayBuilder()
	for i := range n {
		in.AppendInt32(int32(i))
	}
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendArray("$in", in.Build()).Build()).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		AppendBoolean("multi", true).Build()
	body := bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", lsid).AppendString("$db", "bench").Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		b.Fatal(err)
	}
	req := &proxy.Request{Message: msg, Command: cmd, Client: client}
	for _, leg := range []struct {
		limit  int
		reason string
	}{{config.DefaultMaxCandidates, "too_many_candidates"}, {config.MaxMaxCandidates, "not_locked"}} {
		b.Run(fmt.Sprintf("maxCandidates=%d", leg.limit), func(b *testing.B) {
			pol, err := policy.Compile(config.Policy{Default: config.ModeOff, MaxCandidates: leg.limit,
				Namespaces: []config.NamespaceRule{{Match: "bench.locked", Mode: config.ModeEnforce}}})
			if err != nil {
				b.Fatal(err)
			}
			g := guard.New(guard.Options{Store: memstore.New(memstore.Config{}), Reserved: guard.ReservedFor("lockgate", "locks"), Logger: zap.NewNop()})
			g.SetPolicy(pol)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				req.Plan = nil // each request is planned anew, into its connection's plan (Request.Scratch), as the proxy does
				d := g.Intercept(ctx, req)
				if d.Action != proxy.Reply {
					b.Fatalf("%+v", d)
				}
				if got, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK(); got != leg.reason {
					b.Fatalf("refused as %q, want %q (%d-byte reply)", got, leg.reason, len(d.Reply))
				}
			}
		})
	}
}
