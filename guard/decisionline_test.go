package guard

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// gatewayEncoder is the JSON encoder of gateway.NewLoggerTo, whose lines
// the LineSink's must equal.
func gatewayEncoder() zapcore.Encoder {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	return zapcore.NewJSONEncoder(ec)
}

// TestLineAppenderIsZapsEncoding: a whole decision line made by the
// appender is the line zap's encoder makes of the same entry and fields,
// for strings that need escaping (quotes, backslashes, control bytes,
// invalid UTF-8, multi-byte runes), durations of every unit and sign, and
// times in and out of UTC, with and without nanoseconds.
func TestLineAppenderIsZapsEncoding(t *testing.T) {
	strs := []string{"", "plain", `a "quoted" name`, `back\slash`, "new\nline\r\ttab", "\x00\x01\x1f\x7f",
		"ünïcödé ✓ 日本 🙂", "bad \xff\xfe utf8 \xc3", "\u2028\u2029", "</script>&amp;", strings.Repeat("x\"", 40)}
	durs := []time.Duration{0, 1, 999, time.Microsecond, 1500, 999999, time.Millisecond, 1234567, 999999999,
		time.Second, 1500 * time.Millisecond, time.Minute, 61*time.Second + 5, time.Hour, 3*time.Hour + 2*time.Minute + 1,
		-1, -1500, -time.Hour, math.MaxInt64, math.MinInt64}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		durs = append(durs, time.Duration(rng.Int64N(int64(48*time.Hour)))>>rng.UintN(40))
	}
	times := []time.Time{time.Date(2026, 11, 27, 1, 2, 3, 456789000, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(2026, 6, 1, 0, 0, 0, 1, time.FixedZone("", 5*3600+30*60)), time.Now()}
	for _, name := range []string{"audit", "lockgate.audit", `odd "name"`, ""} {
		w := newLineWriter(&LineSink{Out: zapcore.AddSync(&bytes.Buffer{})}, name)
		for i, s := range strs {
			ts := times[i%len(times)]
			d := durs[i%len(durs)]
			want := encodeLine(t, name, ts, zap.String("ns", s), zap.String("user", "u"+s), zap.Duration("took", d))
			b := w.start(nil, ts, nil)
			b = appendField(b, "ns", s)
			b = appendField(b, "user", "u"+s)
			b = appendDurationField(b, "took", d)
			b = append(b, '}', '\n')
			if string(b) != want {
				t.Errorf("logger %q, %q, %v:\n got %s\nwant %s", name, s, d, b, want)
			}
		}
	}
	for _, d := range durs {
		if got, want := string(appendDuration(nil, d)), d.String(); got != want {
			t.Errorf("duration %d: got %q, want %q", int64(d), got, want)
		}
	}
}

// TestTimeCacheIsRFC3339Nano: a line's time appended from a connection's
// cache of its second is the text time.RFC3339Nano gives, for times in the
// same second and the next, in and out of UTC, with every count of
// trailing zeros in the fraction, before 1970 and past year 9999.
func TestTimeCacheIsRFC3339Nano(t *testing.T) {
	var c tsCache
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+30*60), time.FixedZone("", -7*3600), time.Local}
	base := []time.Time{time.Date(2026, 11, 27, 4, 36, 25, 0, time.UTC), time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 58, 0, time.UTC), time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, b0 := range base {
		for _, z := range zones {
			ts := b0.In(z)
			for i := range 200 {
				var step time.Duration
				switch i % 4 {
				case 0:
					step = time.Duration(rng.Int64N(int64(time.Second)))
				case 1:
					step = time.Duration(rng.Int64N(1000)) * time.Millisecond
				case 2:
					step = time.Duration(rng.Int64N(10)) * 100 * time.Nanosecond
				}
				ts = ts.Add(step)
				if got, want := string(c.append(nil, ts)), ts.Format(time.RFC3339Nano); got != want {
					t.Fatalf("%v: got %s, want %s", ts, got, want)
				}
			}
		}
	}
}

func encodeLine(t *testing.T, name string, ts time.Time, fields ...zap.Field) string {
	t.Helper()
	buf, err := gatewayEncoder().EncodeEntry(zapcore.Entry{Level: zapcore.InfoLevel, Time: ts, LoggerName: name, Message: "decision"}, fields)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	return buf.String()
}

// TestDecisionLinesThroughSinkAreZaps: the decision lines a guard writes
// through its LineSink are those a guard writes through the same logger
// with zap, for allowed and refused writes, from the connection's head and
// without it (the state busy), for a client whose application name needs
// escaping; only the time and took differ.
func TestDecisionLinesThroughSinkAreZaps(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}, {Match: "db.*", Mode: config.ModeAudit}}})
	if err != nil {
		t.Fatal(err)
	}
	run := func(sink bool) []string {
		var buf bytes.Buffer
		out := zapcore.Lock(zapcore.AddSync(&buf))
		logger := zap.New(zapcore.NewCore(gatewayEncoder(), out, zapcore.InfoLevel))
		opts := Options{Store: memstore.New(memstore.Config{}), Logger: logger, OwnerSecret: []byte("one secret for both")}
		var written int
		if sink {
			opts.DecisionSink = &LineSink{Out: zapcore.AddSync(writerFunc(func(p []byte) (int, error) { written++; return out.Write(p) })), Level: zapcore.InfoLevel}
		}
		g := New(opts)
		g.SetPolicy(pol)
		client := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
		c := &connTest{t: t, g: g, client: client, log: &buf}
		a, other := lsidOf(1), lsidOf(2)
		c.lockCmd(cmdAcquire, a, 7)
		buf.Reset()
		c.write(a, 7) // makes the head
		c.write(a, 7) // uses it
		st := connStateOf(&proxy.Request{Client: client})
		c.write(a, 7) // busy: field by field
		c.write(other, 7)
		st.mu.Unlock()
		c.write(other, 7) // refused, from a head
		c.write(a, 8)     // refused: not locked
		// A collection whose name needs escaping.
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
			Build()
		c.do(bsoncore.NewDocumentBuilder().AppendString("update", "we\"ird\\ \x01\t✓").AppendDocument("lsid", a).AppendString("$db", "db").Build(),
			wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
		if sink && written != 7 {
			t.Fatalf("%d lines went through the sink, want 7", written)
		}
		return strings.Split(strings.TrimSpace(buf.String()), "\n")
	}
	viaZap, viaSink := run(false), run(true)
	varying := regexp.MustCompile(`"(ts|took)":"[^"]*"|until [^)]*`)
	if len(viaZap) != 7 || len(viaSink) != len(viaZap) {
		t.Fatalf("%d lines through zap, %d through the sink:\n%s\n%s", len(viaZap), len(viaSink), strings.Join(viaZap, "\n"), strings.Join(viaSink, "\n"))
	}
	for i := range viaZap {
		z, s := varying.ReplaceAllString(viaZap[i], `_`), varying.ReplaceAllString(viaSink[i], `_`)
		if z != s {
			t.Errorf("line %d differs:\n zap  %s\n sink %s", i, z, s)
		}
		if !varying.MatchString(viaSink[i]) {
			t.Errorf("line %d has no time or took: %s", i, viaSink[i])
		}
	}
	if !strings.Contains(viaSink[5], `"reason":"not_locked"`) || !strings.Contains(viaSink[6], `"ns":"db.we\"ird\\ \u0001\t✓"`) {
		t.Fatalf("unexpected lines:\n%s", strings.Join(viaSink, "\n"))
	}
}

// TestDecisionLineWriteErrorIsReported: a decision line the sink cannot
// write is reported on the sink's ErrorOutput, with the writer's error, as
// zap reports its own failed writes; the write is decided all the same.
func TestDecisionLineWriteErrorIsReported(t *testing.T) {
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	var buf, errs bytes.Buffer
	logger := zap.New(zapcore.NewCore(gatewayEncoder(), zapcore.Lock(zapcore.AddSync(&buf)), zapcore.InfoLevel))
	failing := writerFunc(func([]byte) (int, error) { return 0, errDiskFull })
	g := New(Options{Store: memstore.New(memstore.Config{}), Logger: logger,
		DecisionSink: &LineSink{Out: zapcore.AddSync(failing), Level: zapcore.InfoLevel, ErrorOutput: zapcore.AddSync(&errs)}})
	g.SetPolicy(pol)
	c := &connTest{t: t, g: g, client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}, log: &buf}
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	for i := range 3 { // the first line, its head made, then the line again
		if !c.write(a, 7) {
			t.Fatalf("write %d refused", i)
		}
	}
	if n := strings.Count(errs.String(), "write error: "+errDiskFull.Error()+"\n"); n != 3 {
		t.Fatalf("%d write errors reported, want 3:\n%s", n, errs.String())
	}
}

var errDiskFull = errors.New("no space left on device")

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestIDFieldIsFormatsText: the line's id, appended without its text for
// the usual types, is docid.Format's text JSON-escaped, for strings that
// Go quotes with escapes (quotes, control bytes, invalid UTF-8, runes
// that are not printable, long ones), extreme integers and ObjectIds; a
// short string id costs no allocation.
func TestIDFieldIsFormatsText(t *testing.T) {
	vals := []any{int32(0), int32(-7), int32(math.MaxInt32), int32(math.MinInt32), int64(math.MaxInt64), int64(math.MinInt64),
		"", "plain", `a "quoted" \ name`, "new\nline\ttab\x00\x7f", "bad \xff\xfe utf8 \xc3", "ünïcödé ✓ 日本 🙂", "\u2028\u00a0\ufeff\U0010ffff",
		strings.Repeat("long é", 20), primitive.ObjectID{1, 2, 3, 0xff}, 1.5, true}
	for _, v := range vals {
		id := lockstoretest.ID(v)
		want := appendField(nil, "ids", docid.Format(id.Raw()))
		got, _, ok := appendIDField(nil, nil, "ids", id)
		switch id.Type() {
		case bson.TypeDouble, bson.TypeBoolean:
			if ok {
				t.Errorf("%v: appended a type it does not know", v)
			}
			continue
		}
		if !ok || string(got) != string(want) {
			t.Errorf("%#v: got %s, want %s", v, got, want)
		}
	}
	id := lockstoretest.ID("order-1234")
	buf, scratch := make([]byte, 0, 128), make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { appendIDField(buf[:0], scratch, "ids", id) }); n != 0 {
		t.Errorf("a short string id: %v allocations", n)
	}
}

// TestFractionIsTrimmedDigits: appendFraction writes frac as its n digits
// after a point, trailing zeros and the point for 0 left out, as the
// text strconv gives: every fraction of 3 and 6 digits (a duration's
// microseconds and milliseconds), and those of 9 digits (a time's
// nanoseconds, a duration's seconds) with every count of trailing zeros,
// each digit at its bounds, and random ones; after a prefix, into a
// buffer with and without room.
func TestFractionIsTrimmedDigits(t *testing.T) {
	if raceEnabled {
		// One goroutine over 1.1 million fractions: nothing for the
		// detector to check, and it ran about three times the CPU under it
		// (docs/TESTING.md, thirteenth round). go test ./... runs it
		// (testkit.OnlyRaceScaled picks it for reaching raceEnabled).
		t.Skip("no concurrency to check; runs without the race detector")
	}
	want := func(frac uint64, n int) string {
		if frac == 0 {
			return ""
		}
		s := strconv.FormatUint(frac, 10)
		s = strings.Repeat("0", n-len(s)) + s
		return "." + strings.TrimRight(s, "0")
	}
	check := func(frac uint64, n int) {
		t.Helper()
		bufs := [][]byte{nil, make([]byte, 0, 64), []byte("x:")}
		if frac%7 != 0 {
			bufs = bufs[:1]
		}
		for _, b := range bufs {
			prefix := string(b)
			if got := string(appendFraction(b, frac, n)); got != prefix+want(frac, n) {
				t.Fatalf("%d with %d digits after %q: got %q, want %q", frac, n, prefix, got, prefix+want(frac, n))
			}
		}
	}
	p10 := [10]uint64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}
	for n := 1; n <= 6; n++ {
		for f := range p10[n] {
			check(f, n)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 7; n <= 9; n++ {
		for z := range n + 1 {
			for range 2000 {
				check(rng.Uint64N(p10[n-z])*p10[z], n) // z trailing zeros at least
			}
		}
		for _, f := range []uint64{1, 9, p10[n] - 1, p10[n-1], 9 * p10[n-1], p10[n] / 2, 123456789 % p10[n]} {
			check(f, n)
		}
	}
	for range 100000 {
		check(rng.Uint64N(1e9), 9)
	}
}

// TestMicrosIsDurationString: a took between a microsecond and a
// millisecond (appendMicros, the usual decision's) is the text
// time.Duration.String gives, for every such duration, after a prefix,
// into a buffer with and without room.
func TestMicrosIsDurationString(t *testing.T) {
	room := make([]byte, 0, 64)
	for u := time.Duration(time.Microsecond); u < time.Millisecond; u++ {
		want := u.String()
		if got := appendDuration(room[:0], u); string(got) != want {
			t.Fatalf("%d: got %q, want %q", int64(u), got, want)
		}
		if u%97 == 0 {
			if got := appendDuration([]byte("x:"), u); string(got) != "x:"+want {
				t.Fatalf("%d after a prefix, no room: got %q, want %q", int64(u), got, "x:"+want)
			}
		}
	}
}
