package guard

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

func planTestRequest(t *testing.T, body bson.D) *proxy.Request {
	t.Helper()
	b, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
}

// TestOnePlanPerRequest: the boundary plans the request and enforcement
// decides by that same plan, never walking the message again; a request
// that no stage needs to read is never planned.
func TestOnePlanPerRequest(t *testing.T) {
	update := func(coll string) bson.D {
		return bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}}}},
			{Key: "$db", Value: "shop"}}
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "shop.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	g := New(Options{Store: unavailableStore{}, Reserved: ReservedFor("lockgate", "locks")})
	g.SetPolicy(pol)
	ctx := context.Background()

	req := planTestRequest(t, update("open"))
	if d := g.Intercept(ctx, req); d.Action != proxy.Forward {
		t.Fatalf("an update of an unprotected namespace: %+v", d)
	}
	p, ok := req.Plan.(*policy.Plan)
	if !ok {
		t.Fatalf("no plan on the request after the stages: %T", req.Plan)
	}
	if d := g.Intercept(ctx, req); d.Action != proxy.Forward || req.Plan != p {
		t.Fatalf("a second pass planned again or decided otherwise: %+v", d)
	}

	// Enforcement reads the plan it is given, not the message: handed the
	// plan of an update of the enforced namespace, it refuses.
	locked := planTestRequest(t, update("locked"))
	req.Plan = policy.NewPlan(locked.Message, locked.Command)
	if d, _ := (enforcementStage{g}).Decide(ctx, req); d.Action != proxy.Reply {
		t.Fatalf("enforcement did not decide by the request's plan: %+v", d)
	}

	// Nothing sealed, nothing enforced: no stage reads the request.
	bare := New(Options{Store: unavailableStore{}})
	off, _ := policy.Compile(config.Policy{Default: config.ModeOff})
	bare.SetPolicy(off)
	req = planTestRequest(t, update("open"))
	if d := bare.Intercept(ctx, req); d.Action != proxy.Forward || req.Plan != nil {
		t.Fatalf("an unprotected request was planned: %+v, %T", d, req.Plan)
	}
}
