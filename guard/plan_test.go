package guard

import (
	"context"
	"encoding/binary"
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

// TestBoundarySeesLegacyIndexInserts: an OP_INSERT into
// "<lock store db>.system.indexes" creates the index it describes on
// servers before 4.2 (a TTL index on the lock collection would delete
// every record). Its namespace is not the lock collection's, but the
// write reaches the whole database, and the plan says so.
func TestBoundarySeesLegacyIndexInserts(t *testing.T) {
	g := New(Options{Store: unavailableStore{}, Reserved: ReservedFor("lockgate", "locks")})
	off, _ := policy.Compile(config.Policy{Default: config.ModeOff})
	g.SetPolicy(off)
	index, err := bson.Marshal(bson.D{{Key: "ns", Value: "lockgate.locks"}, {Key: "key", Value: bson.D{{Key: "exp", Value: 1}}},
		{Key: "name", Value: "exp_1"}, {Key: "expireAfterSeconds", Value: 0}})
	if err != nil {
		t.Fatal(err)
	}
	b := wire.Header{RequestID: 1, OpCode: wire.OpCodeInsert}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(append(b, "lockgate.system.indexes"...), 0)
	b = append(b, index...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	msg, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	req := &proxy.Request{Message: msg, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
	if d := g.Intercept(context.Background(), req); d.Action == proxy.Forward {
		t.Fatalf("an OP_INSERT into the lock store's system.indexes was forwarded")
	}
}
