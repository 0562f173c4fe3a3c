package guard

import (
	"bytes"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// memos are what a writer's next write finds made already: the ids its
// filters named, what its filters pin, its latest lock checks, the parts
// of its decision lines that name it. Every entry is a pure function of
// its key (an id of its bytes, a pin of its filter and limit, a line tail
// of its fields) or checks its own freshness (a held-lock memo its
// store's generation and the clock), so an entry is right for whoever
// finds it: where memos live only decides how often they hit. They are
// not safe for concurrent use; their holder locks them.
type memos struct {
	// allow first: its three lines the usual write reads follow the
	// session memo's own fields (TestMemosHotLines).
	// allow is the latest allowed line's text of these memos' writer
	// (allowLine): kept with the session, as its tails are, so that a
	// connection carrying many sessions' writes in turn (a driver's
	// pool) finds each session's text again rather than making it anew.
	allow allowLine
	// ids are the _ids of the latest single-id filters, made once each
	// (idMemo).
	ids    [8]idMemo
	nextID int
	// pins are the latest pinned filters (enforce.PinMemos).
	pins enforce.PinMemos
	// heldPad puts held at a cache line's start in a session memo on the
	// heap (its size class's objects start at lines, and the runtime's
	// 8-byte header of a large object with pointers comes first): the
	// lookup's tags are then one line and each memo two
	// (TestHeldMemosLineAligned checks the sum).
	heldPad [48]byte
	// held are the lock store's memos of the latest lock checks, one per
	// document, replaced in turn (heldFromMemo).
	held enforce.HeldMemos
	// tails are the decision lines' fields after the connection's
	// (lineTail), for the few (namespace, command, mode) written lately.
	tails    [4]lineTail
	nextTail int
}

// lineTail is one decision line's fields from user to mode, each with
// its leading comma, as appendLineTail writes them for its key.
type lineTail struct {
	user, ns, command, mode string
	lsid                    []byte // a copy: the request's buffer is not ours
	b                       []byte
}

// sessionMemo is one session's memos, shared by every connection its
// writes come on: a driver sends each operation on whichever pooled
// connection is idle, so a connection sees the writes of all the
// application's sessions in turn, and memos kept per connection keep
// missing (docs/BENCHMARKS.md, "the third box's merges"), while a
// session writes its few documents over and over. It also keeps what
// the session's owner is made of: the owner key of (user, lsid), which
// no one may modify, the stored form of its latest binding, and its entry
// in the flight tracker once a write of it was launched.
//
// A decision takes it with TryLock and holds it until its connection is
// released (releaseConn): a session's writes are sent one at a time, so
// it is free; a client that sends two at once on two connections gets
// the memo for one and does without for the other, never waits.
type sessionMemo struct {
	mu sync.Mutex
	// table is the table the memo is in, user and lsid its session.
	table *sessionTable
	user  string
	lsid  [16]byte
	// key is the guard's owner key of (user, lsid) (OwnerKeys.Session).
	key     []byte
	flights *inflight.Session
	// bind is the latest binding a write named and bound its stored form
	// (OwnerKeys.Bind); bound is "" before one.
	bind, bound string
	// used is when the memo was last found (Unix nanoseconds): which of
	// a pair of slots to give a newcomer.
	used atomic.Int64
	memos
}

// sessionSlots is the size of the guard's table of session memos. A
// session's memos are about 3 KiB on the heap (2,560 B of memo, its
// owner key and what its memos keep); 2,048 of them bound the table at
// about 7 MiB, for far more sessions writing at once than a proxy serves
// (a driver's pool of sessions is about its pool of connections). Memos
// leave with their sessions (forgetSession) and connections (ConnClosed).
const sessionSlots = 2048

// sessionTable is the guard's session memos, found by a hash of the
// session: two slots a session, the least lately used given to a
// newcomer. A miss costs a new memo; a session pushed out loses nothing
// but the memo. The hash is keyed per process, so that a client cannot
// choose lsids that push out other sessions' memos.
type sessionTable struct {
	seed maphash.Seed
	// pairs is how many pairs of slots are used: all of them but in
	// tests, which crowd sessions into one.
	pairs uint64
	slots [sessionSlots]atomic.Pointer[sessionMemo]
}

func newSessionTable() *sessionTable {
	return &sessionTable{seed: maphash.MakeSeed(), pairs: sessionSlots / 2}
}

// get returns the memo of (user, lsid), found or new, not locked, at
// now (Unix nanoseconds). keys derives a new memo's owner key.
func (t *sessionTable) get(keys *enforce.OwnerKeys, user string, lsid []byte, now int64) *sessionMemo {
	a, b, m := t.find(user, lsid)
	if m != nil {
		if now-m.used.Load() > usedGrain {
			m.used.Store(now)
		}
		return m
	}
	m = &sessionMemo{table: t, user: user, lsid: [16]byte(lsid), key: keys.Session(user, lsid)}
	m.used.Store(now)
	if ma, mb := a.Load(), b.Load(); ma != nil && (mb == nil || mb.used.Load() < ma.used.Load()) {
		a = b
	}
	a.Store(m)
	return m
}

// usedGrain is how much later than its last record a memo's use is
// recorded again: a store on every write would be a write every
// connection makes to the same memory.
const usedGrain = int64(time.Millisecond)

// find returns the memo of (user, lsid), if the table has it, and the
// two slots it may be in.
func (t *sessionTable) find(user string, lsid []byte) (a, b *atomic.Pointer[sessionMemo], m *sessionMemo) {
	i := maphash.Bytes(t.seed, lsid) % t.pairs * 2
	a, b = &t.slots[i], &t.slots[i+1]
	for _, s := range [2]*atomic.Pointer[sessionMemo]{a, b} {
		if m := s.Load(); m != nil && m.lsid == [16]byte(lsid) && m.user == user {
			return a, b, m
		}
	}
	return a, b, nil
}

// forget takes m out of the table, if it is still there: the memo stays
// right for whoever holds it, the next write of its session makes a new
// one.
func (t *sessionTable) forget(m *sessionMemo) {
	i := maphash.Bytes(t.seed, m.lsid[:]) % t.pairs * 2
	if !t.slots[i].CompareAndSwap(m, nil) {
		t.slots[i+1].CompareAndSwap(m, nil)
	}
}

// forgetSession takes the memo of (user, lsid) out of the table: the
// session ended (endSessions).
func (t *sessionTable) forgetSession(user string, lsid []byte) {
	if len(lsid) != 16 {
		return
	}
	if _, _, m := t.find(user, lsid); m != nil {
		t.forget(m)
	}
}

// ConnClosed implements proxy.ConnCloser: the memo of the connection's
// latest session leaves the table with it. A client that opens a
// connection per session and never ends its sessions (an old driver, a
// script, a crashed application) would otherwise leave a memo behind per
// connection served, until the table is full of them. A driver's pooled
// connections live long and end their sessions (endSessions), so this
// costs them at most a memo made again.
func (st *connState) ConnClosed() {
	if !st.mu.TryLock() {
		// A decision still holds the state (the connection ended in a
		// panic): the memo stays until pushed out.
		return
	}
	m := st.last
	st.last = nil
	st.mu.Unlock()
	if m != nil {
		m.table.forget(m)
	}
}

// boundOf is keys.Bind(bind), the stored form of the session's latest
// binding kept. m is locked.
func (m *sessionMemo) boundOf(keys *enforce.OwnerKeys, bind string) string {
	if bind == "" {
		return ""
	}
	if m.bound == "" || m.bind != bind {
		m.bind, m.bound = bind, keys.Bind(bind)
	}
	return m.bound
}

// takeSession takes the memo of req's session (user, lsid) for the rest
// of req's decision, which holds st: the connection's memos are the
// session's from here on (releaseConn gives them back). nil when the
// memo is taken by another write of the session at this moment, or the
// lsid is not a UUID's 16 bytes. The connection's latest session's memo
// is taken without the table: a connection of its own writes in one
// session after another.
func (st *connState) takeSession(t *sessionTable, keys *enforce.OwnerKeys, user string, lsid []byte, now int64) *sessionMemo {
	if len(lsid) != 16 {
		return nil
	}
	if m := st.sess; m != nil {
		if m.table == t && m.lsid == [16]byte(lsid) && m.user == user {
			return m
		}
		st.dropSession()
	}
	m := st.last
	if m == nil || m.table != t || m.lsid != [16]byte(lsid) || m.user != user {
		m = t.get(keys, user, lsid, now)
	}
	if !m.mu.TryLock() {
		return nil
	}
	st.sess, st.last = m, m
	return m
}

// dropSession gives the session memo st holds back. st is locked.
func (st *connState) dropSession() {
	if m := st.sess; m != nil {
		st.sess = nil
		m.mu.Unlock()
	}
}

// memo is the memos of st's current write: its session's while it holds
// them (takeSession), the connection's own otherwise. st is locked.
func (st *connState) memo() *memos {
	if st.sess != nil {
		return &st.sess.memos
	}
	return &st.self
}

// keepFlights remembers the flight tracker's entry of the session whose
// owner key is key, when req's decision holds that session's memo.
func keepFlights(req *proxy.Request, key []byte, flights *inflight.Session) {
	if req.Client == nil {
		return
	}
	if st, _ := req.Client.Local().(*connState); st != nil && st.deciding.Load() == req {
		if m := st.sess; m != nil && bytes.Equal(m.key, key) {
			m.flights = flights
		}
	}
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

// idField is the decision line's ids field of ids, encoded once, when
// ids is the memo's own slice (the usual one-id write) of an id
// appendIDField writes and the memo's second line or later; nil
// otherwise. An id written once (a client cycling through more ids than
// the memo holds) costs no allocation for a field never used again.
func (m *memos) idField(ids []docid.ID) []byte {
	for i := range m.ids {
		e := &m.ids[i]
		if len(e.ids) != 1 || &e.ids[0] != &ids[0] {
			continue
		}
		if e.field == nil {
			if e.lined++; e.lined < 2 {
				return nil
			}
			f, _, ok := appendIDField(nil, nil, "ids", ids[0])
			if !ok || len(f) > maxKeptLine {
				return nil
			}
			e.field = f
		}
		return e.field
	}
	return nil
}

// idText is idList(ids) for the decision line, from the memo when ids is
// the memo's own slice (the usual one-id write): the id is formatted once,
// not once per write.
func (m *memos) idText(ids []docid.ID) string {
	if len(ids) == 1 {
		for i := range m.ids {
			e := &m.ids[i]
			if len(e.ids) == 1 && &e.ids[0] == &ids[0] {
				if e.text == "" {
					e.text = idList(ids)
				}
				return e.text
			}
		}
	}
	return idList(ids)
}

// pinned is docid.Copy of the single pinned value p, not copied again
// when the memo has it.
func (m *memos) pinned(p bsoncore.Value) ([]docid.ID, error) {
	for i := range m.ids {
		e := &m.ids[i]
		if e.ids != nil && e.typ == p.Type && bytes.Equal(e.val, p.Data) {
			return e.ids, nil
		}
	}
	ids, err := docid.Copy([]bsoncore.Value{p})
	if err != nil {
		return nil, err
	}
	ids = ids[:1:1]
	m.ids[m.nextID] = idMemo{typ: p.Type, val: ids[0].Raw().Value, ids: ids}
	m.nextID = (m.nextID + 1) % len(m.ids)
	return ids, nil
}

// tail is appendLineTail's bytes for its key, made once per key.
func (m *memos) tail(user string, lsid []byte, ns, command, mode string) []byte {
	for i := range m.tails {
		e := &m.tails[i]
		if e.b != nil && e.user == user && bytes.Equal(e.lsid, lsid) && e.ns == ns && e.command == command && e.mode == mode {
			return e.b
		}
	}
	e := &m.tails[m.nextTail]
	m.nextTail = (m.nextTail + 1) % len(m.tails)
	*e = lineTail{user: user, ns: ns, command: command, mode: mode, lsid: bytes.Clone(lsid),
		b: appendLineTail(nil, user, lsid, ns, command, mode)}
	return e.b
}
