package scheme

import (
	"context"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// decisions is what the schemes handed to enforcement.
type decisions struct {
	decided  []*Verdict
	recorded []*Violation
}

func newUnit(store Store, d *decisions) *Schemes {
	return New(Config{Store: store, Log: zap.NewNop(),
		SessionKey:   func(user string, b []byte) []byte { return append([]byte(user+"\x00"), b...) },
		ExactStrings: func(context.Context, policy.Write) bool { return true },
		Decide: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, _ time.Time) proxy.Decision {
			d.decided = append(d.decided, v)
			return proxy.Decision{Action: proxy.Forward}
		},
		Record: func(_ *proxy.Request, _ *policy.Policy, _ *Verdict, x *Violation, _ time.Duration) {
			d.recorded = append(d.recorded, x)
		}})
}

// holderWrite is an update of _id 1 of shop.hf by the holder named in its
// filter.
func holderWrite(t *testing.T, holder string) *proxy.Request {
	t.Helper()
	stmt, err := bson.Marshal(bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 1}, {Key: "LockId", Value: holder}}},
		{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 2}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return requestOf(t, bsoncore.NewDocumentBuilder().AppendString("update", "hf").
		AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(stmt).Build()).AppendString("$db", "shop").Build())
}

// requestOf is body as an OP_MSG from client 1, parsed as the proxy parses
// it.
func requestOf(t *testing.T, body bsoncore.Document) *proxy.Request {
	t.Helper()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000",
		RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}}
}

// TestHolderWriteDecidedByTheMirror: under holderFields, a write naming a
// holder goes on while that holder's mirror holds the lock, and once
// another holder took it over it gets the database's own answer for a
// filter that no longer matches (nothing matched), recorded as a refusal.
func TestHolderWriteDecidedByTheMirror(t *testing.T) {
	pol, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.hf", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	r := pol.Lookup(namespace.Of("shop.hf"))
	ctx := context.Background()
	for _, c := range []struct {
		name, holds string
		refused     bool
	}{
		{"the writer holds it", "me", false},
		{"taken over", "other", true},
	} {
		store := memstore.New(memstore.Config{})
		var d decisions
		sc := newUnit(store, &d)
		req := holderWrite(t, "me")
		holder := bsoncore.Value{Type: bson.TypeString, Data: bsoncore.AppendString(nil, c.holds)}
		o, _ := sc.owner(req, namespace.Of("shop.hf"), r.Scheme, holder)
		if _, err := store.Acquire(ctx, o, namespace.Of(r.Scheme.MirrorNS(namespace.Of("shop.hf")).String()), []docid.ID{lockstoretest.ID(1)}, time.Minute, 0); err != nil {
			t.Fatal(err)
		}
		writes, err := policy.NewPlan(req.Message, req.Command).Writes()
		if err != nil || len(writes) != 1 {
			t.Fatalf("%s: writes %v, %v", c.name, writes, err)
		}
		dec, ok := sc.Enforce(ctx, req, pol, writes, []policy.Rule{r}, time.Now())
		if !ok {
			t.Fatalf("%s: a write under a scheme was not the schemes'", c.name)
		}
		if !c.refused {
			if len(d.decided) != 1 || len(d.decided[0].Violations) != 0 || len(d.decided[0].Checked) != 1 {
				t.Errorf("%s: handed %+v to enforcement, want a verdict with no violation and the lock checked", c.name, d.decided)
			}
			continue
		}
		if len(d.recorded) != 1 || d.recorded[0] == nil || d.recorded[0].Reason != ReasonNotHolder {
			t.Fatalf("%s: recorded %+v, want the refusal of a holder whose lock was taken over", c.name, d.recorded)
		}
		if n, _ := dec.Reply.Lookup("n").AsInt64OK(); dec.Action != proxy.Reply || n != 0 {
			t.Errorf("%s: decision %v %v, want the database's nothing-matched answer", c.name, dec.Action, dec.Reply)
		}
	}
}

var _ Store = (*memstore.Store)(nil)
