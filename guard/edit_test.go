package guard_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// editGuard is a guard over an in-memory lock store enforcing db.locked,
// with the document fence when fence is set, and a session that holds the
// lock on _id 7 there (without the fence: stamping needs a database).
func editGuard(t *testing.T, fence bool) (*guard.Guard, func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request) {
	t.Helper()
	rule := config.NamespaceRule{Match: "db.locked", Mode: config.ModeEnforce}
	if fence {
		rule.Fence = config.FenceDocument
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(guard.Options{Store: memstore.New(memstore.Config{}), Reserved: guard.ReservedFor("lockgate", "locks")})
	g.SetPolicy(pol)
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	req := func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
		t.Helper()
		b := bsoncore.NewDocumentBuilder()
		elems, _ := body.Elements()
		for _, e := range elems {
			b.AppendValue(e.Key(), e.Value())
		}
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.AppendDocument("lsid", lsid).Build(), seqs...), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		return &proxy.Request{Message: msg, Command: cmd, Client: client}
	}
	acquire := bsoncore.NewDocumentBuilder().AppendString("acquireLock", "locked").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", int32(10*time.Minute/time.Millisecond)).
		AppendString("$db", "db").Build()
	if d := g.Intercept(context.Background(), req(acquire)); !fence && (d.Action != proxy.Reply || !ok(d.Reply)) {
		t.Fatalf("acquireLock: %+v %s", d, d.Reply)
	}
	return g, req
}

// TestEnforcedWriteEditedOnce: an allowed enforced write leaves with its
// maxTimeMS cap, and nothing else changed in its statements.
func TestEnforcedWriteEditedOnce(t *testing.T) {
	g, req := editGuard(t, false)
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).Build()
	r := req(bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendString("$db", "db").Build(),
		wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
	d := g.Intercept(context.Background(), r)
	if d.Action != proxy.Rewrite {
		t.Fatalf("decision %+v %s, want the write rewritten with its cap", d, d.Reply)
	}
	defer d.OnReply.Reply(context.Background(), nil)
	m, err := wire.Parse(d.Message, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := cmd.Body.Lookup("maxTimeMS").AsInt64OK(); !ok || v <= 0 {
		t.Errorf("maxTimeMS %v, want the lease's cap", cmd.Body.Lookup("maxTimeMS"))
	}
	docs, err := cmd.Documents("updates")
	if err != nil || len(docs) != 1 || string(docs[0]) != string(stmt) {
		t.Errorf("statements %v (%v), want the one statement unchanged", docs, err)
	}
}

// TestFencedBulkWriteRefused: the editor can fence bulkWrite's ops
// (policy.TestFenceBulkWrite), but the fence's reply hook cannot yet tell
// a fenced-out op from one that matched nothing in bulkWrite's per-op
// cursor, so on a fenced namespace bulkWrite stays refused.
func TestFencedBulkWriteRefused(t *testing.T) {
	g, req := editGuard(t, true)
	op := bsoncore.NewDocumentBuilder().AppendInt32("update", 0).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("updateMods", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("a", 1).Build()).Build()).Build()
	info := bsoncore.NewDocumentBuilder().AppendString("ns", "db.locked").Build()
	d := g.Intercept(context.Background(), req(bsoncore.NewDocumentBuilder().AppendInt32("bulkWrite", 1).AppendString("$db", "admin").Build(),
		wire.Sequence{Identifier: "ops", Documents: []bsoncore.Document{op}},
		wire.Sequence{Identifier: "nsInfo", Documents: []bsoncore.Document{info}}))
	if d.Action != proxy.Reply || ok(d.Reply) || !strings.Contains(d.Reply.String(), "fence_unsupported") {
		t.Fatalf("decision %+v %s, want the fence_unsupported refusal", d, d.Reply)
	}
}
