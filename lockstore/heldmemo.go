package lockstore

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// HeldMemo is a caller's memo of one lock check that a store answered
// from its own memory (HeldTokenMemo): the lock it found held, and the
// store's generation when it read it. The store counts every change to
// what it answers such checks from (an acquire, renewal, release or
// force-release through it, a refresh or a confirmation of its cache, an
// outage declared), so while its generation is unchanged the memo says
// exactly what the store would: a connection that writes the same
// document again needs neither the store's shared mutex nor its map,
// only the generation and one clock reading. The zero value is empty; a
// memo is filled and read by the store alone, under the caller's own
// lock.
type HeldMemo struct {
	// counter is the generation counter of the store that filled the
	// memo: its address is the store's identity, compared as a pointer
	// (an interface's compare is a runtime call on every check).
	counter *atomic.Uint64
	gen     uint64
	session []byte // the owner key, shared: owner keys are never modified
	bind    string
	ns      namespace.Namespace
	key     string
	token   int64
	// expires (the lease's end, on the store's clock) and confirmed
	// (local; none where the store keeps no such time) are time.Times
	// in eight bytes each (memoTime), so that a memo is two cache lines,
	// not three: a time.Time is three words.
	expires, confirmed int64
	// expMono, confMono: the time is a monotonic reading, kept as the
	// monotonic time since the filling store's epoch; else it is a wall
	// time in Unix nanoseconds. A store's clock is not always a wall
	// clock (memstore's local clock gives monotonic readings), and a
	// wall time alone would let a lease outlast its end when the wall
	// clock steps back.
	expMono, confMono bool
}

// noTime is a confirmed time the memo cannot keep (the zero Time, where
// the store keeps none): never trusted.
const noTime = math.MinInt64

// memoTime is t in a memo's eight bytes: on the monotonic clock since
// epoch (a reading of time.Now) when t carries a monotonic reading, else
// its Unix nanoseconds; false when t is outside what those can hold
// (the zero Time, a wall time beyond 1678-2262, or an epoch without a
// monotonic reading). A difference of two monotonic readings is exact
// (time.Time.Sub reads the monotonic clocks alone), so comparing the
// kept form with another reading's, made the same way, is time.Time's
// own comparison.
func memoTime(t, epoch time.Time) (v int64, mono, ok bool) {
	if hasMonotonic(t) {
		return int64(t.Sub(epoch)), true, hasMonotonic(epoch)
	}
	// Inside UnixNano's range by a second on each side.
	if sec := t.Unix(); sec <= math.MinInt64/int64(time.Second) || sec >= math.MaxInt64/int64(time.Second) {
		return 0, false, false
	}
	return t.UnixNano(), false, true
}

// Fill records a lock check that the store whose generation counter is
// counter, at generation gen, answered from memory: owner holds (ns, the
// id of key) until expires with token, and the store's memory of it was
// confirmed at local time confirmed. epoch is the store's own reading of
// time.Now, the same for every memo it fills and reads (LeaseLeft,
// Trusted). A lease's end the memo cannot keep leaves it empty: the
// check asks the store.
func (m *HeldMemo) Fill(counter *atomic.Uint64, gen uint64, owner *Owner, ns namespace.Namespace, key string, expires time.Time, token int64, confirmed, epoch time.Time) {
	e, eMono, ok := memoTime(expires, epoch)
	if !ok {
		*m = HeldMemo{}
		return
	}
	c, cMono, ok := memoTime(confirmed, epoch)
	if !ok {
		c, cMono = noTime, false
	}
	*m = HeldMemo{counter: counter, gen: gen, session: owner.Session, bind: owner.Bind, ns: ns, key: key,
		token: token, expires: e, confirmed: c, expMono: eMono, confMono: cMono}
}

// Token is the lock's token Fill recorded. Only a memo HeldMemos.Find
// found for the store, its generation, the owner and the lock answers
// for them.
func (m *HeldMemo) Token() int64 { return m.token }

// LeaseLeft is Fill's lease end read at the store's clock reading at,
// uncertain by unc: the lease left, expires.Add(-unc).Sub(at), when
// expires.After(at.Add(unc+margin)), as time.Time computes them (on the
// monotonic clock where both carry a reading, else on the wall clock).
// A monotonic lease end read at a wall time (that time.Time would
// compare on the wall clock, which the memo does not keep) is false:
// ask the store. epoch is the one Fill was given.
func (m *HeldMemo) LeaseLeft(epoch, at time.Time, unc, margin time.Duration) (time.Duration, bool) {
	var now int64
	if m.expMono {
		if !hasMonotonic(at) {
			return 0, false
		}
		now = int64(at.Sub(epoch))
	} else {
		now = at.UnixNano()
	}
	// expires > now first: a difference that overflows (readings
	// centuries apart) is negative, so not held, never a long lease.
	if left := time.Duration(m.expires - now); m.expires > now && left > unc+margin {
		return left - unc, true
	}
	return 0, false
}

// Trusted is whether Fill's confirmation is within trust of local, a
// reading of time.Now: local.Sub(confirmed) <= trust. A confirmation
// the memo could not keep is never trusted.
func (m *HeldMemo) Trusted(epoch, local time.Time, trust time.Duration) bool {
	if m.confMono {
		return local.Sub(epoch)-time.Duration(m.confirmed) <= trust
	}
	// local is after 1970, so local less trust does not overflow and
	// is above noTime.
	return m.confirmed >= local.UnixNano()-int64(trust)
}

// heldMemoSlots: a client writes a few documents over and over; more
// slots would make every miss compare more keys.
const heldMemoSlots = 4

// HeldMemos are a caller's memos of its latest lock checks answered from
// a store's memory, one per document, replaced in turn. The zero value
// is empty; like a HeldMemo, they are read and filled by the store
// alone, under the caller's own lock.
type HeldMemos struct {
	// tags are the fingerprints of the memos' ids (docid.ID.TagAt), side
	// by side: a lookup passes over the other documents' memos by their
	// tags, one cache line for all, not by their keys, a line for each
	// memo and another for each key's bytes. A slot's tag is its memo's
	// id's, or its memo is empty.
	tags [heldMemoSlots]uint32
	next uint8
	// The memos start a cache line after the tags: a holder that puts
	// HeldMemos at a line's start has the tags in one line and each
	// memo in two whole ones (guard's session memo does:
	// TestHeldMemosLineAligned), where memos 24 bytes in would each
	// straddle three.
	_ [64 - 4*heldMemoSlots - 1]byte
	m [heldMemoSlots]HeldMemo
}

// Find is the one lookup of a memo check: the memo of ms for the lock on
// (ns, id), and hit when the store whose generation counter is counter
// filled it for owner at the counter's present generation, so that what
// it recorded is the store's answer; without a hit, the memo to fill for
// that lock (the one it had, whoever held it, else the next in turn). The lock's key, the costly compare (the memo's key and
// the request's are never at one address), is compared once, in the
// same pass that picks the slot; the id is read through its pointer, not
// copied (docid.ID.KeyAt). A memo for another id, namespace, owner, store or generation
// is never a hit (TestHeldMemosFindComparesEveryField).
func (ms *HeldMemos) Find(counter *atomic.Uint64, owner *Owner, ns namespace.Namespace, id *docid.ID) (*HeldMemo, bool) {
	key, tag := id.KeyAt(), id.TagAt()
	free := -1
	for i := range ms.tags {
		if ms.tags[i] != tag {
			continue // another id: the ids of one key have one tag
		}
		m := &ms.m[i]
		if m.key != key || m.ns != ns {
			if m.counter == nil {
				free = i // given to an id of this tag, never filled
			}
			continue
		}
		// An empty slot's counter is nil: never a hit, even for a zero id.
		return m, m.counter == counter && m.gen == counter.Load() && m.bind == owner.Bind &&
			string(m.session) == string(owner.Session)
	}
	// The next slot in turn is given to the id, emptied, so that a slot's
	// tag is always its memo's; an id whose check fills none (not held,
	// or not in the store's memory) keeps the slot it was given rather
	// than taking the other memos' one by one.
	i := free
	if i < 0 {
		i = int(ms.next)
		ms.next = (ms.next + 1) % heldMemoSlots
		ms.tags[i] = tag
		ms.m[i] = HeldMemo{}
	}
	return &ms.m[i], false
}

// HeldTokenMemo answers HeldTokensInto for one id from ms, when the store
// is still at the generation the id's memo was filled at and the lease it
// recorded surely outlasts margin (and, for the cache, its trust): it
// returns the lease left and the token. Otherwise it answers from the
// cache as HeldTokensInto would and fills a memo of ms; false means "ask
// HeldTokensInto", never "not held". The owner and the id are read,
// never kept nor modified: by pointer, as they are too large to copy on
// every write's check.
//
// now is the caller's reading of time.Now, taken with nothing between it
// and this call that may wait (a round trip, a lock's wait): the answer
// is for that instant, the lease left and the cache's trust both
// measured from it, so that the check reads no clock of its own. A
// reading older by a wait would stretch the trust by that wait (the
// guard reads the clock again then: enforce.Checker.Needs). The zero
// Time makes the check read time.Now; any other is taken for one of
// time.Now's, with the monotonic clock (telling them apart, Round(0),
// cost about a third of the reading saved). With an injected clock
// (tests) the store reads its clocks as before.
func (s *Store) HeldTokenMemo(ms *HeldMemos, owner *Owner, ns namespace.Namespace, id *docid.ID, margin time.Duration, now time.Time) (time.Duration, int64, bool) {
	if s.cfg.CacheTrust <= 0 {
		return 0, 0, false
	}
	// A hit needs a memo filled for this owner, namespace and non-zero
	// id, which heldCachedMemo validated then: the checks of the
	// arguments are the miss's alone.
	m, hit := ms.Find(&s.cache.gen, owner, ns, id)
	if hit {
		if b := s.monotonicEstimate(); b != nil && m.confMono {
			if now.IsZero() {
				now = time.Now()
			}
			// One monotonic reading, the caller's, serves both: the
			// server's time (the estimate's, at d after its midpoint)
			// and the time since the confirmation.
			d := now.Sub(b.mid)
			at, unc := b.server.Add(d), b.uncertaintyAfter(d)
			if left, ok := m.LeaseLeft(s.epoch, at, unc, margin); ok && m.Trusted(s.epoch, now, s.cfg.CacheTrust) {
				return left, m.token, true
			}
			return 0, 0, false
		}
		at, unc, local := s.nowLocal()
		if left, ok := m.LeaseLeft(s.epoch, at, unc, margin); ok && m.Trusted(s.epoch, local, s.cfg.CacheTrust) {
			return left, m.token, true
		}
		return 0, 0, false
	}
	if len(owner.Session) == 0 || id.IsZero() {
		return 0, 0, false
	}
	var token int64
	left, ok := s.heldCachedMemo(owner, ns, *id, margin, &token, m)
	return left, token, ok
}
