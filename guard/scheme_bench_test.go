package guard

import (
	"context"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// heldStore holds every lock for everyone, from memory: what Holds costs
// for a lock taken through the same proxy (its cache), without the store.
type heldStore struct{ unavailableStore }

func (heldStore) Holds(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) (bool, []docid.ID, error) {
	return true, nil, nil
}

// simpleResolver answers that every collection compares strings byte for
// byte, as a collection without a default collation does: string holder
// values (LockId: "g") then name one holder.
type simpleResolver struct{ Resolver }

func (simpleResolver) SimpleCollation(context.Context, namespace.Namespace) (bool, error) {
	return true, nil
}

// BenchmarkSchemeHolderWrite is the guard's decision for a holder's
// _id-pinned update under each scheme, against the same decision under
// lockgate's own commands and an unprotected namespace: the CPU that
// enforcement adds per write (docs/BENCHMARKS.md).
//
//	go test ./guard -run '^$' -bench SchemeHolderWrite -benchmem
func BenchmarkSchemeHolderWrite(b *testing.B) {
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	update := func(coll string, filter bsoncore.Document) *proxy.Request {
		stmt := bsoncore.NewDocumentBuilder().AppendDocument("q", filter).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).Build()
		body := bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendBoolean("ordered", true).
			AppendDocument("lsid", lsid).AppendString("$db", "shop").Build()
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			b.Fatal(err)
		}
		return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000",
			RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}}
	}
	byID := bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()
	rules := []config.NamespaceRule{
		{Match: "shop.own", Mode: config.ModeEnforce},
		{Match: "shop.hf", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 30000}},
		{Match: "shop.ld", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockDocument}},
		{Match: "shop.flag", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, LeaseMS: 30000}},
		{Match: "shop.lc", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 30000}},
	}
	pol, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: rules}, 30000)
	if err != nil {
		b.Fatal(err)
	}
	for _, leg := range []struct {
		name string
		req  *proxy.Request
	}{
		{"unprotected", update("open", byID)},
		{"lockgate", update("own", byID)},
		{"holderFields", update("hf", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).AppendString("LockId", "g").Build())},
		{"lockDocument", update("ld", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).AppendString("Lock.actor", "a").Build())},
		{"flag", update("flag", byID)},
		{"lockCollection", update("lc", byID)},
	} {
		b.Run(leg.name, func(b *testing.B) {
			g := New(Options{Store: heldStore{}, Reserved: ReservedFor("lockgate", "locks"), Resolver: simpleResolver{}})
			g.SetPolicy(pol)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				leg.req.Plan = nil // each request is planned anew, into its connection's plan (Request.Scratch), as the proxy does
				if d := g.Intercept(ctx, leg.req); d.Action != proxy.Forward {
					b.Fatalf("%+v %s", d, d.Reply)
				}
			}
		})
	}
}
