package lockstore

import (
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
	counter   *atomic.Uint64
	gen       uint64
	session   []byte // the owner key, shared: owner keys are never modified
	bind      string
	ns        namespace.Namespace
	key       string
	expires   time.Time // the lease's end, on the store's clock
	token     int64
	confirmed time.Time // local; zero where the store keeps no such time
	// mono: confirmed carries a monotonic clock reading (a store's
	// monotonic check needs one).
	mono bool
}

// Fill records a lock check that the store whose generation counter is
// counter, at generation gen, answered from memory: owner holds (ns, the
// id of key) until expires with token, and the store's memory of it was
// confirmed at local time confirmed.
func (m *HeldMemo) Fill(counter *atomic.Uint64, gen uint64, owner *Owner, ns namespace.Namespace, key string, expires time.Time, token int64, confirmed time.Time) {
	*m = HeldMemo{counter: counter, gen: gen, session: owner.Session, bind: owner.Bind, ns: ns, key: key,
		expires: expires, token: token, confirmed: confirmed, mono: hasMonotonic(confirmed)}
}

// Recorded is what Fill recorded: the lease's end, the token and the
// confirmation. Only a memo HeldMemos.Find found for the store, its
// generation, the owner and the lock answers for them.
func (m *HeldMemo) Recorded() (expires time.Time, token int64, confirmed time.Time) {
	return m.expires, m.token, m.confirmed
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
	m    [heldMemoSlots]HeldMemo
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
		expires, token, confirmed := m.Recorded()
		if b := s.monotonicEstimate(); b != nil && m.mono {
			if now.IsZero() {
				now = time.Now()
			}
			// One monotonic reading, the caller's, serves both: the
			// server's time (the estimate's, at d after its midpoint)
			// and the time since the confirmation (d less the
			// confirmation's offset from the midpoint, both monotonic
			// readings).
			d := now.Sub(b.mid)
			at, unc := b.server.Add(d), b.uncertaintyAfter(d)
			if expires.After(at.Add(unc+margin)) && d-confirmed.Sub(b.mid) <= s.cfg.CacheTrust {
				return expires.Add(-unc).Sub(at), token, true
			}
			return 0, 0, false
		}
		at, unc, local := s.nowLocal()
		if expires.After(at.Add(unc+margin)) && local.Sub(confirmed) <= s.cfg.CacheTrust {
			return expires.Add(-unc).Sub(at), token, true
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
