package guard

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// connState is the guard's per-connection scratch (proxy.ClientInfo.Local):
// what stays the same from one write of a connection to the next, kept so
// that the next write does not build it again. Its mutex is only ever
// contended where tests share one ClientInfo across goroutines; a write
// that finds it busy does without: every taker only tries it
// (connStateOf), none waits for it.
type connState struct {
	// What the usual allowed write reads and writes comes first, in as
	// few cache lines as it fits (six, the first entries of allows and
	// rules with them); what it does not (the zap path's loggers, the
	// line's head and version, made once per app or policy, the throttle,
	// its own memos when a session memo serves) after. Between two writes
	// of a connection every other connection's run, and each line of
	// this one's it touches is a miss (docs/BENCHMARKS.md, "the ninth
	// box's footprint").
	mu sync.Mutex
	// deciding is the request whose enforcement holds mu from its
	// verdict (newVerdict) to its decision (releaseConn), so that the
	// memos it reads on the way (the pin, the owner, the lock check, the
	// line, the edit) do not each lock the connection again: a mutex
	// taken and released costs two atomic writes, about 12 ns, and an
	// enforced write took it eight times. Read without mu, hence
	// atomic; a request is decided by one goroutine, so no other can
	// find its own request here.
	deciding atomic.Pointer[proxy.Request]
	// sess, while set, is the session memo the decision holds
	// (takeSession), whose memos are used instead of self.
	sess *sessionMemo
	// last is the session memo the connection took last (takeSession).
	last *sessionMemo
	// line is the buffer the connection's decision lines are written
	// from (LineSink), kept between writes.
	line []byte
	// held is what line still holds of the connection's last line
	// (lineHeld).
	held lineHeld
	// ts is the text of the second of the connection's latest line
	// (the text around an allowed line's head is the writer's memos',
	// memos.allow).
	ts tsCache
	// head is the decision line's client and app fields, of headClient
	// and headApp (lineHead); the rest of the head is the writer's
	// (memos). headApp here puts the first allow series in one line and
	// rules' first memo in two, not three (TestConnStateHotLines).
	headApp string
	// allows are the allow series of the rules the connection wrote
	// under lately (allowCounter).
	allows    [4]allowSeries
	nextAllow int
	// rules are the rules the connection wrote under lately (ruleRef).
	rules      enforce.Rules
	head       []byte
	headClient string
	// idScratch holds an id's text on its way into the line
	// (appendIDField), when the writer's memos have no field for it.
	idScratch []byte
	// version is the decision line's policyVersion field of the policy
	// versionOf (versionField).
	versionOf *policy.Policy
	version   []byte
	// throttle is the connection's share of lock commands and its
	// resolutions' cool-down (throttle.go), made when first needed. Set
	// and read without mu: a lock command's throttling must not wait for
	// a write's decision, nor a decision for it.
	throttle atomic.Pointer[connThrottle]
	// lines are the decision log's loggers with the fields that lead
	// every line (client to mode) encoded once, for the few (session,
	// namespace, command, mode) a connection writes with, replaced in
	// turn (zapLine, without a LineSink).
	lines [4]linePrefix
	next  int
	// self are the connection's own memos, for writes without a session
	// memo (memo): sess's are used instead while it is set.
	self memos
}

// maxKeptMessage bounds the message buffers the guard keeps: a write
// rewritten once with many pinned ids does not hold its size for good.
const maxKeptMessage = 16 << 10

// msgBuf is a buffer rewritten messages are encoded into (edit), kept in
// the guard's msgBufs between writes: one per P, as the verdicts, so
// that the next rewritten message is encoded into the bytes the last
// one on this core left in its cache, not into a connection's own
// buffer, which every other connection's writes evicted meanwhile (the
// encoding's stores were the guard's largest share of write misses;
// docs/BENCHMARKS.md, "the ninth box's footprint").
//
// A verdict that goes back to the spares keeps one of its own
// (verdict.msg, spare nil): that write's pool Get and Put were about 110
// instructions, and the verdict, a spare per P too, brings the buffer
// its last write on this core encoded into.
type msgBuf struct {
	b []byte
	// spare is the pool the buffer goes back to; nil: it is a verdict's,
	// which keeps it (b is set by edit, before it is handed out).
	spare *sync.Pool
	// out: the proxy has the buffer (Decision.MessageDone). Set before
	// it is handed over, taken back once: a second ReleaseMessage of
	// the same message must not put the buffer in the pool twice, where
	// two writes would get it and encode into the same bytes.
	out atomic.Bool
}

// ReleaseMessage implements proxy.MessageReleaser: the proxy has written
// the rewritten message and reads it no more.
func (m *msgBuf) ReleaseMessage(b []byte) {
	if !m.out.CompareAndSwap(true, false) || m.spare == nil || cap(b) > maxKeptMessage {
		return
	}
	m.b = b[:0]
	m.spare.Put(m)
}

// ownMsg is v's own message buffer for its next rewrite (edit): the one
// it keeps, unless the proxy still holds that (its flight landed before
// the proxy handed the message back), then a new one, which v keeps from
// now on (the other is the proxy's until it lets go of it).
func (v *verdict) ownMsg() *msgBuf {
	if m := v.msg; m != nil && !m.out.Load() {
		return m
	}
	v.msg = &msgBuf{}
	return v.msg
}

// newVerdict returns a verdict for req: a cleared one from spares (nil:
// none), or a new one. A write in flight keeps its verdict until it
// lands, so a request decided meanwhile (pipelined, or sent while
// another is unanswered) never gets a verdict still in use: only a
// landed flight's goes back (putVerdict).
//
// The connection stays locked for req's decision until releaseConn.
func newVerdict(spares *sync.Pool, req *proxy.Request, start time.Time) *verdict {
	var v *verdict
	if spares != nil {
		v, _ = spares.Get().(*verdict)
	}
	if v == nil {
		v = &verdict{}
	}
	v.Req, v.Now = req, start
	if st := connStateOf(req); st != nil {
		st.hold(req)
		v.home = st
	}
	return v
}

// putVerdict takes back the verdict of a flight that landed, once
// nothing else points into it, cleared: it keeps no request alive, and
// the write that gets it next, on any connection, finds nothing of this
// one's.
func (g *Guard) putVerdict(v *verdict) {
	v.reset()
	g.verdicts.Put(v)
}

type allowSeries struct {
	vec   *prometheus.CounterVec
	match string
	c     prometheus.Counter
}

// allowCounter is vec's allow series of the rule match (the decision
// counter's labels: rule, allow, none). st is locked.
func (st *connState) allowCounter(vec *prometheus.CounterVec, match string) prometheus.Counter {
	for i := range st.allows {
		if a := &st.allows[i]; a.c != nil && a.vec == vec && a.match == match {
			return a.c
		}
	}
	c := vec.WithLabelValues(match, enforce.DecisionAllow, metricReason(""))
	st.allows[st.nextAllow] = allowSeries{vec: vec, match: match, c: c}
	st.nextAllow = (st.nextAllow + 1) % len(st.allows)
	return c
}

// pinnedIDs is docid.Copy(pinned), but a single pinned value that the
// writer pinned lately is not copied again (memos.pinned).
func pinnedIDs(req *proxy.Request, pinned []bsoncore.Value) ([]docid.ID, error) {
	if len(pinned) != 1 || req == nil {
		return docid.Copy(pinned)
	}
	st := connStateOf(req)
	if st == nil {
		return docid.Copy(pinned)
	}
	defer st.unlock(req)
	return st.memo().pinned(pinned[0])
}

// versionField is the decision line's ,"policyVersion":"<version>" of
// pol, escaped once per policy and connection: a policy's version never
// changes, a reload is another policy. st is locked.
func (st *connState) versionField(pol *policy.Policy) []byte {
	if st.versionOf != pol || st.version == nil {
		st.versionOf = pol
		st.version = appendJSONString(append([]byte(nil), `,"policyVersion":`...), pol.Version())
	}
	return st.version
}

// linePrefix is one pre-encoded head of decision lines, as a logger's
// fields (zap).
type linePrefix struct {
	log                          *zap.Logger
	app, user, ns, command, mode string
	lsid                         []byte      // a copy: the request's buffer is not ours
	auditing                     *zap.Logger // the logger log was made from
}

// connStateOf returns req's connection state, locked, or nil when another
// goroutine holds it; the caller unlocks it (unlock). Within req's own
// decision the state is locked already and stays so.
func connStateOf(req *proxy.Request) *connState {
	c := req.Client
	if c == nil {
		return nil
	}
	st := localState(c)
	if st.deciding.Load() == req {
		return st
	}
	if !st.mu.TryLock() {
		return nil
	}
	return st
}

// localState returns c's connection state, made on first use, unlocked.
func localState(c *proxy.ClientInfo) *connState {
	st, _ := c.Local().(*connState)
	if st == nil {
		st = &connState{}
		c.SetLocal(st)
	}
	return st
}

// conn is connStateOf(req) for req's verdict v, found through v: the
// connection req's decision holds (newVerdict), without the request's
// interface lookup and type check, which an enforced write made at every
// unit that reads the connection's memos. Only while that decision holds
// it (deciding is req, which no other connection's state can hold): once
// released (releaseConn), or for a verdict made without one, this is
// connStateOf.
func (v *verdict) conn(req *proxy.Request) *connState {
	if st := v.home; st != nil && st.deciding.Load() == req {
		return st
	}
	return connStateOf(req)
}

// hold keeps st, taken by connStateOf(req), locked for req's decision,
// until releaseConn.
func (st *connState) hold(req *proxy.Request) {
	if st.deciding.Load() != req {
		st.deciding.Store(req)
	}
}

// unlock unlocks st, taken by connStateOf(req), unless req's decision
// holds it.
func (st *connState) unlock(req *proxy.Request) {
	if st.deciding.Load() != req {
		st.mu.Unlock()
	}
}

// releaseConn ends req's hold of its connection's state, if its decision
// took it (newVerdict).
func releaseConn(req *proxy.Request) {
	if req.Client == nil {
		return
	}
	if st, _ := req.Client.Local().(*connState); st != nil && st.deciding.Load() == req {
		st.dropSession()
		st.deciding.Store(nil)
		st.mu.Unlock()
	}
}

// prefix returns the entry of a line head, found or made (its logger
// still to be made). st is locked.
func (st *connState) prefix(app, user string, lsid []byte, ns, command, mode string) *linePrefix {
	for i := range st.lines {
		p := &st.lines[i]
		if p.log != nil && p.app == app && p.user == user && bytes.Equal(p.lsid, lsid) &&
			p.ns == ns && p.command == command && p.mode == mode {
			return p
		}
	}
	p := &st.lines[st.next]
	st.next = (st.next + 1) % len(st.lines)
	*p = linePrefix{app: app, user: user, ns: ns, command: command, mode: mode, lsid: append([]byte(nil), lsid...)}
	return p
}

// decisionLogger returns audit with the leading fields of a decision line
// already encoded: the same fields, in the same order, as a line that
// names them all at the call (zap writes a logger's own fields first).
// st is locked.
func (st *connState) decisionLogger(audit *zap.Logger, client, app, user string, lsid []byte, ns, command, mode string) *zap.Logger {
	p := st.prefix(app, user, lsid, ns, command, mode)
	if p.log != nil && p.auditing == audit {
		return p.log
	}
	session := ""
	if lsid != nil {
		session = lockstore.SessionPrefix(lsid)
	}
	p.auditing = audit
	p.log = audit.With(
		zap.String("client", client),
		zap.String("app", app),
		zap.String("user", user),
		zap.String("session", session),
		zap.String("ns", ns),
		zap.String("command", command),
		zap.String("mode", mode))
	return p.log
}

// lineHead is the decision line's head, client to mode, in two parts:
// the connection's client and app fields, made once per app, and the
// rest, made once per key in the writer's memos (memos.tail), so that a
// session's writes find their part on whichever connection they come.
// st is locked.
func (st *connState) lineHead(client, app, user string, lsid []byte, ns, command, mode string) (conn, tail []byte) {
	if st.head == nil || st.headApp != app || st.headClient != client {
		st.head, st.headApp, st.headClient = appendConnHead(nil, client, app), app, client
	}
	return st.head, st.memo().tail(user, lsid, ns, command, mode)
}

// appendLineHead appends the fields that lead every decision line, in the
// order decisionLogger gives them to zap.
func appendLineHead(b []byte, client, app, user string, lsid []byte, ns, command, mode string) []byte {
	return appendLineTail(appendConnHead(b, client, app), user, lsid, ns, command, mode)
}

// appendConnHead appends the head's fields of the connection.
func appendConnHead(b []byte, client, app string) []byte {
	return appendField(appendField(b, "client", client), "app", app)
}

// appendLineTail appends the head's fields after the connection's.
func appendLineTail(b []byte, user string, lsid []byte, ns, command, mode string) []byte {
	session := ""
	if lsid != nil {
		session = lockstore.SessionPrefix(lsid)
	}
	b = appendField(b, "user", user)
	b = appendField(b, "session", session)
	b = appendField(b, "ns", ns)
	b = appendField(b, "command", command)
	return appendField(b, "mode", mode)
}

// idList renders ids for a log line.
func idList(ids []docid.ID) string {
	if len(ids) == 1 {
		return ids[0].String() // the usual write: no copy
	}
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(",")
		}
		if i == 20 {
			fmt.Fprintf(&b, "... (%d in all)", len(ids))
			break
		}
		b.WriteString(id.String())
	}
	return b.String()
}
