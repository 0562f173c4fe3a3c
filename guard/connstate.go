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
	"github.com/lockgate/lockgate/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// connState is the guard's per-connection scratch (proxy.ClientInfo.Local):
// what stays the same from one write of a connection to the next, kept so
// that the next write does not build it again. Its mutex is only ever
// contended where tests share one ClientInfo across goroutines; a write
// that finds it busy does without: every taker only tries it
// (connStateOf, putVerdict, ReleaseMessage), none waits for it.
type connState struct {
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
	// lines are the decision log's loggers with the fields that lead
	// every line (client to mode) encoded once, for the few (session,
	// namespace, command, mode) a connection writes with, replaced in
	// turn.
	lines [4]linePrefix
	next  int
	// ids are the _ids of the connection's latest single-id filters,
	// made once each (idMemo).
	ids    [8]idMemo
	nextID int
	// allows are the allow series of the rules the connection wrote
	// under lately (allowCounter).
	allows    [4]allowSeries
	nextAllow int
	// rules are the rules the connection wrote under lately (ruleRef).
	rules enforce.Rules
	// pins are the connection's latest pinned filters (pinMemos).
	pins enforce.PinMemos
	// line is the buffer the connection's decision lines are written
	// from (LineSink), kept between writes; idScratch holds an id's text
	// on its way into the line (appendIDField).
	line, idScratch []byte
	// owner is the connection's latest session's owner key (sessionKey).
	owner enforce.OwnerMemo
	// lsidDoc is a copy of the connection's latest write's lsid document
	// and lsid its session id, read from that copy (sessionOf); neither
	// is ever modified, a new lsid gets a new copy.
	lsidDoc, lsid []byte
	// held are the lock store's memos of the connection's latest lock
	// checks, one per document, replaced in turn (heldFromMemo): a
	// client writes a few documents over and over.
	held enforce.HeldMemos
	// ts is the text of the second of the connection's latest line,
	// allow what its allowed writes' lines hold around the head.
	ts    tsCache
	allow allowLine
	// version is the decision line's policyVersion field of the policy
	// versionOf (versionField).
	versionOf *policy.Policy
	version   []byte
	// spare is a verdict no flight or request points into any more,
	// for the connection's next write (newVerdict).
	spare *verdict
	// msg is the buffer the connection's rewritten messages are encoded
	// into (edit), nil while the proxy has it (ReleaseMessage).
	msg []byte
}

// maxKeptMessage bounds the message buffer a connection keeps: a write
// rewritten once with many pinned ids does not hold its size for good.
const maxKeptMessage = 16 << 10

// ReleaseMessage implements proxy.MessageReleaser: the proxy has written
// the connection's rewritten message and reads it no more.
func (st *connState) ReleaseMessage(b []byte) {
	if cap(b) > maxKeptMessage || !st.mu.TryLock() {
		return
	}
	if st.msg == nil {
		st.msg = b[:0]
	}
	st.mu.Unlock()
}

// newVerdict returns a verdict for req: the connection's spare, or a new
// one. A write in flight keeps its verdict until it lands, so a request
// decided meanwhile (pipelined, or sent while another is unanswered)
// never gets a verdict still in use: the spare is empty then.
//
// The connection stays locked for req's decision until releaseConn.
func newVerdict(req *proxy.Request, start time.Time) *verdict {
	st := connStateOf(req)
	if st == nil {
		return &verdict{Verdict: enforce.Verdict{Req: req, Now: start}}
	}
	v := st.spare
	st.spare = nil
	st.hold(req)
	if v == nil {
		v = &verdict{}
	}
	v.Req, v.Now, v.home = req, start, st
	return v
}

// putVerdict takes back the verdict of a flight that landed, once
// nothing else points into it, cleared: it keeps no request alive.
func (st *connState) putVerdict(v *verdict) {
	*v = verdict{}
	if !st.mu.TryLock() {
		return
	}
	if st.spare == nil {
		st.spare = v
	}
	st.mu.Unlock()
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

// idMemo is one _id as a filter sent it and its ID, with bytes of its
// own. An ID is immutable, so every write that pins the same bytes
// shares it; it says nothing about any lock.
type idMemo struct {
	typ bsontype.Type
	val []byte
	ids []docid.ID // len 1, capacity 1: an append copies
	// text is the id as the decision line shows it, made on first use.
	text string
	// field is the decision line's ,"ids":"<text>", made on its second
	// line (idField) when the id is one appendIDField writes; lined
	// counts the lines before.
	field []byte
	lined int
}

// idField is the decision line's ids field of ids, encoded once per
// connection, when ids is the memo's own slice (the usual one-id write)
// of an id appendIDField writes and the memo's second line or later; nil
// otherwise. An id written once (a client cycling through more ids than
// the memo holds) costs no allocation for a field never used again.
// st is locked.
func (st *connState) idField(ids []docid.ID) []byte {
	for i := range st.ids {
		m := &st.ids[i]
		if len(m.ids) != 1 || &m.ids[0] != &ids[0] {
			continue
		}
		if m.field == nil {
			if m.lined++; m.lined < 2 {
				return nil
			}
			f, _, ok := appendIDField(nil, nil, "ids", ids[0])
			if !ok || len(f) > maxKeptLine {
				return nil
			}
			m.field = f
		}
		return m.field
	}
	return nil
}

// idText is idList(ids) for the decision line, from the memo when ids is
// the memo's own slice (the usual one-id write): the id is formatted once
// per connection, not once per write. st is locked.
func (st *connState) idText(ids []docid.ID) string {
	if len(ids) == 1 {
		for i := range st.ids {
			m := &st.ids[i]
			if len(m.ids) == 1 && &m.ids[0] == &ids[0] {
				if m.text == "" {
					m.text = idList(ids)
				}
				return m.text
			}
		}
	}
	return idList(ids)
}

// maxKeptLSID bounds the lsid document a connection keeps a copy of: a
// driver's is {id: <UUID>}, 33 bytes.
const maxKeptLSID = 64

// sessionOf is req.Command.SessionID(), the parse of its lsid document,
// answered from the connection's copy of its latest one when the bytes
// are the same: the parse is a function of those bytes alone, and a
// connection writes in one session after another.
func sessionOf(req *proxy.Request) ([]byte, bool) {
	lsid := req.Command.LSID
	if lsid == nil {
		return nil, false
	}
	st := connStateOf(req)
	if st == nil {
		return wire.SessionID(lsid)
	}
	defer st.unlock(req)
	if st.lsidDoc != nil && bytes.Equal(st.lsidDoc, lsid) {
		return st.lsid, true
	}
	id, ok := wire.SessionID(lsid)
	if !ok || len(lsid) > maxKeptLSID {
		return id, ok
	}
	doc := bytes.Clone(lsid)
	if kept, ok := wire.SessionID(doc); ok {
		st.lsidDoc, st.lsid = doc, kept
		return kept, true
	}
	return id, ok
}

// pinnedIDs is docid.Copy(pinned), but a single pinned value that the
// connection pinned lately is not copied again.
func pinnedIDs(req *proxy.Request, pinned []bsoncore.Value) ([]docid.ID, error) {
	if len(pinned) != 1 || req == nil {
		return docid.Copy(pinned)
	}
	st := connStateOf(req)
	if st == nil {
		return docid.Copy(pinned)
	}
	defer st.unlock(req)
	p := pinned[0]
	for i := range st.ids {
		m := &st.ids[i]
		if m.ids != nil && m.typ == p.Type && bytes.Equal(m.val, p.Data) {
			return m.ids, nil
		}
	}
	ids, err := docid.Copy(pinned)
	if err != nil {
		return nil, err
	}
	ids = ids[:1:1]
	st.ids[st.nextID] = idMemo{typ: p.Type, val: ids[0].Raw().Value, ids: ids}
	st.nextID = (st.nextID + 1) % len(st.ids)
	return ids, nil
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

// linePrefix is one pre-encoded head of decision lines: as a logger's
// fields (zap), or as the line's bytes (LineSink), each made on first use.
type linePrefix struct {
	log                          *zap.Logger
	app, user, ns, command, mode string
	lsid                         []byte      // a copy: the request's buffer is not ours
	auditing                     *zap.Logger // the logger log was made from
	// head is the fields as the line shows them, each with its leading
	// comma (appendLineHead).
	head []byte
}

// connStateOf returns req's connection state, locked, or nil when another
// goroutine holds it; the caller unlocks it (unlock). Within req's own
// decision the state is locked already and stays so.
func connStateOf(req *proxy.Request) *connState {
	c := req.Client
	if c == nil {
		return nil
	}
	st, _ := c.Local().(*connState)
	if st == nil {
		st = &connState{}
		c.SetLocal(st)
	}
	if st.deciding.Load() == req {
		return st
	}
	if !st.mu.TryLock() {
		return nil
	}
	return st
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
		st.deciding.Store(nil)
		st.mu.Unlock()
	}
}

// prefix returns the entry of a line head, found or made (its logger
// and bytes still to be made). st is locked.
func (st *connState) prefix(app, user string, lsid []byte, ns, command, mode string) *linePrefix {
	for i := range st.lines {
		p := &st.lines[i]
		if (p.log != nil || p.head != nil) && p.app == app && p.user == user && bytes.Equal(p.lsid, lsid) &&
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

// lineHead is appendLineHead's bytes, made once per head. st is locked.
func (st *connState) lineHead(client, app, user string, lsid []byte, ns, command, mode string) []byte {
	p := st.prefix(app, user, lsid, ns, command, mode)
	if p.head == nil {
		p.head = appendLineHead(nil, client, app, user, lsid, ns, command, mode)
	}
	return p.head
}

// appendLineHead appends the fields that lead every decision line, in the
// order decisionLogger gives them to zap.
func appendLineHead(b []byte, client, app, user string, lsid []byte, ns, command, mode string) []byte {
	session := ""
	if lsid != nil {
		session = lockstore.SessionPrefix(lsid)
	}
	b = appendField(b, "client", client)
	b = appendField(b, "app", app)
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
