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

// stageRequest is body as a request, with no connection behind it.
func stageRequest(t *testing.T, body bsoncore.Document) *proxy.Request {
	t.Helper()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
}

// TestEachStageSettlesOnlyItsOwnRequests: every stage of the chain, on its
// own, settles the requests of its concern and passes every other one;
// and the order is part of the design: a lock command naming the lock
// store's namespace is settled (refused) by the boundary, so the lock
// command stage never sees it. Decided without a server: the stages that
// settle here answer from the request alone.
func TestEachStageSettlesOnlyItsOwnRequests(t *testing.T) {
	g := New(Options{Reserved: ReservedFor("lockgate", "locks")})
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff,
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	g.SetPolicy(pol)
	stages := g.Stages()
	if len(stages) != 4 {
		t.Fatalf("%d stages, want boundary, lock commands, sessions, enforcement", len(stages))
	}
	boundary, locks, sessions, enforcement := stages[0], stages[1], stages[2], stages[3]
	doc := func(k, v string, db string) bsoncore.Document {
		return bsoncore.NewDocumentBuilder().AppendString(k, v).AppendString("$db", db).Build()
	}
	ordinary := doc("find", "orders", "shop")
	sealed := doc("find", "locks", "lockgate")
	lockOnSealed := doc("lockStatus", "locks", "lockgate")
	lockCmd := doc("lockStatus", "orders", "shop")
	endTxn := bsoncore.NewDocumentBuilder().AppendInt32("abortTransaction", 1).AppendString("$db", "admin").Build()
	ctx := context.Background()
	settles := func(name string, s proxy.Stage, body bsoncore.Document) (proxy.Decision, bool) {
		t.Helper()
		return s.Decide(ctx, stageRequest(t, body))
	}
	// boundary
	if _, ok := settles("boundary", boundary, ordinary); ok {
		t.Error("boundary settled an ordinary find")
	}
	for _, body := range []bsoncore.Document{sealed, lockOnSealed} {
		d, ok := settles("boundary", boundary, body)
		if !ok || d.Action != proxy.Reply || lockgateOK(d.Reply) {
			t.Errorf("boundary on %v: settled %v, %+v; want a refusal", body, ok, d)
		}
	}
	// lock commands: passes what is not one (without touching a store)
	for _, body := range []bsoncore.Document{ordinary, endTxn} {
		if _, ok := settles("locks", locks, body); ok {
			t.Errorf("the lock command stage settled %v", body)
		}
	}
	// sessions: passes lock commands and ordinary commands
	for _, body := range []bsoncore.Document{ordinary, lockCmd} {
		if _, ok := settles("sessions", sessions, body); ok {
			t.Errorf("the session stage settled %v", body)
		}
	}
	// enforcement settles everything it is given: a find on an enforced
	// namespace is forwarded.
	if d, ok := settles("enforcement", enforcement, ordinary); !ok || d.Action != proxy.Forward {
		t.Errorf("enforcement on a find: %v %+v, want Forward", ok, d)
	}
	// The chain: the lock command on the sealed collection never reaches
	// the lock command stage (which would need a lock store here).
	d := proxy.Chain(stages).Intercept(ctx, stageRequest(t, lockOnSealed))
	if d.Action != proxy.Reply || lockgateOK(d.Reply) {
		t.Errorf("chain on a lock command naming the lock store: %+v, want the boundary's refusal", d)
	}
}

func lockgateOK(reply bsoncore.Document) bool {
	ok, _ := reply.Lookup("ok").AsInt64OK()
	return ok == 1
}
