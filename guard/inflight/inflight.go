// Package inflight tracks the enforced writes a proxy forwarded and has
// not seen answered (docs/ENFORCEMENT.md, "Writes in flight"): it keeps
// their locks from lapsing (renewing them), lets a release of their
// session or an operator's force-release of their lock wait for them, and
// refuses the launch of a lock holder's write whose lock a force-release
// may have freed since it was checked. It is its own unit, below the
// enforcement stage that launches writes and the lock commands and
// sessions that wait for them; it knows nothing of policies or verdicts,
// only owners, lock ids and leases.
package inflight

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Locks are lock ids by namespace: a slice, as a write's locks are in
// one namespace or very few.
type Locks []NSIDs

// NSIDs are the ids of the locks in one namespace.
type NSIDs struct {
	NS  namespace.Namespace
	IDs []docid.ID
}

// Add appends ids to ns's; they are shared until appended to.
func (l *Locks) Add(ns namespace.Namespace, ids []docid.ID) {
	for i := range *l {
		if (*l)[i].NS.String() == ns.String() {
			(*l)[i].IDs = append((*l)[i].IDs, ids...)
			return
		}
	}
	*l = append(*l, NSIDs{NS: ns, IDs: slices.Clip(ids)})
}

// Get returns the ids of ns.
func (l Locks) Get(ns namespace.Namespace) []docid.ID {
	ids, _ := l.Lookup(ns)
	return ids
}

// Lookup returns the ids of ns, and whether ns is among l.
func (l Locks) Lookup(ns namespace.Namespace) ([]docid.ID, bool) {
	for _, x := range l {
		if x.NS.String() == ns.String() {
			return x.IDs, true
		}
	}
	return nil, false
}

// Renewer renews locks: the lock store's Renew.
type Renewer interface {
	Renew(ctx context.Context, owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error)
}

// Config is what a Tracker needs from outside.
type Config struct {
	// Store renews the locks of writes still unanswered.
	Store Renewer
	// MaxInFlight bounds how long a write's locks are renewed after it
	// left.
	MaxInFlight time.Duration
	Log         *zap.Logger
	// Renewals counts renewals (lockgate_inflight_renewals_total, owned
	// by the guard's metrics).
	Renewals prometheus.Counter
	// Now is the clock of flight starts and renewal bounds; nil means
	// time.Now. The timers that fire renewals are the runtime's.
	Now func() time.Time
}

// Tracker knows, per lock owner session, the enforced writes this proxy
// forwarded and has not yet seen answered (or, abandoned, that the
// database may still be running). It is safe for concurrent use.
//
// A write's launch and landing take only its session's mutex, given the
// session's entry (Flight.Session, kept by a caller that writes in one
// session again): the tracker's own mutex, which every connection would
// contend for, is taken for a session's first write, to arm the renewal
// timer earlier, and for what force-releases, renewals and waits need.
// Lock order: the tracker's mu, then a session's.
type Tracker struct {
	cfg       Config
	mu        sync.Mutex
	bySession map[string]*Session
	// renewals is one timer for the first renewal of every flight, armed
	// for the earliest one due (at armed, in nanoseconds since epoch as
	// sinceEpoch counts them; 0 when idle): a timer per write would cost
	// each write an allocation and two operations on the runtime's timer
	// heap, for a renewal that almost never happens. armedAt is armed for
	// launches to read without mu: changed under mu.
	renewals *time.Timer
	armed    int64
	armedAt  atomic.Int64
	epoch    time.Time
	// forceSeq counts the starts and ends of force-releases (changed
	// under mu, read without it by lock checks); forced are those under
	// way or that a write still taking implicit locks may have met, and
	// the last keepForced ended ones, for lock holders' writes checked
	// before they ended (forcedSinceLocked); forgotten is the latest end
	// among those forgotten since. taking counts the writes taking
	// implicit locks by the forceSeq they started at (Took).
	forceSeq  atomic.Uint64
	forcing   atomic.Int64 // force-releases under way (changed under mu)
	forced    []*forcedKey
	forgotten uint64
	taking    map[uint64]int
}

// Session is a lock owner session's entry in the tracker: its writes in
// flight. A caller may keep it for the session's next write
// (Flight.Session); the tracker drops idle entries past a bound, and a
// launch given a dropped one finds the session's current entry instead.
type Session struct {
	// key is the session's owner key as a string, the map's key: kept
	// while the session is idle, so that its next write allocates none.
	key string
	t   *Tracker
	mu  sync.Mutex
	// all is a slice: a session has one write in flight, or very few.
	all []*Flight
	// idle, made by the first waiter (most flights have none), is closed
	// when all becomes empty.
	idle chan struct{}
	one  [1]*Flight // all's room for the usual one
	// dropped: no longer in the tracker's map (dropIdleLocked).
	dropped bool
}

// maxIdleSessions bounds the idle sessions the tracker keeps: past it,
// the next new session drops them all (a session writes again soon, or
// never).
const maxIdleSessions = 1 << 12

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Renewals == nil {
		cfg.Renewals = prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"})
	}
	return &Tracker{cfg: cfg, bySession: map[string]*Session{}, epoch: cfg.Now()}
}

// Lander hears of a flight's landing: answered by its reply or not, and
// reusable when nothing but the flight pointed into what launched it (no
// timer of an abandoned flight, no renewal started), so that the caller
// may take back what it lent the flight.
type Lander interface {
	Landed(answered, reusable bool)
}

// Flight is one enforced write in flight; it is the request's ReplyHook.
// The caller fills Owner (or SetOwner), Locks and Left and launches it
// (Launch); a Flight is launched once. It is a value so that the caller
// may keep it inside what it already allocated for the write.
type Flight struct {
	// Owner is the lock owner whose locks the flight holds, by pointer:
	// copying an owner (six pointers, each a write barrier while the
	// collector marks) cost the usual write more than anything it does
	// with it. No one may write to it until the flight has landed: the
	// guard's lives in the write's verdict, reused only after that;
	// a caller with an owner of its own to hand over copies it in
	// (SetOwner).
	Owner *lockstore.Owner
	Locks Locks
	// Left is the lease left at the check, for renewals.
	Left time.Duration
	// Session, if set, is the entry of Owner.Session that an earlier
	// Launch left here, which saves the look-up in the tracker's map
	// under its mutex; Launch sets it to the entry it used.
	Session *Session

	t      *Tracker
	lander Lander
	// sf is the session's entry in the tracker, which stays in its map
	// while the flight is in it (only idle entries are dropped).
	sf      *Session
	start   time.Time
	maxTime time.Duration // the maxTimeMS it carries, 0 if none
	next    proxy.ReplyHook
	// due is when the first renewal is due, as nanoseconds since the
	// tracker's epoch (sinceEpoch, never 0), 0 once it was started
	// (guarded by sf.mu): a count, not a time.Time, whose Add and
	// comparisons cost every launch tens of instructions.
	due int64
	// done: the flight landed (or its launch was refused), set once. An
	// atomic, not under mu: the usual landing, before any renewal, then
	// takes no mutex of the flight's (landed).
	done atomic.Bool
	// abandoned: Abandon armed a timer that lands the flight, which
	// outlives its landing by a reply, if one comes after all: such a
	// flight is never reusable (landed), or the timer would land the
	// write its room was reused for.
	abandoned atomic.Bool
	// mu guards timer, the next renewal's, set by a renewal under way.
	mu    sync.Mutex
	timer *time.Timer
	// own is SetOwner's copy.
	own lockstore.Owner
}

// SetOwner makes a copy of o the flight's owner.
func (f *Flight) SetOwner(o lockstore.Owner) {
	f.own = o
	f.Owner = &f.own
}

// ForceSeq is read before a lock holder's lock check, and passed to
// Launch: the launch is refused if a force-release of one of its locks
// was under way at any moment since.
func (t *Tracker) ForceSeq() uint64 { return t.forceSeq.Load() }

// Launch registers f as in flight from now, which must not be later than
// the write leaves, carrying maxTime (0 if none) and chaining next, the
// hook already on the request; l hears of its landing. It reports false,
// launching nothing, for a guarded write (a lock holder's) whose locks an
// operator's force-release may have freed since forceSeq.
func (t *Tracker) Launch(f *Flight, l Lander, guarded bool, forceSeq uint64, now time.Time, maxTime time.Duration, next proxy.ReplyHook) bool {
	f.t, f.lander, f.start, f.maxTime, f.next = t, l, now, maxTime, next
	// Renew once half of what was left at the check has passed without a
	// reply; most writes are answered long before.
	due := max(int64(now.Sub(t.epoch)+max(f.Left/2, 10*time.Millisecond)), 1)
	f.due = due
	sf := f.Session
	if sf == nil || sf.t != t || sf.key != string(f.Owner.Session) || !sf.add(f) {
		t.mu.Lock()
		sf = t.sessionLocked(f.Owner.Session)
		sf.add(f) // not dropped: t.mu is held
		t.mu.Unlock()
	}
	f.sf, f.Session = sf, sf
	// The flight is in its session before the force-releases are looked
	// at: a force-release counts itself (Forcing) before it looks for
	// flights (WaitKey), so either it finds this one and waits for it, or
	// this launch finds the force-release. With none begun or under way
	// since forceSeq, none can concern the write.
	if guarded && (t.forceSeq.Load() != forceSeq || t.forcing.Load() != 0) {
		t.mu.Lock()
		forced := t.forcedSinceLocked(f.Locks, forceSeq)
		t.mu.Unlock()
		if forced {
			f.done.Store(true) // no renewal may start for it now
			t.remove(f)
			f.sf = nil
			return false
		}
	}
	// The renewal timer fires by armedAt, and then finds this flight in
	// its session (which renewDue reads after clearing armedAt): only a
	// flight due earlier, or an idle timer, needs the tracker's mutex.
	if a := t.armedAt.Load(); a == 0 || due < a {
		t.mu.Lock()
		t.armLocked(due)
		t.mu.Unlock()
	}
	return true
}

// add puts f in the session, unless it was dropped from the tracker.
func (sf *Session) add(f *Flight) bool {
	sf.mu.Lock()
	ok := !sf.dropped
	if ok {
		sf.all = append(sf.all, f)
	}
	sf.mu.Unlock()
	return ok
}

// sinceEpoch is a time as dues and armedAt hold it: nanoseconds since the
// epoch, rounded up to 1, never 0 (a time before the epoch, which only a
// caller's clock other than the tracker's can give, reads as the epoch:
// a flight due then is renewed at the timer's first firing).
func (t *Tracker) sinceEpoch(due time.Time) int64 {
	return max(int64(due.Sub(t.epoch)), 1)
}

// sessionLocked is the session's entry, made if need be; t.mu is held.
func (t *Tracker) sessionLocked(session []byte) *Session {
	sf := t.bySession[string(session)]
	if sf == nil {
		if len(t.bySession) >= maxIdleSessions {
			t.dropIdleLocked()
		}
		sf = &Session{key: string(session), t: t}
		sf.all = sf.one[:0]
		t.bySession[sf.key] = sf
	}
	return sf
}

// armLocked makes sure the renewal timer fires by due (since the epoch,
// as sinceEpoch counts it); t.mu is held.
func (t *Tracker) armLocked(due int64) {
	if t.armed != 0 && due >= t.armed {
		return
	}
	t.armed = due
	t.armedAt.Store(due)
	in := time.Duration(due) - t.cfg.Now().Sub(t.epoch)
	if t.renewals == nil {
		t.renewals = time.AfterFunc(in, t.renewDue)
		return
	}
	t.renewals.Reset(in)
}

// renewDue starts the first renewal of every flight now due, each in its
// own goroutine as a timer of its own would, and re-arms the timer for the
// next one.
func (t *Tracker) renewDue() {
	var due []*Flight
	t.mu.Lock()
	now := t.sinceEpoch(t.cfg.Now())
	t.armed = 0
	t.armedAt.Store(0) // before the sessions are read: see Launch
	var next int64
	for _, sf := range t.bySession {
		sf.mu.Lock()
		for _, f := range sf.all {
			switch {
			case f.due == 0:
			case f.due <= now:
				f.due = 0
				due = append(due, f)
			case next == 0 || f.due < next:
				next = f.due
			}
		}
		sf.mu.Unlock()
	}
	if next != 0 {
		t.armLocked(next)
	}
	t.mu.Unlock()
	for _, f := range due {
		go f.renew()
	}
}

// NeedsBody tells the proxy that a flight without a chained hook only
// needs to know that the reply arrived (no decoding on the hot path).
func (f *Flight) NeedsBody() bool { return f.next != nil }

// Reply implements proxy.ReplyHook.
func (f *Flight) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	var out bsoncore.Document
	if f.next != nil {
		out = f.next.Reply(ctx, body)
	}
	f.landed(true)
	return out
}

// Abandon implements proxy.ReplyHook: no reply will come (the connection
// closed, or the write was unacknowledged), but the database may still be
// running it, for at most its maxTimeMS; the locks stay covered until then.
func (f *Flight) Abandon() {
	if f.next != nil {
		f.next.Abandon()
	}
	wait := f.maxTime
	if wait <= 0 {
		wait = f.Left
	}
	f.abandoned.Store(true)
	time.AfterFunc(max(wait-f.t.cfg.Now().Sub(f.start), 0), f.land)
}

// land ends the flight.
func (f *Flight) land() { f.landed(false) }

// landed ends the flight; by its reply (answered) or not. The lander may
// take back what it lent only when the flight landed by its reply and
// nothing else can reach it any more: a flight that was abandoned may
// still have a timer that lands it again, and one whose renewal started
// may still be renewing.
//
// Whether a renewal started is what remove tells (unrenewed): a first
// renewal starts only with due cleared, under the session's mutex, while
// the flight is in the session; none can start once remove took it out,
// and a later renewal, or its timer, only after a first. So a flight
// found unrenewed has no renewal and no timer, and needs no mutex of its
// own; one renewed may have armed its next renewal's timer, which is
// stopped here, or sees done and arms none (renew).
func (f *Flight) landed(answered bool) {
	if !f.done.CompareAndSwap(false, true) {
		return
	}
	unrenewed := f.t.remove(f)
	if !unrenewed {
		f.mu.Lock()
		if f.timer != nil {
			f.timer.Stop()
		}
		f.mu.Unlock()
	}
	if f.lander != nil {
		f.lander.Landed(answered, unrenewed && !f.abandoned.Load())
	}
}

// remove forgets a flight that landed. It reports whether its first
// renewal was never started: after remove none can be.
func (t *Tracker) remove(f *Flight) (unrenewed bool) {
	sf := f.sf
	if sf == nil {
		return f.due != 0
	}
	// No defer: this is every write's landing, and nothing below
	// can panic (an append-free slice edit, a close of a channel only
	// this mutex's holder closes).
	sf.mu.Lock()
	unrenewed = f.due != 0
	if i := slices.Index(sf.all, f); i >= 0 {
		last := len(sf.all) - 1
		sf.all[i], sf.all[last] = sf.all[last], nil
		sf.all = sf.all[:last]
	}
	if len(sf.all) == 0 && sf.idle != nil {
		close(sf.idle)
		sf.idle = nil // the next waiter waits for the next idle time
	}
	sf.mu.Unlock()
	return unrenewed
}

// dropIdleLocked forgets the sessions with no write in flight; t.mu is
// held.
func (t *Tracker) dropIdleLocked() {
	for k, sf := range t.bySession {
		sf.mu.Lock()
		if len(sf.all) == 0 {
			sf.dropped = true
			delete(t.bySession, k)
		}
		sf.mu.Unlock()
	}
}

// renew keeps the locks of a write still in flight from lapsing, bounded:
// never past MaxInFlight since the write left.
func (f *Flight) renew() {
	cfg := &f.t.cfg
	if f.done.Load() || cfg.Now().Sub(f.start) > cfg.MaxInFlight {
		return
	}
	lease := min(max(f.Left, time.Second), cfg.MaxInFlight)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range f.Locks {
		ns := l.NS
		if _, err := cfg.Store.Renew(ctx, *f.Owner, ns, l.IDs, lease); err != nil {
			// Released by an operator, or the store is unreachable: the
			// write goes on under its maxTimeMS (and the fence, if any).
			cfg.Log.Info("could not renew the locks of a write still in flight", zap.String("ns", ns.String()), zap.Error(err))
			return
		}
	}
	cfg.Renewals.Inc()
	f.mu.Lock()
	if !f.done.Load() {
		f.timer = time.AfterFunc(lease/2, f.renew)
	}
	f.mu.Unlock()
}

// idleLocked returns the channel closed when the session has no write in
// flight left, made on first use; sf.mu is held.
func (sf *Session) idleLocked() chan struct{} {
	if sf.idle == nil {
		sf.idle = make(chan struct{})
	}
	return sf.idle
}

// WaitSession blocks until the session's enforced writes in flight on this
// proxy are answered, or ctx ends: what a release of the session's locks
// waits for.
func (t *Tracker) WaitSession(ctx context.Context, session []byte) error {
	for {
		t.mu.Lock()
		sf := t.bySession[string(session)]
		var idle chan struct{}
		if sf != nil {
			sf.mu.Lock()
			if len(sf.all) > 0 {
				idle = sf.idleLocked()
			}
			sf.mu.Unlock()
		}
		t.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitKey blocks until no write in flight on this proxy holds the lock on
// (ns, id), or ctx ends: what an operator's force-release waits for.
func (t *Tracker) WaitKey(ctx context.Context, ns namespace.Namespace, id docid.ID) error {
	for {
		var idle chan struct{}
		t.mu.Lock()
		for _, sf := range t.bySession {
			if idle = sf.idleIfHolds(ns, id); idle != nil {
				break
			}
		}
		t.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// idleIfHolds is the session's idle channel if one of its writes in flight
// holds the lock on (ns, id), else nil.
func (sf *Session) idleIfHolds(ns namespace.Namespace, id docid.ID) chan struct{} {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for _, f := range sf.all {
		for _, fid := range f.Locks.Get(ns) {
			if fid.Equal(id) {
				return sf.idleLocked()
			}
		}
	}
	return nil
}
