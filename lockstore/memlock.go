package lockstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// Memory locks (docs/ENFORCEMENT.md, "Writers that hold no lock"). While a
// Store knows it is alone on its lock store (instances.go), a legacy
// write's implicit lock may live in its memory only, with no round trip:
//
//   - nobody else can grant unseen: a Store that registers beside this one
//     grants nothing until NewcomerHorizon (G) after its registration was
//     acknowledged, and this one trusts "alone" for CacheTrust after the
//     read that found it alone was sent. A memory lock taken under that
//     read gives its write until that read + G − memoryMargin: the write's
//     maxTimeMS is capped there, so the database has finished it before
//     any newcomer grants, even if this Store dies (the lease's role for a
//     store lock). Close keeps the registry record while such a write may
//     run, so that a newcomer still waits G;
//   - no lock may be held in the namespace: the grant view below knows
//     every generation written through this Store and every unexpired
//     claim written before this Store became alone (a read of the claims,
//     which decide every grant; head documents can lag or go back), and
//     the held-namespaces view of the head records (heldns.go) shows none
//     either (the janitor deletes claims older than CleanupAfter, even
//     the newest of a key leased for longer);
//   - acquires through this Store and memory locks exclude each other
//     under memLocks.mu: an acquire refuses or waits for a memory-locked
//     key, and no memory lock is taken in a namespace while an acquire
//     through this Store runs there, or while a local waiter waits for the
//     key (first come, first served);
//   - lockStatus, List (/locks, the console) and the insert check
//     (MayHoldLocks, ConfirmedStatus) show memory locks as held.
//
// A memory lock has no fencing token: fenced rules take store locks.

// DefaultNewcomerHorizon is Config.NewcomerHorizon's default.
const DefaultNewcomerHorizon = 3 * time.Second

// minMemoryBudget is the least time a write under a memory lock may be
// given: below it memory locks are not used (the horizon is too short for
// the trust period).
const minMemoryBudget = 250 * time.Millisecond

// memoryMargin is what a memory lock's write budget keeps back from the
// horizon: the write's bytes still travel to the database after the cap is
// computed, and two machines' clocks may run at rates that differ (by up to
// 1/64, the margin quiesce allows too).
func (s *Store) memoryMargin() time.Duration {
	return 250*time.Millisecond + s.cfg.NewcomerHorizon/64
}

// grantHorizon is how long after its registration was acknowledged a
// Store that found others registered waits before its first grant.
func (s *Store) grantHorizon() time.Duration {
	g := max(s.cfg.NewcomerHorizon, s.cfg.CacheTrust)
	return g + g/64 + time.Millisecond
}

// memoryEnabled tells whether this Store may take memory locks at all.
func (s *Store) memoryEnabled() bool {
	return s.cfg.CacheTrust > 0 && s.cfg.NewcomerHorizon-s.cfg.CacheTrust-s.memoryMargin() >= minMemoryBudget
}

// memLock is one implicit lock held in memory.
type memLock struct {
	owner Owner
	ns    string
	id    docid.ID
	since time.Time // server time it was taken
	end   time.Time // local time by which its write has surely ended
	// gone, made by the first force-release that waits for the lock, is
	// closed when it ends (most memory locks have no waiter of that kind).
	gone chan struct{}
}

// memLocks are the memory locks of a Store, and the acquires through it
// that are in flight, under one mutex.
type memLocks struct {
	mu        sync.Mutex
	held      map[string]*memLock // by record id
	acquiring map[string]int      // namespace -> acquires in flight
	// last is the latest end of any memory lock taken: until then Close
	// keeps this Store's registry record (a newcomer must wait G).
	last time.Time
}

// liveLocked returns the memory lock on rid, dropping one whose end has
// passed (its write was surely over; the guard releases it at its answer,
// this only keeps a lost release from blocking the key forever).
func (m *memLocks) liveLocked(rid string, now time.Time) *memLock {
	l := m.held[rid]
	if l != nil && now.After(l.end) {
		m.dropLocked(rid, l)
		return nil
	}
	return l
}

// dropLocked forgets the memory lock l on rid; m.mu is held.
func (m *memLocks) dropLocked(rid string, l *memLock) {
	delete(m.held, rid)
	if l.gone != nil {
		close(l.gone)
	}
}

// holder renders a memory lock as a holder; its lease end is the end of
// its write's budget on the server's clock.
func (s *Store) memHolder(l *memLock) Holder {
	now, _ := s.clock.Now()
	return Holder{App: l.owner.App, Client: l.owner.Client, User: l.owner.User, SessionPrefix: SessionPrefix(l.owner.Session),
		ExpiresAt: now.Add(time.Until(l.end)).Truncate(time.Millisecond), Implicit: l.owner.Implicit}
}

// AcquireInMemory takes the locks on ids in ns for an implicit owner in
// this Store's memory, with no round trip, when that is sound (see above);
// otherwise ok is false and nothing is taken: the caller takes store locks
// as usual. budget is how long from now the write under these locks must
// have ended (its maxTimeMS is capped at it). The locks carry no token.
func (s *Store) AcquireInMemory(owner Owner, ns namespace.Namespace, ids []docid.ID) (locks []Lock, budget time.Duration, ok bool) {
	if owner.Implicit == "" || len(owner.Session) == 0 || !s.memoryEnabled() || !s.setupDone.Load() || s.closed.Load() {
		return nil, 0, false
	}
	ks, err := keys(ns, ids)
	if err != nil || len(ks) == 0 {
		return nil, 0, false
	}
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	from, alone := s.aloneRead(now)
	// Both views: the claims decide every grant, but the janitor deletes
	// claims CleanupAfter after they were written, even the newest of a
	// key whose lease is longer; its head record still shows it.
	if !alone || s.mem.acquiring[ns.String()] > 0 || s.gview.mayHold(ns, s.aloneFrom(), s.clock) || s.heldNS.mayHold(ns, now) {
		s.m.memoryLocks.WithLabelValues("store").Inc()
		return nil, 0, false
	}
	for _, k := range ks {
		if s.mem.liveLocked(k.rid, now) != nil || s.wq.waiting(k.rid) > 0 {
			s.m.memoryLocks.WithLabelValues("store").Inc()
			return nil, 0, false
		}
	}
	end := from.Add(s.cfg.NewcomerHorizon - s.memoryMargin())
	budget = end.Sub(now)
	if budget < minMemoryBudget {
		s.m.memoryLocks.WithLabelValues("store").Inc()
		return nil, 0, false
	}
	snow, _ := s.clock.Now()
	if s.mem.held == nil {
		s.mem.held = map[string]*memLock{}
	}
	exp := snow.Add(budget).Truncate(time.Millisecond)
	locks = make([]Lock, len(ks))
	for i, k := range ks {
		s.mem.held[k.rid] = &memLock{owner: owner, ns: ns.String(), id: k.id, since: snow, end: end}
		locks[i] = Lock{ID: k.id, ExpiresAt: exp}
	}
	if end.After(s.mem.last) {
		s.mem.last = end
	}
	s.m.memoryLocks.WithLabelValues("memory").Inc()
	return locks, budget, true
}

// releaseMemory frees the memory locks of owner among rids and returns
// how many it freed and the record ids it did not hold in memory.
func (s *Store) releaseMemory(owner Owner, rids []string) (n int, rest []string) {
	if owner.Implicit == "" {
		return 0, rids
	}
	s.mem.mu.Lock()
	for _, rid := range rids {
		if l := s.mem.held[rid]; l != nil && string(l.owner.Session) == string(owner.Session) {
			s.mem.dropLocked(rid, l)
			n++
			continue
		}
		rest = append(rest, rid)
	}
	s.mem.mu.Unlock()
	return n, rest
}

// renewMemory answers a renewal of memory locks: they cannot be extended
// past their write's budget, which the write's maxTimeMS already keeps to;
// they are returned as they are. rest are the keys not held in memory.
func (s *Store) renewMemory(owner Owner, ks []lockKey) (out []Lock, rest []lockKey) {
	if owner.Implicit == "" {
		return nil, ks
	}
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	for _, k := range ks {
		if l := s.mem.liveLocked(k.rid, now); l != nil && string(l.owner.Session) == string(owner.Session) {
			out = append(out, Lock{ID: k.id, ExpiresAt: s.memHolder(l).ExpiresAt})
			continue
		}
		rest = append(rest, k)
	}
	return out, rest
}

// startAcquire registers an acquire attempt of keys in ns, unless one of
// them is memory-locked (then the *HeldError names its holder). doneAcquire
// must follow a nil error.
func (s *Store) startAcquire(ns namespace.Namespace, ordered []lockKey) error {
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	for _, k := range ordered {
		if l := s.mem.liveLocked(k.rid, now); l != nil {
			return &HeldError{NS: ns, ID: k.id, Holder: s.memHolder(l)}
		}
	}
	if s.mem.acquiring == nil {
		s.mem.acquiring = map[string]int{}
	}
	s.mem.acquiring[ns.String()]++
	return nil
}

func (s *Store) doneAcquire(ns namespace.Namespace) {
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	if s.mem.acquiring[ns.String()]--; s.mem.acquiring[ns.String()] <= 0 {
		delete(s.mem.acquiring, ns.String())
	}
}

// memStatus overlays the memory locks among ks on sts (one per key).
func (s *Store) memStatus(owner *Owner, ks []lockKey, sts []Status) {
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	if len(s.mem.held) == 0 {
		return
	}
	for i, k := range ks {
		l := s.mem.liveLocked(k.rid, now)
		if l == nil {
			continue
		}
		h := s.memHolder(l)
		sts[i].Held, sts[i].Holder, sts[i].Since, sts[i].ExpiresAt = true, h, l.since, h.ExpiresAt
		sts[i].HeldByYou = owner != nil && len(owner.Session) > 0 && string(owner.Session) == string(l.owner.Session)
		sts[i].ForceReleased, sts[i].ForceReason = false, ""
	}
}

// memList returns the memory locks in ns ("" for all) as statuses, with
// their record ids.
func (s *Store) memList(ns namespace.Namespace) (rids []string, sts []Status) {
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	for rid := range s.mem.held {
		l := s.mem.liveLocked(rid, now)
		if l == nil || (!ns.IsZero() && l.ns != ns.String()) {
			continue
		}
		rids = append(rids, rid)
	}
	slices.Sort(rids)
	for _, rid := range rids {
		l := s.mem.held[rid]
		h := s.memHolder(l)
		sts = append(sts, Status{NS: namespace.Of(l.ns), ID: l.id, Held: true, Holder: h, Since: l.since, ExpiresAt: h.ExpiresAt, UpdatedAt: l.since})
	}
	return rids, sts
}

// forceMemory is ForceRelease of a key held in memory: held reports
// whether it was, and st is then the lock's status before. A memory lock
// has no fencing token and its write may land until the lock ends (its
// write answered and released, or its end passed), so it is not ended
// early: an acquirer granted at once could see that write land inside its
// own work (docs/SECURITY.md). forceMemory waits for it to end instead,
// bounded by ctx (a *MemoryHeldError then), as the admin API waits for a
// store lock's writes in flight. The lock store is left alone: it holds
// nothing on a key held in memory, and whoever takes the key after the
// memory lock ended is not the holder the operator meant to free.
func (s *Store) forceMemory(ctx context.Context, ns namespace.Namespace, k lockKey, reason string) (st Status, held bool, err error) {
	s.mem.mu.Lock()
	l := s.mem.liveLocked(k.rid, time.Now())
	if l == nil {
		s.mem.mu.Unlock()
		return Status{}, false, nil
	}
	h := s.memHolder(l)
	st = Status{NS: ns, ID: k.id, Held: true, Holder: h, Since: l.since, ExpiresAt: h.ExpiresAt, UpdatedAt: l.since}
	if l.gone == nil {
		l.gone = make(chan struct{})
	}
	gone := l.gone
	s.mem.mu.Unlock()
	t := time.NewTimer(time.Until(l.end))
	defer t.Stop()
	select {
	case <-gone:
	case <-t.C:
		// Its write has surely ended (its release was lost, or is yet
		// to run): drop it now, so that no view shows it any more.
		s.mem.mu.Lock()
		if s.mem.held[k.rid] == l {
			s.mem.dropLocked(k.rid, l)
		}
		s.mem.mu.Unlock()
		s.wq.notify(k.rid)
	case <-ctx.Done():
		return st, true, &MemoryHeldError{NS: ns, ID: k.id, Holder: h}
	}
	s.log.Warn("force release of a memory lock: waited for its write to end",
		zap.String("ns", ns.String()), zap.Stringer("id", k.id), zap.String("reason", reason),
		zap.String("holderApp", h.App), zap.String("holder", h.SessionPrefix), zap.String("command", h.Implicit))
	return st, true, nil
}

// memStatusOf is the status of a key held in memory; held is false when
// it is not.
func (s *Store) memStatusOf(ns namespace.Namespace, k lockKey) (st Status, held bool) {
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	l := s.mem.liveLocked(k.rid, time.Now())
	if l == nil {
		return Status{}, false
	}
	h := s.memHolder(l)
	return Status{NS: ns, ID: k.id, Held: true, Holder: h, Since: l.since, ExpiresAt: h.ExpiresAt, UpdatedAt: l.since}, true
}

// memHeldIn tells whether a memory lock is held in ns.
func (s *Store) memHeldIn(ns namespace.Namespace) bool {
	now := time.Now()
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	for rid, l := range s.mem.held {
		if s.mem.liveLocked(rid, now) != nil && l.ns == ns.String() {
			return true
		}
	}
	return false
}

// memWritesMayRun tells whether a write under a memory lock of this Store
// may still be running: Close then keeps the registry record.
func (s *Store) memWritesMayRun() bool {
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	return time.Now().Before(s.mem.last)
}

// grantView knows, for the memory-lock decision, which namespaces may have
// a held lock: from every generation this Store writes (a grant is marked
// before its claim is inserted, and stays marked until a newer generation
// of the key written through this Store frees it or its lease has ended),
// and from a read of the unexpired claims sent after this Store last
// became alone (claims, not head documents: a head can lag behind its
// claims or be moved back by a slow writer of an older generation).
type grantView struct {
	mu   sync.Mutex
	keys map[string]*viewKey // by record id
	// live counts, per namespace, the keys that may be held: those in
	// keys, each of which is pending, leased or unknown. A key leaves keys
	// (and the count) when its last generation through this Store freed
	// it, or when prune finds its lease over; so keys holds no more than
	// the locks granted through this Store that may still be held.
	live map[string]int
	// scanned is the local time the last read of the claims was sent,
	// scanNS what it found: per namespace, the latest lease end (server
	// time, with TakeoverGrace) of a claim that names a holder.
	scanned time.Time
	scanNS  map[string]time.Time
}

type viewKey struct {
	ns      string
	seq     int64     // generation last landed through this Store
	until   time.Time // its lease end with TakeoverGrace (server time); zero: free
	pending int       // grants being written
	// unknown is the latest lease end of grants whose write failed: they
	// may have landed.
	unknown time.Time
}

func (v *grantView) keyLocked(rid, ns string) *viewKey {
	if v.keys == nil {
		v.keys = map[string]*viewKey{}
		v.live = map[string]int{}
	}
	k := v.keys[rid]
	if k == nil {
		k = &viewKey{ns: ns}
		v.keys[rid] = k
		v.live[ns]++
	}
	return k
}

// dropLocked forgets rid's key once nothing of it may be held.
func (v *grantView) dropLocked(rid string, k *viewKey) {
	if k.pending > 0 || !k.until.IsZero() || !k.unknown.IsZero() {
		return
	}
	delete(v.keys, rid)
	if v.live[k.ns]--; v.live[k.ns] <= 0 {
		delete(v.live, k.ns)
	}
}

// prune forgets the leases that ended before floor (server time): run
// with the periodic refreshes, it keeps keys to the locks that may still
// be held, whether or not memory locks are in use.
func (v *grantView) prune(floor time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for rid, k := range v.keys {
		if !k.until.After(floor) {
			k.until = time.Time{}
		}
		if !k.unknown.After(floor) {
			k.unknown = time.Time{}
		}
		v.dropLocked(rid, k)
	}
}

// ownMayHold tells whether a lock granted in ns through this Store may be
// held: one being written, leased, or whose write failed (it may have
// landed). It answers from the generations, not the head documents, which
// a slower writer of an older generation can move back to "free" and a
// failed head write leaves behind their claims: the insert check must not
// rely on them alone (MayHoldLocks). Errs towards "may hold" until prune
// has seen a lease end.
func (v *grantView) ownMayHold(ns namespace.Namespace) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.live[ns.String()] > 0
}

// writing marks a generation about to be inserted; written reports its
// outcome (landed, lost to another writer, or unknown on err).
func (v *grantView) writing(g *gen) {
	if g.Owner == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.keyLocked(g.Key, g.NS).pending++
}

func (v *grantView) written(g *gen, grace time.Duration, landed bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.keyLocked(g.Key, g.NS)
	if g.Owner != nil {
		k.pending--
		if err != nil {
			k.unknown = maxTime(k.unknown, g.ExpiresAt.Add(grace))
		}
	}
	if landed && g.Seq > k.seq {
		k.seq = g.Seq
		k.until = time.Time{}
		if g.Owner != nil {
			k.until = g.ExpiresAt.Add(grace)
		}
	}
	v.dropLocked(g.Key, k)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// mayHold tells whether a lock may be held in ns, for a memory lock taken
// now in the alone period that began at local time from: true unless the
// claims were read since then and neither they nor this Store's own
// generations show a lock that may be held there.
func (v *grantView) mayHold(ns namespace.Namespace, from time.Time, c Clock) bool {
	now, unc := c.Now()
	floor := now.Add(-unc)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.scanned.IsZero() || from.IsZero() || v.scanned.Before(from) {
		return true
	}
	if t, ok := v.scanNS[ns.String()]; ok && t.After(floor) {
		return true
	}
	for rid, k := range v.keys {
		if k.pending == 0 && !k.until.After(floor) && !k.unknown.After(floor) {
			k.until, k.unknown = time.Time{}, time.Time{}
			v.dropLocked(rid, k) // nothing left to remember
			continue
		}
		if k.ns == ns.String() {
			return true
		}
	}
	return false
}

// scanClaims reads the namespaces whose unexpired claims name a holder, in
// one round trip, when this Store is alone and has not read them since it
// became so.
func (s *Store) scanClaims(ctx context.Context) {
	if !s.memoryEnabled() {
		return
	}
	from := s.aloneFrom()
	s.gview.mu.Lock()
	done := !s.gview.scanned.IsZero() && !s.gview.scanned.Before(from)
	s.gview.mu.Unlock()
	if from.IsZero() || done {
		return
	}
	sent := time.Now()
	now, unc := s.clock.Now()
	var rows []struct {
		NS        string    `bson:"ns"`
		ExpiresAt time.Time `bson:"expiresAt"`
	}
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		// A find, not a $group: FerretDB has no $max accumulator. It runs
		// once each time this Store becomes alone.
		cur, err := s.claims.Find(ctx, bson.D{
			{Key: "owner", Value: bson.D{{Key: "$ne", Value: nil}}},
			{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now.Add(-unc - s.cfg.TakeoverGrace)}}},
		}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 0}, {Key: "ns", Value: 1}, {Key: "expiresAt", Value: 1}}))
		if err != nil {
			return err
		}
		return cur.All(ctx, &rows)
	})
	if err != nil {
		s.log.Debug("reading the held claims failed; no memory locks until it succeeds", zap.Error(err))
		return
	}
	m := make(map[string]time.Time, len(rows))
	for _, r := range rows {
		m[r.NS] = maxTime(m[r.NS], r.ExpiresAt.Add(s.cfg.TakeoverGrace))
	}
	s.gview.mu.Lock()
	s.gview.scanned, s.gview.scanNS = sent, m
	s.gview.mu.Unlock()
}
