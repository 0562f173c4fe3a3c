package guard

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// TestAllowedLineMemoIsZapsLine: an allowed write's decision line made
// from a connection's memo (allowLine, tsCache) is, byte for byte, the
// line zap's encoder writes for the same entry and fields, along a run of
// lines that changes one thing at a time: the time within its second and
// across seconds, fractions ending in every count of zeros and none, the
// time's zone (to an offset of the same length, and of another), the
// line's head (to another of the same length, and back; to another
// session's on the same connection, and back), the policy (its
// version the same length), the logger's name, and a year the cache does
// not hold.
func TestAllowedLineMemoIsZapsLine(t *testing.T) {
	compile := func(match string) *policy.Policy {
		p, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: match, Mode: config.ModeEnforce}}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	polA, polB := compile("db.a"), compile("db.b")
	if len(polA.Version()) != len(polB.Version()) || polA.Version() == polB.Version() {
		t.Fatalf("versions %q and %q: want two of one length", polA.Version(), polB.Version())
	}
	type head struct{ app, user, ns string }
	headA, headB := head{"app-a", "u1", "db.a"}, head{"app-b", "u2", "db.b"} // one length
	headC := head{"app-a", "u3", "db.c"}                                     // headA's connection, another session
	writerA := newLineWriter(&LineSink{Out: zapcore.AddSync(&bytes.Buffer{})}, "audit")
	writerB := newLineWriter(&LineSink{Out: zapcore.AddSync(&bytes.Buffer{})}, "lockgate.audit")
	plus5, plus4, minus7 := time.FixedZone("", 5*3600+30*60), time.FixedZone("", 4*3600), time.FixedZone("", -7*3600)
	sec := time.Date(2026, 11, 28, 0, 0, 59, 0, time.UTC)
	lsid := []byte("0123456789abcdef")
	steps := []struct {
		at   time.Time
		h    head
		pol  *policy.Policy
		w    *lineWriter
		took time.Duration
		// refused: the line of a refused write, which loads the time
		// without the memo.
		refused bool
	}{
		{sec.Add(123456789), headA, polA, writerA, 2345, false},
		{sec.Add(123456790), headA, polA, writerA, 1500, false},    // same second, fraction ends in a zero
		{sec.Add(500000000), headA, polA, writerA, 999, false},     // eight zeros
		{sec, headA, polA, writerA, 1000, false},                   // no fraction at all
		{sec.Add(time.Second), headA, polA, writerA, 0, false},     // the next second, the next minute
		{sec.Add(time.Second + 1), headA, polA, writerA, 1, false}, // and its first nanosecond
		{sec.Add(time.Second + 100).In(plus5), headA, polA, writerA, 7 * time.Millisecond, false},
		{sec.Add(time.Second + 200).In(plus4), headA, polA, writerA, 7, false}, // another offset, the same length
		{sec.Add(time.Second + 300), headA, polA, writerA, 7, false},           // back to Z in the same second
		{sec.Add(time.Second + 400).In(minus7), headA, polA, writerA, 7, false},
		{sec.Add(time.Second + 500).In(minus7), headB, polA, writerA, 7, false}, // another head, the same length
		{sec.Add(time.Second + 600).In(minus7), headA, polA, writerA, 7, false}, // and back
		{sec.Add(time.Second + 610).In(minus7), headC, polA, writerA, 7, false}, // another session on the connection
		{sec.Add(time.Second + 620).In(minus7), headA, polA, writerA, 7, false}, // and back
		{sec.Add(time.Second + 700).In(minus7), headA, polB, writerA, 7, false}, // another policy
		{sec.Add(time.Second + 800).In(minus7), headA, polB, writerB, 7, false}, // another logger's sink
		// A refused write's line loads the next second in another
		// zone; the allowed one after it, in that second and zone,
		// must not keep the zone of the memo's.
		{sec.Add(2*time.Second + 1).In(plus5), headA, polB, writerB, 7, true},
		{sec.Add(2*time.Second + 2).In(plus5), headA, polB, writerB, 7, false},
		{sec.Add(2*time.Second + 3).In(plus4), headA, polB, writerB, 7, true},
		{sec.Add(2*time.Second + 4).In(plus4), headA, polB, writerB, 7, false},
		{time.Date(10001, 1, 1, 0, 0, 0, 5, time.UTC), headA, polB, writerB, 7, false}, // not cached
		{time.Date(2026, 1, 1, 0, 0, 0, 50, time.UTC), headA, polB, writerB, 90 * time.Minute, false},
		{time.Date(2026, 1, 1, 0, 0, 0, 60, time.UTC), headA, polB, writerB, 3 * time.Second, false},
	}
	// One head slice per head, as the connection keeps it (lineHead).
	// The connection's part and the session's, each made once, as
	// lineHead and memos.tail keep them; one version field per policy,
	// as versionField keeps it.
	heads := map[head][2][]byte{}
	conns := map[string][]byte{}
	for _, h := range []head{headA, headB, headC} {
		if conns[h.app] == nil {
			conns[h.app] = appendConnHead(nil, "127.0.0.1:5000", h.app)
		}
		heads[h] = [2][]byte{conns[h.app], appendLineTail(nil, h.user, lsid, h.ns, "update", "enforce")}
	}
	versions := map[*policy.Policy][]byte{}
	for _, p := range []*policy.Policy{polA, polB} {
		versions[p] = appendJSONString([]byte(`,"policyVersion":`), p.Version())
	}
	var (
		ts    tsCache
		memo  allowLine
		line  []byte
		held  lineHeld
		ok    bool
		names = map[*lineWriter]string{writerA: "audit", writerB: "lockgate.audit"}
	)
	for i, s := range steps {
		version := versions[s.pol]
		decision := "allow"
		if s.refused {
			decision, ok = "reject", false
		} else {
			line, ok = memo.startAllowed(s.w, line, s.at, &ts, heads[s.h][0], heads[s.h][1], s.pol, version, &held)
		}
		if !ok {
			held = lineHeld{} // as appendLine: the buffer holds another line
			if !s.refused && s.at.Year() < 10000 {
				t.Fatalf("step %d: a time of year %d not cached", i, s.at.Year())
			}
			line = append(append(s.w.start(line, s.at, &ts), heads[s.h][0]...), heads[s.h][1]...)
			line = append(appendField(line, "decision", decision), version...)
			line = append(line, `,"took":"`...)
		}
		line = append(appendDuration(line, s.took), '"')
		line = append(line, '}', '\n')
		want := encodeLine(t, names[s.w], s.at,
			zap.String("client", "127.0.0.1:5000"), zap.String("app", s.h.app), zap.String("user", s.h.user),
			zap.String("session", lockstore.SessionPrefix(lsid)), zap.String("ns", s.h.ns), zap.String("command", "update"),
			zap.String("mode", "enforce"), zap.String("decision", decision), zap.String("policyVersion", s.pol.Version()),
			zap.Duration("took", s.took))
		if string(line) != want {
			t.Errorf("step %d (%v):\n got %s\nwant %s", i, s.at, line, want)
		}
	}
}

// TestAllowedLineMemoKnowsItsTimeCache: a memo made with one time cache
// is not taken for another's second, though both loaded as many seconds:
// their zones differ.
func TestAllowedLineMemoKnowsItsTimeCache(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff})
	if err != nil {
		t.Fatal(err)
	}
	w := newLineWriter(&LineSink{Out: zapcore.AddSync(&bytes.Buffer{})}, "audit")
	head, tail := appendConnHead(nil, "c", "a"), appendLineTail(nil, "u", nil, "db.c", "update", "enforce")
	version := appendJSONString([]byte(`,"policyVersion":`), pol.Version())
	at := time.Date(2026, 11, 28, 0, 0, 0, 5, time.UTC)
	var memo allowLine
	var utc, plus5 tsCache
	for _, c := range []struct {
		ts   *tsCache
		at   time.Time
		zone string
	}{{&utc, at, `Z","logger"`}, {&plus5, at.In(time.FixedZone("", 5*3600)), `+05:00","logger"`}} {
		line, ok := memo.startAllowed(w, nil, c.at, c.ts, head, tail, pol, version, &lineHeld{})
		if !ok || !bytes.Contains(line, []byte(c.zone)) {
			t.Errorf("%v: %s, want its zone %s", c.at, line, c.zone)
		}
	}
}

// TestAllowKeySame: the memo of the latest allowed line's text is used
// again only for a key equal in every field (allowKey.same, which skips
// the byte comparison of strings at one address). A key that differs in
// any one field, by a string of the same length at another address or by
// the session id, is another line; the same bytes at another address are
// the same line. Every field is taken from the type, so a field added
// to allowKey and left out of same fails here.
func TestAllowKeySame(t *testing.T) {
	base := allowKey{client: "127.0.0.1:5000", app: "app", user: "user", lsid: [16]byte{1},
		ns: "db.locked", command: "update", mode: "enforce"}
	fields := reflect.TypeOf(base)
	for i := range fields.NumField() {
		name := fields.Field(i).Name
		other, copied := base, base
		f, c := reflect.ValueOf(&other).Elem().Field(i), reflect.ValueOf(&copied).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			s := settable(f).String()
			// Same length, other bytes, another address.
			settable(f).SetString(strings.Repeat("z", len(s)))
			// The same bytes, another address.
			settable(c).SetString(string([]byte(s)))
			if unsafe.StringData(settable(c).String()) == unsafe.StringData(s) {
				t.Fatalf("%s: the copy shares the bytes", name)
			}
		case reflect.Array:
			settable(f).Index(0).SetUint(2)
		default:
			t.Fatalf("allowKey.%s: a %s; teach the test", name, f.Kind())
		}
		if base.same(&other) || other.same(&base) {
			t.Errorf("keys that differ in %s are the same", name)
		}
		if !base.same(&copied) || !copied.same(&base) {
			t.Errorf("keys equal but for the address of %s differ", name)
		}
		if base.same(&other) != (base == other) || base.same(&copied) != (base == copied) {
			t.Errorf("%s: same disagrees with ==", name)
		}
		// is, which compares the key to a line's fields where they
		// are, agrees with same on the key they make.
		for _, o := range []*allowKey{&other, &copied} {
			c := &proxy.ClientInfo{Addr: o.client}
			guardtest.SetIdentity(t, c, o.app, o.user)
			w, r := policy.Write{NS: namespace.Of(o.ns)}, policy.Rule{Mode: policy.Mode(o.mode)}
			made := allowKeyOf(c, o.lsid[:], &w, o.command, &r)
			if got := base.is(c, o.lsid[:], &w, o.command, &r); got != base.same(&made) || got != (base == *o) {
				t.Errorf("%s: is says %v of a key same says %v of", name, got, base.same(&made))
			}
			if !made.is(c, o.lsid[:], &w, o.command, &r) {
				t.Errorf("%s: is tells a key from the fields it was made of", name)
			}
		}
	}
}
