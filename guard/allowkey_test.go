package guard

import (
	"bytes"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// TestAllowedLineAgainIsFreshLine: the decision line of an allowed write
// that a connection makes from its latest allowed line's text
// (allowLine.again, keyed by the line's fields) is the line made without
// any memo (appendLine without the connection's state), along a run of
// lines that changes one field of the key at a time, to a value of the
// same length, and back: the client, the app, the user, the session, the
// namespace, the command, the mode, the policy, the logger (another
// guard's sink on the same connection), a refused line's in between,
// the time's zone after a refused line's, and an lsid that is not 16
// bytes. A key that missed any of
// them would give the line of the field before.
func TestAllowedLineAgainIsFreshLine(t *testing.T) {
	compile := func(match string) *policy.Policy {
		p, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: match, Mode: config.ModeEnforce}}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	polA, polB := compile("db.*"), compile("db.?")
	var out bytes.Buffer
	guardOf := func(name string) *Guard {
		return New(Options{Store: memstore.New(memstore.Config{}), Logger: zap.NewNop().Named(name),
			DecisionSink: &LineSink{Out: zapcore.AddSync(&out)}})
	}
	gA, gB := guardOf("a"), guardOf("b")
	if gA.lines == nil || gB.lines == nil {
		t.Fatal("no line writer")
	}
	clientOf := func(addr, app, user string) *proxy.ClientInfo {
		c := &proxy.ClientInfo{ID: 1, Addr: addr}
		guardtest.SetIdentity(t, c, app, user)
		return c
	}
	type line struct {
		g       *Guard
		client  *proxy.ClientInfo
		lsid    []byte
		ns      string
		command string
		mode    policy.Mode
		pol     *policy.Policy
		at      time.Time
		refused bool
	}
	base := line{gA, clientOf("127.0.0.1:5000", "app-1", "u1@admin"), bytes.Repeat([]byte{1}, 16), "db.a", "update", policy.Enforce, polA,
		time.Date(2026, 11, 28, 5, 0, 0, 123456789, time.UTC), false}
	other := []func(l *line){
		func(l *line) {},
		func(l *line) { l.client = clientOf("127.0.0.1:5001", "app-1", "u1@admin") },
		func(l *line) { l.client = clientOf("127.0.0.1:5000", "app-2", "u1@admin") },
		func(l *line) { l.client = clientOf("127.0.0.1:5000", "app-1", "u2@admin") },
		func(l *line) { l.lsid = bytes.Repeat([]byte{2}, 16) },
		func(l *line) { l.ns = "db.b" },
		func(l *line) { l.command = "delete" },
		func(l *line) { l.mode = policy.Audit },
		func(l *line) { l.pol = polB },
		func(l *line) { l.g = gB },
		// A refused line in the same second and zone, made in the
		// connection's line buffer over the allowed line the next one
		// would otherwise find there (lineHeld).
		func(l *line) { l.refused = true },
		func(l *line) { l.at = l.at.In(time.FixedZone("", 5*3600)); l.refused = true },
		func(l *line) { l.at = l.at.In(time.FixedZone("", 5*3600)) },
		func(l *line) { l.at = l.at.In(time.FixedZone("", 4*3600)) },
		func(l *line) { l.lsid = []byte("fifteen bytes!!") },
		func(l *line) { l.lsid = nil },
	}
	st := &connState{}
	write := func(l line, withState bool) string {
		t.Helper()
		req := &proxy.Request{Client: l.client, Command: &wire.Command{Name: l.command}}
		v := &verdict{}
		v.LSID = l.lsid
		w := &policy.Write{NS: namespace.Of(l.ns)}
		r := &policy.Rule{Match: "db.*", Mode: l.mode}
		var x *enforce.Violation
		decision := enforce.DecisionAllow
		if l.refused {
			x, decision = &enforce.Violation{Rule: *r, Write: *w, Reason: enforce.ReasonNotLocked, Detail: "no"}, enforce.DecisionReject
		}
		var s *connState
		if withState {
			s = st
		}
		out.Reset()
		l.g.appendLine(s, req, l.pol, v, w, r, x, decision, 1500*time.Nanosecond, l.at)
		return out.String()
	}
	step := 0
	for i, change := range other {
		for _, back := range []bool{false, true} {
			l := base
			l.at = l.at.Add(time.Duration(step) * time.Microsecond) // the same second
			step++
			if !back {
				change(&l)
			}
			got, want := write(l, true), write(l, false)
			if got != want || want == "" {
				t.Fatalf("change %d (back %v):\n got %s\nwant %s", i, back, got, want)
			}
		}
	}
	if !st.memo().allow.keyed {
		t.Fatal("the memo was never keyed: the test tested no memo")
	}
}

// TestAllowedLineOfSharedSessionMemo: a session's memos, and with them its
// latest allowed line's text (memos.allow), go with its writes from one
// connection to another (a driver's pool), while the time's text is each
// connection's own (tsCache). Two connections of the same client, one in
// another zone, take turns writing allowed lines of one session: each
// line is the line made without any memo. A memo that did not tell the
// connections apart would give one connection's zone on the other's line.
func TestAllowedLineOfSharedSessionMemo(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.*", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	g := New(Options{Store: memstore.New(memstore.Config{}), Logger: zap.NewNop(), DecisionSink: &LineSink{Out: zapcore.AddSync(&out)}})
	client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	guardtest.SetIdentity(t, client, "app-1", "u1@admin")
	shared := &sessionMemo{}
	conns := []*connState{{sess: shared}, {sess: shared}}
	at := time.Date(2026, 11, 28, 5, 0, 0, 123456789, time.UTC)
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600)}
	write := func(st *connState, now time.Time) string {
		t.Helper()
		req := &proxy.Request{Client: client, Command: &wire.Command{Name: "update"}}
		v := &verdict{}
		v.LSID = bytes.Repeat([]byte{1}, 16)
		w := &policy.Write{NS: namespace.Of("db.a")}
		r := &policy.Rule{Match: "db.*", Mode: policy.Enforce}
		out.Reset()
		g.appendLine(st, req, pol, v, w, r, nil, enforce.DecisionAllow, 1500*time.Nanosecond, now)
		return out.String()
	}
	for i := range 6 {
		c := i % 2
		now := at.Add(time.Duration(i) * time.Microsecond).In(zones[c])
		got, want := write(conns[c], now), write(nil, now)
		if got != want || want == "" {
			t.Fatalf("write %d on connection %d:\n got %s\nwant %s", i, c, got, want)
		}
	}
	if !shared.allow.keyed {
		t.Fatal("the session's memo was never keyed: the test tested no memo")
	}
}
