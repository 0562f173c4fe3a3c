package guard

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// TestAuthRequiredLearnedLater: whether the database requires
// authentication is learned after the guard is built (the gateway probes
// the upstream), so enforcement asks each time: once it is known, an
// enforced write from a connection that has not authenticated is refused
// before any lock is looked at. Decided without a server.
func TestAuthRequiredLearnedLater(t *testing.T) {
	var required atomic.Bool
	g := New(Options{Store: memstore.New(memstore.Config{}), AuthRequired: required.Load})
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff,
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	g.SetPolicy(pol)
	enforcement := g.Stages()[3]
	body, err := bson.Marshal(bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"},
		{Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}}}},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: primitive.Binary{Subtype: 4, Data: make([]byte, 16)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	reason := func() string {
		t.Helper()
		d, ok := enforcement.Decide(context.Background(), stageRequest(t, body))
		if !ok || d.Action != proxy.Reply {
			t.Fatalf("an update of a document nobody locked: settled %v, %+v; want a refusal", ok, d)
		}
		r, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK()
		return r
	}
	if r := reason(); r == refuse.ReasonUnauthenticated {
		t.Fatalf("refused as %s before authentication was known to be required", r)
	}
	required.Store(true)
	if r := reason(); r != refuse.ReasonUnauthenticated {
		t.Errorf("once authentication is required: refused as %q, want %q", r, refuse.ReasonUnauthenticated)
	}
}
