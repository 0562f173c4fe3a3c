package lockstore

import (
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
	store     any
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

// Fill records a lock check that store, at generation gen, answered from
// memory: owner holds (ns, the id of key) until expires with token, and
// the store's memory of it was confirmed at local time confirmed.
func (m *HeldMemo) Fill(store any, gen uint64, owner *Owner, ns namespace.Namespace, key string, expires time.Time, token int64, confirmed time.Time) {
	*m = HeldMemo{store: store, gen: gen, session: owner.Session, bind: owner.Bind, ns: ns, key: key,
		expires: expires, token: token, confirmed: confirmed, mono: hasMonotonic(confirmed)}
}

// Match returns what Fill recorded when it was filled by store at
// generation gen for the same owner, namespace and id key; false else.
func (m *HeldMemo) Match(store any, gen uint64, owner *Owner, ns namespace.Namespace, key string) (expires time.Time, token int64, confirmed time.Time, ok bool) {
	if m.store != store || m.gen != gen || m.ns != ns || m.key != key || m.bind != owner.Bind ||
		string(m.session) != string(owner.Session) {
		return time.Time{}, 0, time.Time{}, false
	}
	return m.expires, m.token, m.confirmed, true
}

// Of reports whether m was filled for the lock on (ns, id), whoever
// holds it: which of a caller's memos to hand the store.
func (m *HeldMemo) Of(ns namespace.Namespace, id docid.ID) bool {
	return m.store != nil && m.key == id.Key() && m.ns == ns
}

// HeldTokenMemo answers HeldTokensInto for one id from m, when the store
// is still at the generation m was filled at and the lease it recorded
// surely outlasts margin (and, for the cache, its trust): it returns the
// lease left and the token. Otherwise it answers from the cache as
// HeldTokensInto would and fills m; false means "ask HeldTokensInto",
// never "not held". The owner is read, never kept nor modified: by
// pointer, as it is too large to copy on every write's check.
func (s *Store) HeldTokenMemo(m *HeldMemo, owner *Owner, ns namespace.Namespace, id docid.ID, margin time.Duration) (time.Duration, int64, bool) {
	if s.cfg.CacheTrust <= 0 || len(owner.Session) == 0 || id.IsZero() {
		return 0, 0, false
	}
	if expires, token, confirmed, ok := m.Match(s, s.cache.gen.Load(), owner, ns, id.Key()); ok {
		if b := s.monotonicEstimate(); b != nil && m.mono {
			// One reading of the monotonic clock serves both: the server's
			// time (the estimate's, at d after its midpoint) and the time
			// since the confirmation (d less the confirmation's offset
			// from the midpoint, both monotonic readings).
			d := time.Since(b.mid)
			now, unc := b.server.Add(d), b.uncertaintyAfter(d)
			if expires.After(now.Add(unc+margin)) && d-confirmed.Sub(b.mid) <= s.cfg.CacheTrust {
				return expires.Add(-unc).Sub(now), token, true
			}
			return 0, 0, false
		}
		now, unc, local := s.nowLocal()
		if expires.After(now.Add(unc+margin)) && local.Sub(confirmed) <= s.cfg.CacheTrust {
			return expires.Add(-unc).Sub(now), token, true
		}
		return 0, 0, false
	}
	var token int64
	left, ok := s.heldCachedMemo(owner, ns, id, margin, &token, m)
	return left, token, ok
}
