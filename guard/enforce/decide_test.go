package enforce

import (
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

func request(t *testing.T, body bson.D) *proxy.Request {
	t.Helper()
	raw, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, raw), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "10.0.0.1:5000"}}
}

// TestRefusal: an enforced violation becomes the command's error with
// LockBusy (or the code the violation names, never one a driver retries),
// the reason, the namespace and the ids, and a message that says what,
// where, why and what to do.
func TestRefusal(t *testing.T) {
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	w := policy.Write{NS: namespace.Of("shop.orders")}
	seven, _ := docid.Of(7)
	holder := &lockstore.Holder{App: "billing", Client: "10.0.0.9:4000", SessionPrefix: "ab12cd34", ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, c := range []struct {
		name string
		x    Violation
		code mongoerr.Code
		msg  []string
	}{
		{"not locked", Violation{Write: w, Reason: ReasonNotLocked, IDs: []docid.ID{seven}, Detail: "this session does not hold the lock on _id 7"},
			mongoerr.LockBusy, []string{"lockgate: update on shop.orders refused: this session does not hold the lock on _id 7; nothing was written: acquire the lock with acquireLock"}},
		{"held by another", Violation{Write: w, Reason: ReasonHeldByOther, IDs: []docid.ID{seven}, Holder: holder, Detail: "held"},
			mongoerr.LockBusy, []string{"refused: held; wait for the holder to release it"}},
		{"no session", Violation{Write: w, Reason: refuse.ReasonNoSession, Detail: "no lsid"},
			mongoerr.LockBusy, []string{"no lsid; run the write in an explicit session"}},
		{"collection write", Violation{Write: w, Reason: ReasonCollectionWrite, Detail: "drop"},
			mongoerr.LockBusy, []string{"allowCollectionWrites"}},
		{"implicit timeout", Violation{Write: w, Reason: "timeout", Detail: "waited", Code: mongoerr.LockTimeout},
			mongoerr.LockTimeout, []string{"waited"}},
		{"own advice", Violation{Write: w, Reason: ReasonResolveFailed, Detail: "slow", Advice: "nothing was written"},
			mongoerr.LockBusy, []string{"slow; nothing was written"}},
	} {
		e := Refusal(req, c.x)
		if e.Code != c.code || e.Reason != c.x.Reason || e.NS != "shop.orders" || len(e.IDs) != len(c.x.IDs) || e.Holder != c.x.Holder {
			t.Errorf("%s: %+v", c.name, e)
		}
		for _, m := range c.msg {
			if !strings.Contains(e.Msg, m) {
				t.Errorf("%s: message %q lacks %q", c.name, e.Msg, m)
			}
		}
		if d := e.Document(); d.Lookup("code").Int32() != int32(c.code) || d.Lookup("ok").Double() != 0 {
			t.Errorf("%s: reply %s", c.name, d)
		}
	}

	// A message that carries no command is named by its opcode.
	legacy := &proxy.Request{Message: req.Message, Client: req.Client}
	if e := Refusal(legacy, Violation{Write: w, Reason: ReasonNotLocked, Detail: "d"}); !strings.HasPrefix(e.Msg, "lockgate: "+req.Message.Header().OpCode.String()+" on shop.orders refused: d;") {
		t.Errorf("legacy: %q", e.Msg)
	}
}

// TestUndisclosed: to a caller who may not read the namespace, a refusal
// names no holder, and "held by another" reads as "not locked".
func TestUndisclosed(t *testing.T) {
	w := policy.Write{NS: namespace.Of("shop.orders")}
	seven, _ := docid.Of(7)
	h := &lockstore.Holder{App: "billing", SessionPrefix: "ab12cd34", ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	who := refuse.DescribeHolder(*h)

	x := Undisclosed(Violation{Write: w, Reason: ReasonHeldByOther, IDs: []docid.ID{seven}, Holder: h, Detail: "this session does not hold the lock on _id 7 (" + who + ")"})
	if x.Holder != nil || x.Reason != ReasonNotLocked || strings.Contains(x.Detail, "billing") || x.Detail != "this session does not hold the lock on _id 7" {
		t.Errorf("held by another: %+v", x)
	}
	x = Undisclosed(Violation{Write: w, Reason: ReasonInsertLocked, IDs: []docid.ID{seven}, Holder: h, Detail: "another session has locked _id 7, which this insert would create (" + who + ")"})
	if x.Holder != nil || x.Reason != ReasonInsertLocked || strings.Contains(x.Detail, "billing") || strings.Contains(x.Detail, "ab12cd34") {
		t.Errorf("insert locked: %+v", x)
	}
	x = Undisclosed(Violation{Write: w, Reason: "scheme", Holder: h, Detail: "the lock is " + who + " now"})
	if x.Detail != "the lock is "+refuse.HeldByAnother+" now" {
		t.Errorf("scheme: %q", x.Detail)
	}
	if x := Undisclosed(Violation{Write: w, Reason: ReasonNotLocked, Detail: "d"}); x.Detail != "d" {
		t.Errorf("no holder changed: %+v", x)
	}
}

// TestLaunchStartsFromAForward: an allowed write's decision is made in
// its verdict's room (Verdict.Decision), which a verdict decided again
// still holds: each launch starts from a plain forward, and the decision
// returned is a copy that the next launch does not change.
func TestLaunchStartsFromAForward(t *testing.T) {
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	var seen []proxy.Decision
	d := &Decider[*Verdict]{
		Record: func(*proxy.Request, *policy.Policy, *Verdict, *Violation, time.Duration, time.Time) *Violation {
			return nil
		},
		Launch: func(_ *proxy.Request, _ *policy.Policy, _ *Verdict, now time.Time, d *proxy.Decision) {
			seen = append(seen, *d)
			d.Action, d.Message, d.Deadline, d.Reason = proxy.Rewrite, []byte{1}, now, strings.Repeat("x", len(seen))
		},
	}
	v := &Verdict{}
	first := d.Decide(req, nil, v, v, time.Now())
	second := d.Decide(req, nil, v, v, time.Now())
	for i, s := range seen {
		if s.Action != proxy.Forward || s.Message != nil || !s.Deadline.IsZero() || s.Reason != "" {
			t.Errorf("launch %d started from %+v, want a plain forward", i, s)
		}
	}
	if first.Action != proxy.Rewrite || first.Reason != "x" || second.Reason != "xx" || len(first.Message) != 1 {
		t.Errorf("the first decision %+v changed with the second %+v", first, second)
	}
}

// TestAuditRecordFailureRefuses: a write whose audit record could not be
// made durable (Record answers a violation) is refused, not launched.
// Mutant: decide ignoring Record's violation.
func TestAuditRecordFailureRefuses(t *testing.T) {
	req := request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})
	failed := &Violation{Rule: policy.Rule{Mode: policy.Enforce}, Write: policy.Write{NS: namespace.Of("shop.orders")}, Reason: refuse.ReasonUnavailable, Detail: "the audit record could not be written"}
	var recorded *Violation
	launched := false
	b := &Verdict{Req: req}
	d := recordingDecider(&recorded, &launched, failed).Decide(req, &policy.Policy{}, b, b, time.Now())
	if d.Action != proxy.Reply || launched {
		t.Fatalf("an allowed write whose audit record failed: action %v, launched %v; want refused", d.Action, launched)
	}
	launched = false
	if d := recordingDecider(&recorded, &launched, nil).Decide(req, &policy.Policy{}, b, b, time.Now()); d.Action != proxy.Forward || !launched {
		t.Fatalf("an allowed write recorded: action %v, launched %v", d.Action, launched)
	}
}
