package guard

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap/zapcore"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// LineSink is where the guard writes its decision lines itself instead of
// through its logger: one JSON line per decision on a protected
// namespace, byte for byte the line the production logger
// (gateway.NewLoggerTo, format json) writes for the same fields, without
// a zap entry, field slice or encoder per write. The gateway injects it
// only for a logger whose every line has that layout (no fields of its
// own); without one the guard writes the lines through Options.Logger.
type LineSink struct {
	// Out takes each line in one Write and does not keep the bytes; its
	// writes are serialized with the logger's (the logger's own
	// WriteSyncer, zapcore.Lock'ed).
	Out zapcore.WriteSyncer
	// Level enables the lines, which are written at info.
	Level zapcore.LevelEnabler
	// ErrorOutput, if set, is told of a write that failed, as zap tells
	// its logger's.
	ErrorOutput zapcore.WriteSyncer
}

// lineWriter writes decision lines to a LineSink.
type lineWriter struct {
	sink *LineSink
	// on: the sink's level enables info (fixed for the sink's life).
	on bool
	// head and tail surround the line's time: everything before the
	// line's first field is the same on every line but the time.
	head, tail []byte
	// bufs are line buffers for writes without their connection's own
	// (its state busy, or no connection).
	bufs sync.Pool
}

func newLineWriter(s *LineSink, loggerName string) *lineWriter {
	if s == nil || s.Out == nil {
		return nil
	}
	w := &lineWriter{sink: s, on: s.Level == nil || s.Level.Enabled(zapcore.InfoLevel)}
	w.head = []byte(lineOpen)
	w.tail = append(w.tail, '"')
	if loggerName != "" {
		w.tail = appendField(w.tail, "logger", loggerName)
	}
	w.tail = appendField(w.tail, "msg", "decision")
	w.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	return w
}

// lineOpen is every line's text before its time.
const lineOpen = `{"level":"info","ts":"`

// start begins a line at t into b[:0]: everything up to its first field.
// ts, when set, is the caller's own cache of t's second as text.
func (w *lineWriter) start(b []byte, t time.Time, ts *tsCache) []byte {
	b = append(b[:0], w.head...)
	b = ts.append(b, t)
	return append(b, w.tail...)
}

// tsCache keeps the text of one second of time.RFC3339Nano, so that a
// line in the same second as the one before appends its fraction alone:
// most of the time's formatting is the date, which changes once a second.
type tsCache struct {
	sec int64
	loc *time.Location
	// open is lineOpen and the second's "2006-01-02T15:04:05": a line
	// up to its time's fraction.
	open []byte
	zone []byte // "Z", "+05:30"
	// gen counts the seconds loaded: a memo of the zone made at one
	// gen holds until the next.
	gen uint64
}

// load makes c hold t's second; false when t's text is not cached (a
// year of other than four digits).
func (c *tsCache) load(t time.Time) bool {
	sec, loc := t.Unix(), t.Location()
	if c.open != nil && sec == c.sec && loc == c.loc {
		return true
	}
	// The whole second, without a fraction: its date and time, then
	// its zone.
	whole := time.Unix(sec, 0).In(loc).AppendFormat([]byte(lineOpen), time.RFC3339Nano)
	if n := len(lineOpen); len(whole) < n+20 || (whole[n+19] != 'Z' && whole[n+19] != '+' && whole[n+19] != '-') || whole[n+4] != '-' {
		c.open = nil
		return false
	}
	c.sec, c.loc, c.open, c.zone = sec, loc, whole[:len(lineOpen)+19], whole[len(lineOpen)+19:]
	c.gen++
	return true
}

// append appends t as t.AppendFormat(b, time.RFC3339Nano) does.
func (c *tsCache) append(b []byte, t time.Time) []byte {
	if c == nil || !c.load(t) {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	b = append(b, c.open[len(lineOpen):]...)
	return append(appendNanos(b, t.Nanosecond()), c.zone...)
}

// appendNanos appends the fraction of a second RFC3339Nano gives ns: a
// point and up to nine digits without trailing zeros, nothing for 0.
func appendNanos(b []byte, ns int) []byte {
	return appendFraction(b, uint64(ns), 9)
}

// allowLine is a connection's memo of the text its allowed writes'
// decision lines hold between their time's fraction and their took's
// value: the time's zone, the logger's name and the message, the line
// head (the connection's part and the session's), the decision and the
// policy's version. Only the time's fraction, took and the ids vary from
// one such line to the next in a session, so a line is three copies and
// those (startAllowed); a connection that writes for another session
// next makes the text again.
type allowLine struct {
	// What again reads, in the order it does, before what only
	// startAllowed does (head, tail, version): three cache lines, not
	// five (TestMemosHotLines).
	w   *lineWriter
	pol *policy.Policy
	// ts and gen are the second whose zone the text begins with: the
	// text is made again once a second, rather than its zone compared
	// on every line.
	ts  *tsCache
	gen uint64
	// textGen counts the times text was made: a line buffer that holds
	// the text of one generation holds it for as long as it lasts
	// (lineHeld).
	textGen uint64
	// key, when keyed, are the fields the text's head and tail were made
	// of (again).
	keyed bool
	key   allowKey
	text  []byte
	// head, tail and version are the slices the text was made from,
	// kept so that their addresses stay their own: none is ever
	// modified, a new one is a new slice.
	head, tail, version []byte
}

// lineHeld is what a connection's line buffer (connState.line) still
// holds of the last line written from it, when that line was an allowed
// one made from a memo's text (allowLine.fill): ts's second at gen, a
// fraction of frac bytes, then a's text of generation text, up to end.
// The next such line of the same memo in the same second has the same
// bytes there, and only its fraction is written again when it has as
// many digits: the second's text and the memo's text (about 290 bytes
// together, two copies and 85 instructions a line) are where they were,
// and the memo's text is not read at all. A line made any other way
// into the buffer forgets it (zero).
type lineHeld struct {
	a    *allowLine
	text uint64
	ts   *tsCache
	gen  uint64
	frac int
	end  int
}

// allowKey is what an allowed line's head and tail are made of
// (appendLineHead): the connection's client and app, the writer's user,
// session, namespace, command and mode. An lsid of 16 bytes (a driver's
// UUID) alone: the memo keeps it by value.
type allowKey struct {
	client, app, user string
	lsid              [16]byte
	ns, command, mode string
}

// same reports whether k and o are equal (k == o). Their strings are
// the same bytes as a rule (the connection's client, app and user, the
// interned namespace and command, the rule's mode), which the first
// test tells by their addresses and lengths alone; only keys that differ
// there are compared by ==, which calls the runtime's memequal for each
// of the six strings (about 130 instructions a line, where the first
// test takes about 40).
func (k *allowKey) same(o *allowKey) bool {
	if k.lsid != o.lsid {
		return false
	}
	if sameBytes(k.client, o.client) && sameBytes(k.app, o.app) && sameBytes(k.user, o.user) &&
		sameBytes(k.ns, o.ns) && sameBytes(k.command, o.command) && sameBytes(k.mode, o.mode) {
		return true
	}
	return *k == *o
}

// is reports whether k is the key of the line of c's write of w, under
// r, by command, in the session lsid: k.same(&o) for o the key made of
// them, but without o made first, which cost about 60 instructions a
// line (six strings and the lsid copied out, then read back). Only when
// an address differs is the key made, and compared by ==.
func (k *allowKey) is(c *proxy.ClientInfo, lsid []byte, w *policy.Write, command string, r *policy.Rule) bool {
	if len(lsid) != len(k.lsid) || k.lsid != [16]byte(lsid) {
		return false
	}
	if sameBytes(k.client, c.Addr) && sameBytes(k.ns, w.NS.String()) && sameBytes(k.command, command) &&
		sameBytes(k.mode, string(r.Mode)) && sameBytes(k.app, c.AppName()) && sameBytes(k.user, c.User()) {
		return true
	}
	return k.isMade(c, lsid, w, command, r)
}

// isMade is is for keys whose strings are at other addresses: the key
// made, then compared by ==. Apart, so that is's frame holds no key.
//
//go:noinline
func (k *allowKey) isMade(c *proxy.ClientInfo, lsid []byte, w *policy.Write, command string, r *policy.Rule) bool {
	return *k == allowKeyOf(c, lsid, w, command, r)
}

// allowKeyOf is the key of the line of c's write of w, under r, by
// command, in the session lsid, which is 16 bytes.
func allowKeyOf(c *proxy.ClientInfo, lsid []byte, w *policy.Write, command string, r *policy.Rule) allowKey {
	return allowKey{client: c.Addr, app: c.AppName(), user: c.User(), lsid: [16]byte(lsid),
		ns: w.NS.String(), command: command, mode: string(r.Mode)}
}

// sameBytes reports whether a and b are the same bytes in memory: then
// they are equal; if not, they may be equal still.
func sameBytes(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

// again is startAllowed for a line whose fields (pol, w, and the key,
// which the caller found the same: a.keyed and allowKey.is) are those
// the memo's text was made for last: the text is used as it is, without
// the connection's head and the writer's tail looked up (lineHead) nor
// the version field, which a connection's allowed writes in one session
// need again every time. false: make the line with startAllowed (remember
// then).
//
// b is the connection's line buffer, and h what it holds (lineHeld).
func (a *allowLine) again(w *lineWriter, b []byte, t time.Time, ts *tsCache, pol *policy.Policy, h *lineHeld) (_ []byte, ok bool) {
	if !ts.load(t) || a.gen != ts.gen || a.ts != ts || a.w != w || a.pol != pol {
		return b, false
	}
	return a.fill(b, t, ts, h), true
}

// fill makes in b[:0] the line of a's text at t, which ts holds the
// second of: what b holds already of it (h) is left in place, and h
// then says what b holds.
func (a *allowLine) fill(b []byte, t time.Time, ts *tsCache, h *lineHeld) []byte {
	n := len(ts.open)
	if h.a == a && h.text == a.textGen && h.ts == ts && h.gen == ts.gen && h.end <= cap(b) && n+10 <= cap(b) {
		// b[:n] is ts.open and b[n+h.frac:h.end] a's text; with room
		// for the fraction in place, b stays the same array. The
		// fraction is written as all its ten bytes, then cut to its
		// digits without trailing zeros (appendFraction): the text is
		// left whole only after a fraction of ten bytes, or none.
		b = appendNanos(b[:n], t.Nanosecond())
		if f := len(b) - n; f == h.frac && (f == 10 || f == 0) {
			return b[:h.end]
		}
	} else {
		b = appendNanos(append(b[:0], ts.open...), t.Nanosecond())
	}
	frac := len(b) - n
	b = append(b, a.text...)
	*h = lineHeld{a: a, text: a.textGen, ts: ts, gen: ts.gen, frac: frac, end: len(b)}
	return b
}

// remember records that the memo's text, just made or found by
// startAllowed, is that of k's fields (again); ok false forgets them.
func (a *allowLine) remember(k *allowKey, ok bool) {
	a.keyed = ok
	if ok {
		a.key = *k
	}
}

// startAllowed begins an allowed write's line at t into b[:0], up to and
// with the opening quote of took's value: what w.start, head, tail,
// ,"decision":"allow", version and ,"took":" append. version is pol's
// policyVersion field. ok is false when t's text is not cached (ts.load),
// b then untouched. b and h as for again.
func (a *allowLine) startAllowed(w *lineWriter, b []byte, t time.Time, ts *tsCache, head, tail []byte, pol *policy.Policy, version []byte, h *lineHeld) (_ []byte, ok bool) {
	if !ts.load(t) {
		return b, false
	}
	if a.gen != ts.gen || a.ts != ts || a.w != w || a.pol != pol || !same(a.head, head) || !same(a.tail, tail) || !same(a.version, version) {
		a.w, a.pol, a.head, a.tail, a.version, a.ts, a.gen = w, pol, head, tail, version, ts, ts.gen
		a.text = append(append(a.text[:0], ts.zone...), w.tail...)
		a.text = append(append(append(a.text, head...), tail...), `,"decision":"allow"`...)
		a.text = append(append(a.text, version...), `,"took":"`...)
		a.textGen++
	}
	return a.fill(b, t, ts, h), true
}

// same reports whether a and b are the same non-empty slice.
func same(a, b []byte) bool { return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0] }

// digitPairs are 00 to 99, two bytes each.
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// write ends the line in b and writes it. It returns b emptied for the
// next line, or nil when b grew past what is worth keeping (a refusal
// listing many ids).
func (w *lineWriter) write(b []byte, t time.Time) []byte {
	b = append(b, '}', '\n')
	if _, err := w.sink.Out.Write(b); err != nil && w.sink.ErrorOutput != nil {
		w.failed(t, err)
	}
	if cap(b) > maxKeptLine {
		return nil
	}
	return b[:0]
}

// failed reports a line's failed write to the sink's error output, as
// zap's own writes do. Apart and not inlined: Fprintf's call, inlined,
// spread every line's write over more cache lines.
//
//go:noinline
func (w *lineWriter) failed(t time.Time, err error) {
	fmt.Fprintf(w.sink.ErrorOutput, "%v write error: %v\n", t, err)
	w.sink.ErrorOutput.Sync()
}

// maxKeptLine bounds the line buffer a connection keeps.
const maxKeptLine = 4 << 10

// appendField appends ,"key":"value", the value escaped as zap's JSON
// encoder escapes it (every field follows the line's message).
func appendField(b []byte, key, value string) []byte {
	b = append(b, ',')
	b = appendJSONString(b, key)
	b = append(b, ':')
	return appendJSONString(b, value)
}

// appendDurationField appends ,"key":"d" with d as time.Duration.String
// writes it (the gateway logs durations as strings).
func appendDurationField(b []byte, key string, d time.Duration) []byte {
	b = append(b, ',')
	b = appendJSONString(b, key)
	b = append(b, ':', '"')
	b = appendDuration(b, d)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted: quote and backslash escaped, \n \r
// \t as such, other control bytes as \u00XX, each byte of invalid UTF-8
// as \ufffd, everything else as it is. This is zap's JSON string
// encoding, which the decision line must keep (a test compares them).
func appendJSONString(b []byte, s string) []byte {
	return appendJSON(b, s, utf8.DecodeRuneInString)
}

// appendJSON is appendJSONString for text held as a string or as bytes
// (decode reads a rune of either), so that neither is copied to the other.
func appendJSON[S string | []byte](b []byte, s S, decode func(S) (rune, int)) []byte {
	b = append(b, '"')
	last := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := decode(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[last:i]...)
			b = append(b, `\ufffd`...)
			i++
			last = i
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		b = append(b, s[last:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		last = i
	}
	b = append(b, s[last:]...)
	return append(b, '"')
}

// appendIDField appends ,"key":"<id>" with the id as docid.Format
// writes it, for the usual types of an _id (32- and 64-bit integers,
// strings, ObjectIds) without making the text as a string (it is made in
// scratch, returned for reuse); false for any other type, whose text the
// caller makes.
func appendIDField(b, scratch []byte, key string, id docid.ID) (_, _ []byte, ok bool) {
	tmp := scratch[:0]
	var t []byte
	raw := id.Raw()
	switch raw.Type {
	case bson.TypeInt32:
		n, ok := raw.Int32OK()
		if !ok {
			return b, scratch, false
		}
		t = strconv.AppendInt(tmp, int64(n), 10)
	case bson.TypeInt64:
		n, ok := raw.Int64OK()
		if !ok {
			return b, scratch, false
		}
		t = strconv.AppendInt(tmp, n, 10)
	case bson.TypeString:
		// Read in place: a string value is its length (with the NUL),
		// its bytes and a NUL.
		v := raw.Value
		if len(v) < 5 {
			return b, scratch, false
		}
		n := int(binary.LittleEndian.Uint32(v))
		if n < 1 || n != len(v)-4 || v[len(v)-1] != 0 {
			return b, scratch, false
		}
		// The conversion does not escape: a short id is copied on
		// the stack, not the heap.
		t = strconv.AppendQuote(tmp, string(v[4:len(v)-1]))
	case bson.TypeObjectID:
		oid, ok := raw.ObjectIDOK()
		if !ok {
			return b, scratch, false
		}
		t = append(tmp, `ObjectId("`...)
		t = hex.AppendEncode(t, oid[:])
		t = append(t, `")`...)
	default:
		return b, scratch, false
	}
	b = append(b, ',')
	b = appendJSONString(b, key)
	b = append(b, ':')
	return appendJSON(b, t, utf8.DecodeRune), t, true
}

// appendDuration appends d as d.String() reads, without its allocation:
// whole hours, minutes and seconds with the seconds' fraction
// ("1h2m3.5s"), or below a second one unit, ns, µs or ms, with the
// fraction of the next ("1.5ms"); no trailing zeros, "0s" for zero. Each
// unit's branch divides by constants, which compile to multiplications:
// a division by a unit held in a variable costs tens of cycles, and a
// line's took took several.
func appendDuration(b []byte, d time.Duration) []byte {
	if d == 0 {
		return append(b, '0', 's')
	}
	u := uint64(d)
	if d < 0 {
		b = append(b, '-')
		u = -u // the magnitude, math.MinInt64 included
	}
	switch {
	case u < 1e3:
		return append(appendUint(b, u), 'n', 's')
	case u < 1e6:
		return appendMicros(b, u)
	case u < 1e9:
		return append(appendFraction(appendUint(b, u/1e6), u%1e6, 6), 'm', 's')
	}
	secs := u / 1e9
	if h := secs / 3600; h > 0 {
		b = append(appendUint(b, h), 'h')
		b = append(appendUint(b, secs/60%60), 'm')
	} else if m := secs / 60; m > 0 {
		b = append(appendUint(b, m), 'm')
	}
	return append(appendFraction(appendUint(b, secs%60), u%1e9, 9), 's')
}

// appendMicros appends u nanoseconds, at least 1µs and under 1ms, as
// d.String() reads: the whole microseconds, then up to three digits of
// their fraction without trailing zeros, then "µs". A decision's took
// is nearly always in this range; written into one window of the
// buffer with one room check, it costs about a third of appendUint and
// appendFraction in turn (about 140 instructions a line).
func appendMicros(b []byte, u uint64) []byte {
	l := len(b)
	if cap(b)-l < 10 {
		b = slices.Grow(b, 10)
	}
	d := (*[10]byte)(b[l : l+10]) // "999.999µs", the longest, is 10 bytes
	q, r := u/1e3, u%1e3
	n := 0
	switch {
	case q < 10:
		d[0] = byte('0' + q)
		n = 1
	case q < 100:
		d[0], d[1] = digitPairs[2*q], digitPairs[2*q+1]
		n = 2
	default:
		t := q % 100
		d[0], d[1], d[2] = byte('0'+q/100), digitPairs[2*t], digitPairs[2*t+1]
		n = 3
	}
	if r != 0 {
		t := r % 100
		d[n], d[n+1], d[n+2], d[n+3] = '.', byte('0'+r/100), digitPairs[2*t], digitPairs[2*t+1]
		switch {
		case t == 0:
			n += 2
		case t%10 == 0:
			n += 3
		default:
			n += 4
		}
	}
	d[n], d[n+1], d[n+2] = 0xc2, 0xb5, 's' // µs
	return b[:l+n+3]
}

// appendFraction appends frac, below 10^n (n at most 9), as the n digits
// after a decimal point, trailing zeros (and the point, for 0) left out.
// The digits are made all at once, eight in one 64-bit word (fraction8),
// and stored with one write; the zeros are cut by counting the word's
// zero bytes: a digit at a time, with a division and a table read each,
// this took about 150 instructions for a line's time, which every
// decision line has.
func appendFraction(b []byte, frac uint64, n int) []byte {
	if frac == 0 {
		return b
	}
	l := len(b)
	if cap(b)-l < 10 {
		b = slices.Grow(b, 10)
	}
	b = b[:l+10]
	d := (*[10]byte)(b[l:])
	d[0] = '.'
	k := 1 // where the eight digits go
	if n == 9 {
		// The first of nine digits alone, the other eight in the word.
		d[1] = byte('0' + frac/1e8)
		frac %= 1e8
		k = 2
	} else {
		frac *= pow10[8-n] // eight digits, the last 8-n of them zeros
	}
	w := fraction8(uint32(frac))
	binary.LittleEndian.PutUint64(d[k:k+8], w|0x3030303030303030)
	if w == 0 {
		return b[:l+k] // nine digits whose last eight are zeros
	}
	return b[:l+k+8-bits.LeadingZeros64(w)/8]
}

// pow10 are 10^0 to 10^8.
var pow10 = [9]uint64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8}

// fraction8 is x, below 10^8, as its eight decimal digits (with leading
// zeros), one a byte, the first in the lowest: the word is split into
// lanes of 4, then 2, then 1 digit, each lane divided by a
// multiplication and a shift that are exact below the lane's bound
// (y*10486>>20 is y/100 below 10^4, y*103>>10 is y/10 below 100).
func fraction8(x uint32) uint64 {
	v := uint64(x/10000) | uint64(x%10000)<<32
	q := (v * 10486 >> 20) & 0x0000007f0000007f
	v = q | (v-q*100)<<16
	q = (v * 103 >> 10) & 0x000f000f000f000f
	return q | (v-q*10)<<8
}

// appendUint appends u in decimal, in place like appendFraction.
func appendUint(b []byte, u uint64) []byte {
	switch {
	case u < 10:
		return append(b, byte('0'+u))
	case u < 100:
		return append(b, digitPairs[2*u], digitPairs[2*u+1])
	case u < 1000:
		d := u % 100
		return append(b, byte('0'+u/100), digitPairs[2*d], digitPairs[2*d+1])
	}
	n := 4
	for v := u / 10000; v > 0; v /= 10 {
		n++
	}
	l := len(b)
	b = slices.Grow(b, n)[:l+n]
	for i := l + n - 1; i >= l; i-- {
		b[i] = byte('0' + u%10)
		u /= 10
	}
	return b
}
