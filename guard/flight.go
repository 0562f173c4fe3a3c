package guard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// Leases cover the writes in flight (docs/ENFORCEMENT.md, "Writes in
// flight"). An enforced write is forwarded only while its locks surely have
// more than the rule's margin of lease left, measured when the check
// answered and checked again by the proxy just before the bytes leave; it
// carries maxTimeMS no greater than that lease minus the margin, so the
// database stops working on it before the lease could end; and until its
// reply arrives this proxy keeps its locks from lapsing (renewing them) and
// keeps releases of its session waiting.

// flightPlan is what an allowed enforced write holds, gathered by holds.
type flightPlan struct {
	owner  lockstore.Owner
	locks  nsLocks
	end    time.Time     // local monotonic time when the earliest lease surely ends
	left   time.Duration // lease left at the check, for renewals
	margin time.Duration // the largest margin of the rules involved
	// implicit, when set, are implicit locks the proxy took for this
	// write alone: released when it lands (implicit.go).
	implicit *implicitPlan
	// guarded: locks is a holder's locks, checked after the tracker's
	// forceSeq read forceSeq; the launch is refused if a force-release
	// of one of them was under way at any moment since
	// (forcedSinceLocked).
	// Implicit locks are covered by took instead.
	guarded  bool
	forceSeq uint64
	// lockBuf is locks' room for the usual one namespace, so that the
	// plan is one allocation.
	lockBuf [1]nsIDs
	// fl is the flight the plan becomes once launched (a plan is
	// launched once): the write in flight costs no allocation of its own.
	fl flight
}

// nsLocks are lock ids by namespace: a slice, as a write's locks are in
// one namespace or very few.
type nsLocks []nsIDs

type nsIDs struct {
	ns  string
	ids []docid.ID
}

// add appends ids to ns's; they are shared until appended to.
func (l *nsLocks) add(ns string, ids []docid.ID) {
	for i := range *l {
		if (*l)[i].ns == ns {
			(*l)[i].ids = append((*l)[i].ids, ids...)
			return
		}
	}
	*l = append(*l, nsIDs{ns: ns, ids: slices.Clip(ids)})
}

func (l nsLocks) get(ns string) []docid.ID {
	ids, _ := l.lookup(ns)
	return ids
}

func (l nsLocks) lookup(ns string) ([]docid.ID, bool) {
	for _, x := range l {
		if x.ns == ns {
			return x.ids, true
		}
	}
	return nil, false
}

// flightLocks adds the locks of ns to the write's plan. The lease end is
// counted from v.now, read before the lock store measured left: earlier
// than the truth, so the deadline and maxTimeMS can only come out short
// (by the resolver's cached collation or capped checks at most; v.now is
// cleared after anything that can wait longer: a resolution, implicit
// locks).
func (v *verdict) flightLocks(o lockstore.Owner, r *policy.Rule, ns string, ids []docid.ID, left time.Duration) {
	v.flightLocksSince(o, r, ns, ids, left, false, 0)
}

// flightLocksSince is flightLocks for a lock holder's locks when guarded,
// checked after the tracker's forceSeq read seq: the first check's seq is
// the earliest, and so covers those that follow.
func (v *verdict) flightLocksSince(o lockstore.Owner, r *policy.Rule, ns string, ids []docid.ID, left time.Duration, guarded bool, seq uint64) {
	if v.now.IsZero() {
		v.now = time.Now()
	}
	end := v.now.Add(left)
	if v.flight == nil {
		// The usual write's plan lives in its verdict (already one
		// allocation); the flight keeps the verdict until it lands.
		v.flight = &v.flightBuf
		v.flight.owner, v.flight.end, v.flight.left = o, end, left
		v.flight.locks = v.flight.lockBuf[:0]
	}
	f := v.flight
	if guarded && !f.guarded {
		f.guarded, f.forceSeq = true, seq
	}
	if end.Before(f.end) {
		f.end = end
	}
	f.left = min(f.left, left)
	f.margin = max(f.margin, r.LeaseMargin)
	f.locks.add(ns, ids)
}

// flightTracker knows, per lock owner session, the enforced writes this
// proxy forwarded and has not yet seen answered (or, abandoned, that the
// database may still be running).
type flightTracker struct {
	mu        sync.Mutex
	bySession map[string]*sessionFlights
	// renewals is one timer for the first renewal of every flight, armed
	// for the earliest one due (at armed; zero when idle): a timer per
	// write would cost each write an allocation and two operations on
	// the runtime's timer heap, for a renewal that almost never happens.
	renewals *time.Timer
	armed    time.Time
	// forceSeq counts the starts and ends of force-releases (changed
	// under mu, read without it by lock checks); forced are those under
	// way or that a write still taking implicit locks may have met, and
	// the last keepForced ended ones, for lock holders' writes checked
	// before they ended (forcedSinceLocked); forgotten is the latest end
	// among those forgotten since. taking counts the writes taking
	// implicit locks by the forceSeq they started at (took).
	forceSeq  atomic.Uint64
	forced    []*forcedKey
	forgotten uint64
	taking    map[uint64]int
}

type sessionFlights struct {
	// key is the session's owner key as a string, the map's key: kept
	// while the session is idle, so that its next write allocates none.
	key string
	// all is a slice: a session has one write in flight, or very few.
	all []*flight
	// idle, made by the first waiter (most flights have none), is closed
	// when all becomes empty.
	idle chan struct{}
	one  [1]*flight // all's room for the usual one
}

// maxIdleSessions bounds the idle sessions the tracker keeps: past it,
// the next new session drops them all (a session writes again soon, or
// never).
const maxIdleSessions = 1 << 12

func newFlightTracker() *flightTracker {
	return &flightTracker{bySession: map[string]*sessionFlights{}}
}

// flight is one enforced write in flight; it is the request's ReplyHook,
// and its LateReplier when it was launched from a verdict.
type flight struct {
	g    *Guard
	plan *flightPlan
	// sf is the session's entry in the tracker, which stays in its map
	// while the flight is in it (only idle entries are dropped).
	sf      *sessionFlights
	start   time.Time
	maxTime time.Duration // the maxTimeMS it carries, 0 if none
	next    proxy.ReplyHook
	// v and pol are the decision the flight was launched from
	// (launchDecision), for its late reply; v is nil otherwise.
	v   *verdict
	pol *policy.Policy
	// home, when set, is the connection that gets v back once the flight
	// lands, for its next write: set only when nothing but the flight
	// points into v (recyclable), and kept only if the flight lands by
	// its reply before any renewal started (remove).
	home *connState
	// due is when the first renewal is due, zero once it was started
	// (guarded by the tracker's mu).
	due      time.Time
	mu       sync.Mutex
	done     bool
	timer    *time.Timer
	renewals int
}

// launch registers a write as in flight and returns it as the hook of the
// decision (chaining the hook already there).
func (g *Guard) launch(p *flightPlan, maxTime time.Duration, next proxy.ReplyHook) *flight {
	return g.launchAt(p, time.Now(), maxTime, next)
}

// launchAt is launch with the time read by the caller: the flight starts
// at now, which must not be later than the write leaves. It returns nil,
// launching nothing, for a guarded plan whose locks an operator's
// force-release may have freed since they were checked.
func (g *Guard) launchAt(p *flightPlan, now time.Time, maxTime time.Duration, next proxy.ReplyHook) *flight {
	f := &p.fl
	f.g, f.plan, f.start, f.maxTime, f.next = g, p, now, maxTime, next
	t := g.flights
	t.mu.Lock()
	if p.guarded && t.forcedSinceLocked(p.locks, p.forceSeq) {
		t.mu.Unlock()
		return nil
	}
	sf := t.bySession[string(p.owner.Session)]
	if sf == nil {
		if len(t.bySession) >= maxIdleSessions {
			t.dropIdleLocked()
		}
		sf = &sessionFlights{key: string(p.owner.Session)}
		sf.all = sf.one[:0]
		t.bySession[sf.key] = sf
	}
	f.sf = sf
	sf.all = append(sf.all, f)
	// Renew once half of what was left at the check has passed without a
	// reply; most writes are answered long before.
	f.due = f.start.Add(max(p.left/2, 10*time.Millisecond))
	t.armLocked(f.due)
	t.mu.Unlock()
	return f
}

// armLocked makes sure the renewal timer fires by due; t.mu is held.
func (t *flightTracker) armLocked(due time.Time) {
	if !t.armed.IsZero() && !due.Before(t.armed) {
		return
	}
	t.armed = due
	if t.renewals == nil {
		t.renewals = time.AfterFunc(time.Until(due), t.renewDue)
		return
	}
	t.renewals.Reset(time.Until(due))
}

// renewDue starts the first renewal of every flight now due, each in its
// own goroutine as a timer of its own would, and re-arms the timer for the
// next one.
func (t *flightTracker) renewDue() {
	var due []*flight
	t.mu.Lock()
	now := time.Now()
	t.armed = time.Time{}
	var next time.Time
	for _, sf := range t.bySession {
		for _, f := range sf.all {
			switch {
			case f.due.IsZero():
			case !f.due.After(now):
				f.due = time.Time{}
				due = append(due, f)
			case next.IsZero() || f.due.Before(next):
				next = f.due
			}
		}
	}
	if !next.IsZero() {
		t.armLocked(next)
	}
	t.mu.Unlock()
	for _, f := range due {
		go f.renew()
	}
}

// NeedsBody tells the proxy that a flight without a chained hook only
// needs to know that the reply arrived (no decoding on the hot path).
func (f *flight) NeedsBody() bool { return f.next != nil }

// Reply implements proxy.ReplyHook.
func (f *flight) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	var out bsoncore.Document
	if f.next != nil {
		out = f.next.Reply(ctx, body)
	}
	f.landed(true)
	return out
}

// LateReply implements proxy.LateReplier: the refusal of a write whose
// lease, less the margin, would end before its bytes could leave. It is
// built from the request, so the proxy calls it while the request is its
// own, before the flight lands.
func (f *flight) LateReply() bsoncore.Document {
	w := f.v.writes[0]
	x := violation{write: w, rule: f.pol.Lookup(w.NS.String()), reason: reasonNotLocked,
		detail: fmt.Sprintf("this session's lock had less than the policy's margin of %s (policy.leaseMarginMS) of lease left when the write was about to leave for the database; renew it with renewLock", lockstore.FormatMS(f.plan.margin))}
	if f.plan.implicit != nil {
		// A writer that holds no lock has nothing to renew: its implicit
		// lock's lease ran out while lockgate waited (for the lock, the
		// lock store or the audit trail).
		x.detail = fmt.Sprintf("this session holds no lock, and the implicit lock lockgate took for this write had less than the policy's margin of %s (policy.leaseMarginMS) of its lease left when the write was about to leave for the database", lockstore.FormatMS(f.plan.margin))
		x.advice = "nothing was written: retry"
	}
	f.g.trailRefusedAtLaunch(f.v.req, f.pol, f.v, &x)
	return refusal(f.v.req, x).Document()
}

// Abandon implements proxy.ReplyHook: no reply will come (the connection
// closed, or the write was unacknowledged), but the database may still be
// running it, for at most its maxTimeMS; the locks stay covered until then.
func (f *flight) Abandon() {
	if f.next != nil {
		f.next.Abandon()
	}
	wait := f.maxTime
	if wait <= 0 {
		wait = f.plan.left
	}
	time.AfterFunc(max(wait-time.Since(f.start), 0), f.land)
}

// land ends the flight.
func (f *flight) land() { f.landed(false) }

// landed ends the flight; by its reply (answered) or not. An answered
// flight that nothing else can reach any more hands its verdict back to
// its connection: a flight that was abandoned may still have a timer
// that lands it again, and one whose renewal started may still be
// renewing, so theirs are left to the collector.
func (f *flight) landed(answered bool) {
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		return
	}
	f.done = true
	quiet := f.timer == nil && f.renewals == 0
	if f.timer != nil {
		f.timer.Stop()
	}
	f.mu.Unlock()
	unrenewed := f.g.flights.remove(f)
	if f.plan.implicit != nil {
		f.g.releaseImplicit(f.plan.implicit)
	}
	if answered && quiet && unrenewed && f.home != nil {
		f.home.putVerdict(f.v)
	}
}

// remove forgets a flight that landed. It reports whether its first
// renewal was never started: after remove none can be.
func (t *flightTracker) remove(f *flight) (unrenewed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	unrenewed = !f.due.IsZero()
	sf := f.sf
	if sf == nil {
		return unrenewed
	}
	if i := slices.Index(sf.all, f); i >= 0 {
		last := len(sf.all) - 1
		sf.all[i], sf.all[last] = sf.all[last], nil
		sf.all = sf.all[:last]
	}
	if len(sf.all) == 0 && sf.idle != nil {
		close(sf.idle)
		sf.idle = nil // the next waiter waits for the next idle time
	}
	return unrenewed
}

// dropIdleLocked forgets the sessions with no write in flight; t.mu is
// held.
func (t *flightTracker) dropIdleLocked() {
	for k, sf := range t.bySession {
		if len(sf.all) == 0 {
			delete(t.bySession, k)
		}
	}
}

// renew keeps the locks of a write still in flight from lapsing, bounded:
// never past MaxInFlight since the write left.
func (f *flight) renew() {
	f.mu.Lock()
	if f.done || time.Since(f.start) > f.g.opts.MaxInFlight {
		f.mu.Unlock()
		return
	}
	f.renewals++
	f.mu.Unlock()
	lease := min(max(f.plan.left, time.Second), f.g.opts.MaxInFlight)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range f.plan.locks {
		ns := l.ns
		if _, err := f.g.opts.Store.Renew(ctx, f.plan.owner, ns, l.ids, lease); err != nil {
			// Released by an operator, or the store is unreachable: the
			// write goes on under its maxTimeMS (and the fence, if any).
			f.g.log.Info("could not renew the locks of a write still in flight", zap.String("ns", ns), zap.Error(err))
			return
		}
	}
	f.g.metrics.inFlightRenewals.Inc()
	f.mu.Lock()
	if !f.done {
		f.timer = time.AfterFunc(lease/2, f.renew)
	}
	f.mu.Unlock()
}

// idleLocked returns the channel closed when the session has no write in
// flight left, made on first use; t.mu is held.
func (sf *sessionFlights) idleLocked() chan struct{} {
	if sf.idle == nil {
		sf.idle = make(chan struct{})
	}
	return sf.idle
}

// waitSession blocks until the session's enforced writes in flight on this
// proxy are answered, or ctx ends.
func (t *flightTracker) waitSession(ctx context.Context, session []byte) error {
	for {
		t.mu.Lock()
		sf := t.bySession[string(session)]
		if sf == nil || len(sf.all) == 0 {
			t.mu.Unlock()
			return nil
		}
		idle := sf.idleLocked()
		t.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitKey blocks until no write in flight on this proxy holds the lock on
// (ns, id), or ctx ends: what an operator's force-release waits for.
func (t *flightTracker) waitKey(ctx context.Context, ns string, id docid.ID) error {
	for {
		var idle chan struct{}
		t.mu.Lock()
	find:
		for _, sf := range t.bySession {
			for _, f := range sf.all {
				for _, fid := range f.plan.locks.get(ns) {
					if fid.Equal(id) {
						idle = sf.idleLocked()
						break find
					}
				}
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

// WaitWritesOn blocks, at most OrderTimeout, until no enforced write that
// this proxy forwarded under the lock on (ns, id) is still unanswered. An
// operator's force-release calls it first, so that it does not free a lock
// under a write that is still running.
func (g *Guard) WaitWritesOn(ctx context.Context, ns string, id docid.ID) error {
	ctx, cancel := context.WithTimeout(ctx, g.opts.OrderTimeout)
	defer cancel()
	return g.flights.waitKey(ctx, ns, id)
}

// BeginForceRelease is an operator's force-release of (ns, id) on this
// proxy: it marks it under way, so that a legacy write whose implicit lock
// on it is being taken meanwhile is refused rather than left to write
// under a lock the force-release frees, then waits as WaitWritesOn. done
// must be called once the lock store's force-release has returned (also
// after an error).
func (g *Guard) BeginForceRelease(ctx context.Context, ns string, id docid.ID) (done func(), err error) {
	done = g.flights.forcing(ns, id)
	return done, g.WaitWritesOn(ctx, ns, id)
}

// launchDecision turns an allowed enforced write into its flight: it is
// forwarded only before its lease, less the margin, could end (the proxy
// checks the deadline again just before the bytes leave), it carries
// maxTimeMS capped at what is left of that, and it is tracked until
// answered. The cap joins ed, the write's pins and fences, so that the
// message is edited and encoded once (guard/edit.go). now is read after
// the decision was made (and its audit record, if required, made
// durable).
func (g *Guard) launchDecision(req *proxy.Request, pol *policy.Policy, v *verdict, d proxy.Decision, ed policy.Edit, now time.Time) proxy.Decision {
	if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
		return d
	}
	p := v.flight
	if p == nil {
		d, _, _ = g.edit(req, pol, v, d, ed)
		return d
	}
	f := &p.fl
	f.v, f.pol, f.plan = v, pol, p
	budget := p.end.Sub(now) - p.margin
	if budget <= 0 {
		if d.OnReply != nil {
			d.OnReply.Abandon()
		}
		return proxy.Decision{Action: proxy.Reply, Reply: f.LateReply()}
	}
	if req.Command != nil && !v.inTxn {
		ed.MaxTimeMS = max(budget.Milliseconds(), 1)
	}
	d, maxTime, ok := g.edit(req, pol, v, d, ed)
	if !ok {
		return d
	}
	if p == &v.flightBuf && d.OnReply == nil && v.implicit == nil && v.fence == nil && !v.inTxn {
		// Nothing but the flight points into the verdict: it may go
		// back to the connection when the flight lands.
		f.home = v.home
	}
	fl := g.launchAt(p, now, maxTime, d.OnReply)
	if fl == nil {
		if d.OnReply != nil {
			d.OnReply.Abandon()
		}
		g.log.Info("refused a write whose lock an operator force-released after it was checked", zap.String("ns", v.writes[0].NS.String()))
		return proxy.Decision{Action: proxy.Reply, Reply: g.forcedRefusal(req, pol, v)}
	}
	d.Deadline = p.end.Add(-p.margin)
	d.LateReply, d.OnReply = fl, fl
	if p.implicit != nil {
		p.implicit.launched = true
		// The flight stands for the write now.
		g.flights.unhold(p.implicit)
	}
	return d
}

// forcedRefusal is the refusal of a lock holder's write whose lock an
// operator force-released between its check and its launch.
func (g *Guard) forcedRefusal(req *proxy.Request, pol *policy.Policy, v *verdict) bsoncore.Document {
	w := v.writes[0]
	x := violation{write: w, rule: pol.Lookup(w.NS.String()), reason: reasonNotLocked,
		detail: "an operator force-released the lock on a document of this write while lockgate was checking it (after this session's lock was verified, before the write left for the database), so the write is refused",
		advice: "nothing was written; the lock may be another session's by now: acquireLock it again before retrying"}
	g.trailRefusedAtLaunch(req, pol, v, &x)
	return refusal(req, x).Document()
}

// trailRefusedAtLaunch records in the audit trail the refusal of a write
// whose allow record was made already (its decision), but which was
// refused before it left for the database: its lease ran short, or an
// operator force-released its lock meanwhile. The trail then shows the
// allow record followed by this one, not an allowed write that never ran.
func (g *Guard) trailRefusedAtLaunch(req *proxy.Request, pol *policy.Policy, v *verdict, x *violation) {
	if t := g.opts.Trail; t != nil {
		t.Append(g.trailEvent(req, pol, v, &x.write, &x.rule, x, decisionReject, time.Time{}))
	}
}

// An operator's force-release and a lock holder's write meet the same way
// (below): the write reads forceSeq before its lock check, and its launch
// (launchAt, under mu) is refused if a force-release of one of its locks
// was under way at any moment since. Either the force-release finds the
// write in flight and waits for it, or the write finds the force-release.
// The cost on the hot path is one atomic read and, at the launch, a look
// at forced: empty but for the rare force-release, and past one only a
// comparison of sequence numbers per entry remembered (keepForced at most,
// with those under way).

// An operator's force-release and a legacy write's implicit locks meet
// here (Dekker's pattern, under the tracker's mu): the force-release
// records that it is under way (forcing) before it looks for writes under
// the lock (waitKey), and a write records its implicit locks (took) once
// they are taken, checking for a force-release of them under way since it
// started taking them. Either the force-release sees the write and waits
// for it, or the write sees the force-release and is refused: a lock freed
// between its grant and its write's launch would let the write leave
// afterwards, under a lease of its own reckoning, into the work of
// whoever took the document meanwhile. A write that merely waits for a
// lock (unlockedWriters: wait) holds nothing and delays no force-release.

// keepForced is how many ended force-releases the tracker remembers for
// lock holders' writes checked before they ended and not yet launched.
const keepForced = 64

// forcedKey is a force-release under way (end 0) or ended at seq end.
type forcedKey struct {
	ns  string
	id  docid.ID
	end uint64
}

// forcing records a force-release of (ns, id) as under way; the returned
// func records its end.
func (t *flightTracker) forcing(ns string, id docid.ID) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forceSeq.Add(1)
	e := &forcedKey{ns: ns, id: id}
	t.forced = append(t.forced, e)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		e.end = t.forceSeq.Add(1)
		t.pruneForcedLocked()
	}
}

// startTaking records that a write starts taking implicit locks; took or
// stopTaking must follow with the seq returned.
func (t *flightTracker) startTaking() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.taking == nil {
		t.taking = map[uint64]int{}
	}
	seq := t.forceSeq.Load()
	t.taking[seq]++
	return seq
}

// stopTaking ends startTaking without locks taken.
func (t *flightTracker) stopTaking(seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopTakingLocked(seq)
}

func (t *flightTracker) stopTakingLocked(seq uint64) {
	if t.taking[seq]--; t.taking[seq] <= 0 {
		delete(t.taking, seq)
	}
	t.pruneForcedLocked()
}

// took records the implicit locks on ids in ns, taken since startTaking
// returned seq, under their owner's session, so that waitKey waits for
// the write until it is launched (the flight stands for it then) or the
// locks are given back (unhold). It reports false, recording nothing,
// when a force-release of one of them was under way at any moment since
// seq: the lock may have been freed after it was granted.
func (t *flightTracker) took(p *implicitPlan, ns string, ids []docid.ID, seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.stopTakingLocked(seq)
	for _, e := range t.forced {
		if e.ns != ns || (e.end != 0 && e.end <= seq) {
			continue
		}
		for _, id := range ids {
			if id.Equal(e.id) {
				return false
			}
		}
	}
	f := p.pending
	if f == nil {
		f = &flight{plan: &flightPlan{owner: p.owner}}
		sf := t.bySession[string(p.owner.Session)]
		if sf == nil {
			if len(t.bySession) >= maxIdleSessions {
				t.dropIdleLocked()
			}
			sf = &sessionFlights{key: string(p.owner.Session)}
			sf.all = sf.one[:0]
			t.bySession[sf.key] = sf
		}
		f.sf = sf
		sf.all = append(sf.all, f)
		p.pending = f
	}
	f.plan.locks.add(ns, slices.Clone(ids))
	return true
}

// forcedSinceLocked reports whether a force-release of one of locks was
// under way at any moment since seq, or may have been (one forgotten
// since); t.mu is held.
func (t *flightTracker) forcedSinceLocked(locks nsLocks, seq uint64) bool {
	if seq < t.forgotten {
		return true
	}
	for _, e := range t.forced {
		if e.end != 0 && e.end <= seq {
			continue
		}
		for _, id := range locks.get(e.ns) {
			if id.Equal(e.id) {
				return true
			}
		}
	}
	return false
}

// pruneForcedLocked forgets the ended force-releases that no write still
// taking locks can have met, but for the last keepForced of them: a lock
// holder's write checked before one ended and not yet launched may need
// it, and is refused, rather than trusted, once it is forgotten (a write
// would have to be held past keepForced force-releases); t.mu is held.
func (t *flightTracker) pruneForcedLocked() {
	if len(t.forced) <= keepForced {
		return
	}
	oldest, any := uint64(0), false
	for seq := range t.taking {
		if !any || seq < oldest {
			oldest, any = seq, true
		}
	}
	var ends []uint64
	for _, e := range t.forced {
		if e.end != 0 && (!any || e.end <= oldest) {
			ends = append(ends, e.end)
		}
	}
	if len(ends) <= keepForced {
		return
	}
	slices.Sort(ends)
	last := ends[len(ends)-keepForced-1] // ends are distinct
	t.forced = slices.DeleteFunc(t.forced, func(e *forcedKey) bool { return e.end != 0 && e.end <= last })
	t.forgotten = max(t.forgotten, last)
}

// unhold ends took's registration, if any.
func (t *flightTracker) unhold(p *implicitPlan) {
	t.mu.Lock()
	f := p.pending
	p.pending = nil
	t.mu.Unlock()
	if f != nil {
		t.remove(f)
	}
}

// inTransaction reports whether a command runs inside a multi-document
// transaction (autocommit: false), where the server refuses a maxTimeMS of
// its own statements; the commit is checked instead.
func inTransaction(cmd *wire.Command) bool {
	v, ok := cmd.Lookup("autocommit")
	if !ok {
		return false
	}
	b, ok := v.BooleanOK()
	return ok && !b
}
