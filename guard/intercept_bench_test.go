package guard

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// BenchmarkInterceptPassThrough is what every request that writes nothing
// protected pays in the guard: a findOne as the Go driver sends it, under
// a policy with everything off and with one namespace enforced (which
// adds the session-introspection check), against the bare minimum (no
// lock store to seal).
//
//	go test ./guard -run '^$' -bench InterceptPassThrough -benchmem
func BenchmarkInterceptPassThrough(b *testing.B) {
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	body := bsoncore.NewDocumentBuilder().AppendString("find", "orders").
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendInt32("limit", 1).AppendBoolean("singleBatch", true).
		AppendDocument("lsid", lsid).AppendString("$db", "shop").Build()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		b.Fatal(err)
	}
	client := &proxy.ClientInfo{ID: 1, Addr: "bench"}
	off, _ := policy.Compile(config.Policy{Default: config.ModeOff})
	enforced, _ := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.other", Mode: config.ModeEnforce}}})
	for _, leg := range []struct {
		name     string
		reserved Reserved
		pol      *policy.Policy
	}{
		{"unsealed/off", Reserved{}, off},
		{"sealed/off", ReservedFor("lockgate", "locks"), off},
		{"sealed/enforcing", ReservedFor("lockgate", "locks"), enforced},
	} {
		b.Run(leg.name, func(b *testing.B) {
			g := New(Options{Store: unavailableStore{}, Reserved: leg.reserved})
			g.SetPolicy(leg.pol)
			req := &proxy.Request{Message: msg, Command: cmd, Client: client}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req.Plan = nil // each request is planned anew, into its connection's plan (Request.Scratch), as the proxy does
				if d := g.Intercept(ctx, req); d.Action != proxy.Forward {
					b.Fatal(d)
				}
			}
		})
	}
}
