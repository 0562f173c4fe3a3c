// Package memstore is an in-memory lock store with the contract of
// lockstore.Store, for tests of what sits on top of it (the guard) that
// must run in milliseconds. The same contract tests (lockstoretest) run
// against it and against the real Store on an embedded FerretDB, so a
// behaviour the fake invents is caught there.
//
// It must never be linked into the proxy binary: it keeps locks in one
// process, which would make enforcement across proxies meaningless.
//
// A Store is safe for concurrent use.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
)

// Config configures a Store; zero values take lockstore's defaults.
type Config struct {
	DefaultLease time.Duration
	MaxLease     time.Duration
	// Clock is the lock store server's clock; nil means the local clock.
	// Leases end by it, so a test can expire them without waiting.
	Clock lockstore.Clock
}

// Store keeps locks in a map under one mutex. All-or-nothing is trivially
// atomic here; what matters is that every answer matches lockstore.Store's.
type Store struct {
	cfg Config
	// local: cfg.Clock is the local clock (localClock), whose readings
	// carry the monotonic clock: a memo's check reads that alone.
	local bool
	// epoch is the origin of the monotonic times in this Store's held
	// memos (lockstore.HeldMemo.Fill): a reading of time.Now, made once.
	epoch time.Time

	mu   sync.Mutex
	recs map[docid.Key]*record
	// gen counts the changes to recs and fail (under mu), for callers'
	// memos (HeldTokenMemo).
	gen atomic.Uint64
	// changed is closed, and replaced, whenever a lock is freed: it wakes
	// the waiters, as lockstore's wait queues do on one instance.
	changed chan struct{}
	// fail, when set, is what every call returns (an outage).
	fail error
	// txns are the transaction records (txn.go).
	txns map[txnKey]*txnRecord
}

type record struct {
	ns        string
	id        docid.ID // as first locked
	owner     *lockstore.Owner
	token     int64
	acquired  time.Time
	expires   time.Time
	lastError string
	updated   time.Time
}

// New returns an empty Store.
func New(cfg Config) *Store {
	if cfg.DefaultLease == 0 {
		cfg.DefaultLease = lockstore.DefaultLease
	}
	if cfg.MaxLease == 0 {
		cfg.MaxLease = lockstore.DefaultMaxLease
	}
	local := cfg.Clock == nil
	if local {
		cfg.Clock = localClock{}
	}
	return &Store{cfg: cfg, local: local, epoch: time.Now(), recs: map[docid.Key]*record{}, changed: make(chan struct{})}
}

type localClock struct{}

func (localClock) Now() (time.Time, time.Duration) { return time.Now(), 0 }

// SetUnavailable makes every later call fail as an unreachable lock store
// does (errors.Is(err, lockstore.ErrUnavailable)); nil heals it.
func (s *Store) SetUnavailable(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cause != nil {
		cause = fmt.Errorf("%w: memstore: %w", lockstore.ErrUnavailable, cause)
	}
	s.gen.Add(1)
	s.fail = cause
}

type key struct {
	rid docid.Key
	id  docid.ID
}

// keys validates like lockstore: a namespace, at least one id, none the
// zero ID; duplicates (as MongoDB compares _id) count once, the first
// spelling wins.
func keys(ns namespace.Namespace, ids []docid.ID) ([]key, error) {
	if ns.IsZero() || strings.IndexByte(ns.String(), 0) >= 0 {
		return nil, fmt.Errorf("%w: bad namespace %q", lockstore.ErrInvalidArgument, ns)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no ids", lockstore.ErrInvalidArgument)
	}
	out := make([]key, 0, len(ids))
	seen := make(map[docid.Key]bool, len(ids))
	n := ns
	for _, id := range ids {
		if id.IsZero() {
			return nil, fmt.Errorf("%w: missing _id value", lockstore.ErrInvalidID)
		}
		rid := docid.KeyOf(n, id)
		if seen[rid] {
			continue
		}
		seen[rid] = true
		out = append(out, key{rid: rid, id: id})
	}
	return out, nil
}

func checkOwner(o lockstore.Owner) error {
	if len(o.Session) == 0 {
		return fmt.Errorf("%w: a lock needs a session (lsid)", lockstore.ErrInvalidArgument)
	}
	return nil
}

func (s *Store) lease(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("%w: negative lease %s", lockstore.ErrInvalidLease, lockstore.FormatMS(d))
	case d == 0:
		return s.cfg.DefaultLease, nil
	case d > s.cfg.MaxLease:
		return 0, fmt.Errorf("%w: lease %s exceeds the maximum (lockstore.maxLeaseMS) of %s", lockstore.ErrInvalidLease, lockstore.FormatMS(d), lockstore.FormatMS(s.cfg.MaxLease))
	}
	return d, nil
}

func ownedBy(r *record, o lockstore.Owner) bool {
	return r.owner != nil && string(r.owner.Session) == string(o.Session) && r.owner.Bind == o.Bind
}

func heldAt(r *record, t time.Time) bool { return r.owner != nil && r.expires.After(t) }

func holder(r *record) lockstore.Holder {
	h := lockstore.Holder{ExpiresAt: r.expires, Token: r.token}
	if r.owner != nil {
		h.App, h.Client, h.User, h.Implicit = r.owner.App, r.owner.Client, r.owner.User, r.owner.Implicit
		h.SessionPrefix = lockstore.SessionPrefix(r.owner.Session)
	}
	return h
}

// notifyLocked wakes every waiter.
func (s *Store) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Acquire implements lockstore.Store.Acquire.
func (s *Store) Acquire(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error) {
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	lease, err := s.lease(lease)
	if err != nil {
		return nil, err
	}
	if wait < 0 {
		return nil, fmt.Errorf("%w: negative wait %s", lockstore.ErrInvalidArgument, lockstore.FormatMS(wait))
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, err
	}
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		locks, changed, err := s.tryAll(owner, ns, ks, lease)
		var he *lockstore.HeldError
		if wait == 0 || !errors.As(err, &he) {
			return locks, err
		}
		// A lease that ends by the injected clock wakes nobody: look
		// again shortly as well as on every release.
		poll := time.NewTimer(5 * time.Millisecond)
		select {
		case <-changed:
		case <-poll.C:
		case <-deadline:
			poll.Stop()
			he.Timeout = true
			return nil, he
		case <-ctx.Done():
			poll.Stop()
			return nil, ctx.Err() // as lockstore: the caller's own end, not an outage
		}
		poll.Stop()
	}
}

// tryAll takes every key or none, and returns the channel that signals
// the next release.
func (s *Store) tryAll(owner lockstore.Owner, ns namespace.Namespace, ks []key, lease time.Duration) ([]lockstore.Lock, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.changed, s.fail
	}
	now, unc := s.cfg.Clock.Now()
	ordered := append([]key(nil), ks...)
	sort.Slice(ordered, func(i, j int) bool { return ordered[i].rid.ID < ordered[j].rid.ID })
	for _, k := range ordered {
		if r := s.recs[k.rid]; r != nil && r.owner != nil && r.expires.After(now.Add(-unc)) && !ownedBy(r, owner) {
			return nil, s.changed, &lockstore.HeldError{NS: ns, ID: k.id, Holder: holder(r)}
		}
	}
	exp := now.Add(lease).Truncate(time.Millisecond)
	out := make([]lockstore.Lock, len(ks))
	for i, k := range ks {
		r := s.recs[k.rid]
		switch {
		case r == nil:
			// As lockstore: a new key starts at the server clock in
			// nanoseconds, above any token of an earlier life of the key.
			r = &record{ns: ns.String(), id: k.id, token: now.UnixNano()}
			s.recs[k.rid] = r
			r.acquired = now
		case r.owner != nil && r.expires.After(now.Add(-unc)):
			// Re-entrant: same token.
		default:
			r.token++
			r.acquired = now
		}
		o := owner
		o.Session = append([]byte(nil), owner.Session...)
		r.owner, r.expires, r.updated = &o, exp, now
		s.gen.Add(1)
		out[i] = lockstore.Lock{ID: k.id, Token: r.token, ExpiresAt: exp, LastError: r.lastError}
	}
	return out, s.changed, nil
}

// Renew implements lockstore.Store.Renew.
func (s *Store) Renew(_ context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error) {
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	lease, err := s.lease(lease)
	if err != nil {
		return nil, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	now, _ := s.cfg.Clock.Now()
	var out []lockstore.Lock
	var missing []docid.ID
	var why []string
	for _, k := range ks {
		r := s.recs[k.rid]
		switch {
		case r != nil && ownedBy(r, owner) && heldAt(r, now):
			r.expires, r.updated = now.Add(lease).Truncate(time.Millisecond), now
			s.gen.Add(1)
			out = append(out, lockstore.Lock{ID: k.id, Token: r.token, ExpiresAt: r.expires, LastError: r.lastError})
			continue
		case r == nil:
			why = append(why, "it was never taken")
		case heldAt(r, now):
			why = append(why, "another session holds it now")
		default:
			why = append(why, "its lease ended at "+r.expires.UTC().Format(time.RFC3339Nano))
		}
		missing = append(missing, k.id)
	}
	if len(missing) > 0 {
		return out, &lockstore.NotHolderError{NS: ns, IDs: missing, Why: why}
	}
	return out, nil
}

// Release implements lockstore.Store.Release.
func (s *Store) Release(_ context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	n := 0
	for _, k := range ks {
		if r := s.recs[k.rid]; r != nil && ownedBy(r, owner) {
			s.freeLocked(r, errText)
			n++
		}
	}
	if n > 0 {
		s.notifyLocked()
	}
	return n, nil
}

func (s *Store) freeLocked(r *record, errText string) {
	now, _ := s.cfg.Clock.Now()
	r.owner, r.expires, r.acquired, r.updated = nil, time.Time{}, time.Time{}, now
	s.gen.Add(1)
	r.lastError = errText
}

// ReleaseAll implements lockstore.Store.ReleaseAll.
func (s *Store) ReleaseAll(_ context.Context, owner lockstore.Owner, ns namespace.Namespace, errText string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	if ns.IsZero() {
		return 0, fmt.Errorf("%w: no namespace", lockstore.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	n := 0
	for _, r := range s.recs {
		if r.ns == ns.String() && ownedBy(r, owner) {
			s.freeLocked(r, errText)
			n++
		}
	}
	if n > 0 {
		s.notifyLocked()
	}
	return n, nil
}

// ReleaseSession implements lockstore.Store.ReleaseSession: every lock of
// the session, whatever its binding; lastError is kept.
func (s *Store) ReleaseSession(_ context.Context, session []byte) (int, error) {
	if len(session) == 0 {
		return 0, fmt.Errorf("%w: no session", lockstore.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	n := 0
	for _, r := range s.recs {
		if r.owner != nil && string(r.owner.Session) == string(session) {
			s.freeLocked(r, r.lastError)
			n++
		}
	}
	if n > 0 {
		s.notifyLocked()
	}
	return n, nil
}

// Status implements lockstore.Store.Status.
func (s *Store) Status(_ context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	now, _ := s.cfg.Clock.Now()
	out := make([]lockstore.Status, len(ks))
	for i, k := range ks {
		out[i] = lockstore.Status{NS: ns, ID: k.id}
		r := s.recs[k.rid]
		if r == nil {
			continue
		}
		st := &out[i]
		st.Token, st.LastError, st.UpdatedAt = r.token, r.lastError, r.updated
		if heldAt(r, now) {
			st.Held, st.Holder, st.Since, st.ExpiresAt = true, holder(r), r.acquired, r.expires
			st.HeldByYou = ownedBy(r, owner)
		}
	}
	return out, nil
}

// Holds implements lockstore.Store.Holds: fail closed, margin measured on
// the clock.
func (s *Store) Holds(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error) {
	_, _, missing, err := s.HeldTokens(ctx, owner, ns, ids, margin)
	if err != nil {
		return false, nil, err
	}
	return len(missing) == 0, missing, nil
}

// HeldTokens implements lockstore.Store.HeldTokens.
func (s *Store) HeldTokens(_ context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error) {
	if err := checkOwner(owner); err != nil {
		return nil, 0, nil, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, 0, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, 0, nil, s.fail
	}
	now, unc := s.cfg.Clock.Now()
	need := now.Add(unc + margin)
	byKey := make(map[docid.Key]int64, len(ks))
	var earliest time.Time
	var missing []docid.ID
	for _, k := range ks {
		r := s.recs[k.rid]
		if r == nil || !ownedBy(r, owner) || !r.expires.After(need) {
			missing = append(missing, k.id)
			continue
		}
		byKey[k.rid] = r.token
		if end := r.expires.Add(-unc); earliest.IsZero() || end.Before(earliest) {
			earliest = end
		}
	}
	if len(missing) > 0 {
		return nil, 0, missing, nil
	}
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = byKey[docid.KeyOf(ns, id)]
	}
	return out, earliest.Sub(now), nil, nil
}

// HeldTokensInto implements HeldTokens writing into tokens (len(ids)
// long); one id, the usual write, is answered without an allocation.
func (s *Store) HeldTokensInto(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration, tokens []int64) (time.Duration, []docid.ID, error) {
	if len(ids) != 1 || len(tokens) != 1 || ns.IsZero() || strings.IndexByte(ns.String(), 0) >= 0 || ids[0].IsZero() || len(owner.Session) == 0 {
		toks, left, missing, err := s.HeldTokens(ctx, owner, ns, ids, margin)
		if err != nil || len(missing) > 0 {
			return 0, missing, err
		}
		copy(tokens, toks)
		return left, nil, nil
	}
	rid := docid.KeyOf(ns, ids[0])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, nil, s.fail
	}
	now, unc := s.cfg.Clock.Now()
	r := s.recs[rid]
	if r == nil || !ownedBy(r, owner) || !r.expires.After(now.Add(unc+margin)) {
		return 0, ids[:1:1], nil
	}
	tokens[0] = r.token
	return r.expires.Add(-unc).Sub(now), nil, nil
}

// HeldTokenMemo is lockstore.Store.HeldTokenMemo: HeldTokensInto for one
// id answered from the caller's memos ms while the store is unchanged
// since the id's memo was filled, else from the store (filling a memo);
// false means "ask HeldTokensInto", never "not held". On the local clock
// the answer is for the caller's reading now (lockstore's contract), so
// a hit reads no clock.
func (s *Store) HeldTokenMemo(ms *lockstore.HeldMemos, owner *lockstore.Owner, ns namespace.Namespace, id *docid.ID, margin time.Duration, now time.Time) (time.Duration, int64, bool) {
	// A hit needs a memo this store filled for the same owner, namespace
	// and id, all validated when it filled it (below): the arguments'
	// checks are the miss's alone.
	m, hit := ms.Find(&s.gen, owner, ns, id)
	if hit {
		if s.local {
			// The lease's end is a monotonic reading (below), read at
			// the caller's monotonic reading: no clock read here, as
			// lockstore's memo check reads none.
			if now.IsZero() {
				now = time.Now()
			}
			if left, ok := m.LeaseLeft(s.epoch, now, 0, margin); ok {
				return left, m.Token(), true
			}
			return 0, 0, false
		}
		at, unc := s.cfg.Clock.Now()
		if left, ok := m.LeaseLeft(s.epoch, at, unc, margin); ok {
			return left, m.Token(), true
		}
		return 0, 0, false
	}
	if len(owner.Session) == 0 || id.IsZero() || ns.IsZero() || strings.IndexByte(ns.String(), 0) >= 0 {
		return 0, 0, false
	}
	rid := docid.KeyOf(ns, *id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, 0, false
	}
	at, unc := s.cfg.Clock.Now()
	r := s.recs[rid]
	if r == nil || !ownedBy(r, *owner) || !r.expires.After(at.Add(unc+margin)) {
		return 0, 0, false
	}
	expires := r.expires
	if s.local {
		// The lease's end as a local monotonic reading: its time left
		// from at, on the monotonic clock (at is time.Now's reading;
		// r.expires, truncated, has none).
		expires = at.Add(r.expires.Sub(at))
	}
	m.Fill(&s.gen, s.gen.Load(), owner, ns, id.Key(), expires, r.token, time.Time{}, s.epoch)
	return r.expires.Add(-unc).Sub(at), r.token, true
}

// MayHoldLocks reports whether a lock may be held in ns, as
// lockstore.Store's does, but exactly: the store keeps every lock in
// memory. An unavailable store (SetUnavailable) answers true, so that the check it
// would have skipped is made and fails. With it, the guard skips the
// per-_id checks of inserts into a namespace where nothing is locked on
// this store as on the real one, and a check asked of the wrong
// namespace shows in the tests that use this store.
func (s *Store) MayHoldLocks(ns namespace.Namespace) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return true
	}
	now, _ := s.cfg.Clock.Now()
	for _, r := range s.recs {
		if r.ns == ns.String() && heldAt(r, now) {
			return true
		}
	}
	return false
}

// MayBeHeldIn implements lockstore.Store.MayBeHeldIn: the _ids held in
// ns now, as first locked, at most limit of them (complete: all are).
func (s *Store) MayBeHeldIn(_ context.Context, ns namespace.Namespace, limit int) ([]docid.ID, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, false, s.fail
	}
	now, _ := s.cfg.Clock.Now()
	var ids []docid.ID
	for _, r := range s.recs {
		if r.ns != ns.String() || !heldAt(r, now) {
			continue
		}
		if len(ids) == limit {
			return ids, false, nil
		}
		ids = append(ids, r.id)
	}
	return ids, true, nil
}
