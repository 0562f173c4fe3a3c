package guard_test

import (
	"context"
	"errors"
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

// events keeps what the guard hands to the trail; Commit fails with
// commitErr when set.
type events struct {
	mu        sync.Mutex
	got       []audittrail.Event
	committed int
	commitErr error
}

func (e *events) Commit(_ context.Context, ev audittrail.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.commitErr != nil {
		return e.commitErr
	}
	e.committed++
	e.got = append(e.got, ev)
	return nil
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
		t.Helper()
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
		if ev.Policy != pol.Version() || ev.Client != client.Addr || len(ev.HolderString()) != 8 || ev.Time.IsZero() {
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
	if sink.got[0].HolderString() == sink.got[1].HolderString() {
		t.Fatal("two sessions got the same holder tag")
	}
}

// A rule with auditRequired forwards an allowed write only once its record
// is committed; when the trail cannot take it the write is refused
// (LockBusy, reason audit_unavailable) and the refusal is what the
// counters and the trail say. Other rules never wait.
func TestAuditRequiredFailsClosed(t *testing.T) {
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}
	req := func(body bsoncore.Document, seqs ...wire.Sequence) *proxy.Request {
		t.Helper()
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
	update := func(coll string) *proxy.Request {
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
			Build()
		return req(bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendDocument("lsid", lsid).AppendString("$db", "shop").Build(),
			wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
	}
	acquire := func(coll string) *proxy.Request {
		return req(bsoncore.NewDocumentBuilder().AppendString("acquireLock", coll).
			AppendArray("ids", bsoncore.NewArrayBuilder().AppendInt32(7).Build()).AppendInt32("leaseMS", int32(time.Minute/time.Millisecond)).
			AppendDocument("lsid", lsid).AppendString("$db", "shop").Build())
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce, AuditRequired: true}, {Match: "shop.carts", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		all       bool // guard.Options.AuditRequired (audit.mode: required)
		coll      string
		commitErr error
		forwarded bool
		committed int
	}{
		{"required rule, trail ok", false, "orders", nil, true, 1},
		{"required rule, trail failing", false, "orders", errors.New("disk full"), false, 0},
		{"best-effort rule, trail failing", false, "carts", errors.New("disk full"), true, 0},
		{"audit.mode required, trail failing", true, "carts", errors.New("disk full"), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := &events{commitErr: tc.commitErr}
			m := guard.NewMetrics()
			g := guard.New(guard.Options{Store: memstore.New(memstore.Config{}), Reserved: guard.ReservedFor("lockgate", "locks"),
				Trail: sink, AuditRequired: tc.all, Metrics: m})
			g.SetPolicy(pol)
			ctx := context.Background()
			if d := g.Intercept(ctx, acquire(tc.coll)); d.Action != proxy.Reply || !ok(d.Reply) {
				t.Fatalf("acquireLock: %+v %s", d, d.Reply)
			}
			d := g.Intercept(ctx, update(tc.coll))
			if d.OnReply != nil {
				d.OnReply.Reply(ctx, nil)
			}
			forwarded := d.Action == proxy.Forward || d.Action == proxy.Rewrite
			if forwarded != tc.forwarded || sink.committed != tc.committed {
				t.Fatalf("forwarded %v (want %v), committed %d (want %d): %+v %s", forwarded, tc.forwarded, sink.committed, tc.committed, d, d.Reply)
			}
			if tc.forwarded {
				return
			}
			code, _ := d.Reply.Lookup("code").AsInt64OK()
			reason, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK()
			if code != 46 || reason != "audit_unavailable" || !strings.Contains(d.Reply.Lookup("errmsg").StringValue(), "disk full") {
				t.Fatalf("refusal: %s", d.Reply)
			}
			last := sink.got[len(sink.got)-1]
			if last.Verdict != audittrail.VerdictReject || last.Reason != "audit_unavailable" {
				t.Fatalf("the trail's last record: %+v", last)
			}
		})
	}
}
