package guard_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// events keeps what the guard hands to the trail.
type events struct {
	mu  sync.Mutex
	got []audittrail.Event
}

func (e *events) Append(ev audittrail.Event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
	return true
}

// The guard hands the trail one record per protected namespace a write
// touches, with the verdict the decision log has, the ids, the holder tag
// and the policy version; nothing for unprotected namespaces.
func TestDecisionsReachTheTrail(t *testing.T) {
	lsidOf := func(b byte) bsoncore.Document {
		id := make([]byte, 16)
		id[0] = b
		return bsoncore.NewDocumentBuilder().AppendBinary("id", 4, id).Build()
	}
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	req := func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, seqs...), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		return &proxy.Request{Message: msg, Command: cmd, Client: client}
	}
	update := func(coll string, id int32, lsid bsoncore.Document) *proxy.Request {
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", id).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
			Build()
		return req(bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendDocument("lsid", lsid).AppendString("$db", "shop").Build(),
			wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce}, {Match: "shop.carts", Mode: config.ModeAudit}}})
	if err != nil {
		t.Fatal(err)
	}
	sink := &events{}
	g := guard.New(guard.Options{Store: memstore.New(memstore.Config{}), Reserved: guard.ReservedFor("lockgate", "locks"), Trail: sink})
	g.SetPolicy(pol)
	ctx := context.Background()
	holder, other := lsidOf(1), lsidOf(2)
	acquire := req(bsoncore.NewDocumentBuilder().AppendString("acquireLock", "orders").
		AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", int32(time.Minute/time.Millisecond)).
		AppendDocument("lsid", holder).AppendString("$db", "shop").Build())
	if d := g.Intercept(ctx, acquire); d.Action != proxy.Reply || !ok(d.Reply) {
		t.Fatalf("acquireLock: %+v %s", d, d.Reply)
	}
	for _, r := range []*proxy.Request{update("orders", 7, holder), update("orders", 7, other), update("carts", 3, other), update("open", 1, other)} {
		d := g.Intercept(ctx, r)
		if d.OnReply != nil {
			d.OnReply.Reply(ctx, nil)
		}
	}
	var got []string
	for _, ev := range sink.got {
		got = append(got, fmt.Sprintf("%s %s %s %s %v %s", ev.Kind, ev.NS, ev.Op, ev.Verdict, ev.IDs, ev.Reason))
		if ev.Policy != pol.Version() || ev.Client != client.Addr || len(ev.Session) != 8 || ev.Time.IsZero() {
			t.Errorf("record without its policy, client, holder tag or time: %+v", ev)
		}
	}
	want := []string{
		"decision shop.orders update allow [7] ",
		"decision shop.orders update reject [7] held_by_other",
		"decision shop.carts update wouldReject [3] not_locked",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if sink.got[0].Session == sink.got[1].Session {
		t.Fatal("two sessions got the same holder tag")
	}
}
