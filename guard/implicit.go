package guard

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/txn"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.uber.org/zap"
)

// Writers that hold no lock (docs/ENFORCEMENT.md, "Writers that hold no
// lock"). Under a rule with unlockedWriters refuseIfLocked or wait, an
// enforced write from a session that holds none of the locks it needs is
// not refused for that: the proxy takes, for that one write, real locks
// in the lock store on every document it can touch (the ids its filters
// pin, the candidates a filter that pins none was resolved and pinned to,
// the _id an upsert or insert creates), in the one global key order, as
// an owner of its own. The write then leaves exactly as a lock holder's
// would: its leases cover it in flight (maxTimeMS capped, renewed while
// unanswered), it is fenced where the rule fences, and its locks are
// released once the database has answered, before the answer is relayed.
// Taking the locks is the check, so no holder can slip in between the
// check and the write's landing. refuseIfLocked takes them without
// waiting; wait queues for them with acquireLock's waiters.

// Reasons of refusals that only writers without locks get.
const (
	// reasonImplicitTimeout: a write under unlockedWriters: wait queued
	// for its implicit locks for unlockedWaitMS.
	reasonImplicitTimeout = "timeout"
)

// implicitPlan gathers what a write without locks needs, and, once taken,
// the implicit locks it holds.
type implicitPlan struct {
	// needs are the ids per namespace of writes whose session holds none
	// of them (the lock check, enforce.Checker, found every one missing).
	needs enforce.Needs
	// unchecked are the checks skipped on the guess that the session
	// holds no lock (skipHeldCheck), one per lock check: the implicit
	// acquire confirms the guess, or they are checked as today
	// (checkUnchecked). noGuess: they were, so no more are skipped.
	unchecked []enforce.Need
	noGuess   bool
	// busyNS is the namespace whose keys the guess's acquire found held:
	// under wait, the next attempt queues for them at once rather than
	// trying, and rolling back, once more (which would barge again ahead
	// of the waiters it just met).
	busyNS string
	// inserts are the inserted _ids of rules with implicit locks.
	inserts enforce.Needs
	// owner is the implicit locks' owner, once taken.
	owner lockstore.Owner
	// taken are the locks held, by namespace; launched: the write's flight
	// releases them (else the verdict's end does).
	taken    inflight.Locks
	launched bool
	// pending stands for the write in the flight tracker from when its
	// locks are taken until it is launched or they are released (flight.go,
	// took): an operator's force-release waits for it, as the write would
	// leave under those locks whatever the lock store says by then.
	// Guarded by the tracker's mu.
	pending *inflight.Flight
	// waited: the locks were not free at once.
	waited bool
	mode   config.UnlockedWriters
}

func (v *verdict) implicitPlan() *implicitPlan {
	if v.implicit == nil {
		v.implicit = &implicitPlan{}
	}
	return v.implicit
}

// deferToImplicit reports whether a write of ns under r, which the session
// o does not hold every lock of, is left to implicit locks: the rule allows
// them and the session holds none of ids. A session that holds some is
// refused as today, lest explicit and implicit locks mix in one write.
func (v *verdict) deferToImplicit(r *policy.Rule, ns namespace.Namespace, ids, missing []docid.ID) bool {
	if !r.Implicit() {
		return false
	}
	if len(missing) < len(ids) {
		// Missing counts distinct ids; ids may spell one twice ([1, 1.0]).
		for _, id := range ids {
			if !slices.ContainsFunc(missing, id.Equal) {
				return false
			}
		}
	}
	v.implicitPlan().needs.Add(ns, r, ids...)
	return true
}

// sessionLocks tells from memory whether a session holds a lock taken
// through this lockgate (lockstore.Store has it).
type sessionLocks interface {
	HoldsAnyHere(session []byte) bool
}

// skipHeldCheck reports whether the check that the session of a write of
// ns under r holds the locks on ids is left to the implicit acquire:
// under a rule with implicit locks, for a session that holds no lock
// through this lockgate (most likely a legacy writer, which never locks).
// That saves the lock store read of the check on every legacy write; the
// implicit acquire reads the same keys anyway. The guess needs no trust:
// an acquire that takes every key proves that nobody held any, the
// session included; one that fails has the skipped checks made as today
// before anything is decided (takeImplicit), so a lock-aware session whose
// locks were taken through another lockgate is answered exactly as before.
func (g *Guard) skipHeldCheck(v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) bool {
	if !r.Implicit() || len(o.Session) == 0 || (v.implicit != nil && v.implicit.noGuess) {
		return false
	}
	sl, ok := g.opts.Store.(sessionLocks)
	if !ok || sl.HoldsAnyHere(o.Session) {
		return false
	}
	p := v.implicitPlan()
	p.unchecked = append(p.unchecked, enforce.Need{NS: ns, Rule: r, IDs: ids})
	return true
}

// checkUnchecked makes the checks skipHeldCheck skipped, as the lock check
// makes them: the session's locks are held (the write is a lock holder's),
// missing (left to implicit locks after all), or some of each (refused).
func (g *Guard) checkUnchecked(ctx context.Context, v *verdict, o *lockstore.Owner) {
	p := v.implicit
	u := p.unchecked
	p.unchecked, p.noGuess = nil, true
	for _, n := range u {
		if !v.Blocked(n.NS) {
			g.checker.Check(ctx, v, &v.Verdict, n.Rule, o, n.NS, n.IDs)
		}
	}
}

// implicitAsToday reports whether the writes left to implicit locks are
// refused as today whatever the lock store says (takeImplicit's reasons).
func implicitAsToday(v *verdict) bool {
	return v.EnforcedViolation() || len(v.Checked) > 0 || v.flight != nil ||
		(v.Req.Command != nil && txn.In(v.Req.Command)) ||
		v.Req.Command == nil || v.Req.Command.MoreToCome
}

// takeImplicit decides the writes left to implicit locks, after every
// statement was checked: it takes the locks, or refuses as the lock check would
// have. It returns the inserts still to be checked as today.
func (g *Guard) takeImplicit(ctx context.Context, v *verdict, o *lockstore.Owner, inserts enforce.Needs) enforce.Needs {
	p := v.implicit
	if p == nil {
		return inserts
	}
	if len(p.unchecked) > 0 && implicitAsToday(v) {
		g.checkUnchecked(ctx, v, o)
	}
	asToday := func() enforce.Needs {
		for _, n := range p.needs {
			if !v.Blocked(n.NS) {
				g.checker.Refuse(ctx, &v.Verdict, n.Rule, o, n.NS, n.IDs)
			}
		}
		for _, n := range p.inserts {
			inserts.Add(n.NS, n.Rule, n.IDs...)
		}
		p.needs, p.inserts = nil, nil
		return inserts
	}
	switch {
	case v.EnforcedViolation():
		return asToday()
	case len(v.Checked) > 0 || v.flight != nil:
		// The session holds the locks of another statement: a lock-aware
		// writer, whose missing locks are its own mistake to be told of.
		return asToday()
	case v.Req.Command != nil && txn.In(v.Req.Command):
		// A transaction's statements are answered long before it commits:
		// locks released at their answer would not cover the commit.
		return asToday()
	case v.Req.Command == nil || v.Req.Command.MoreToCome:
		// No answer will say when it landed (w: 0, legacy opcodes): its
		// locks would have to stay for all of its maxTimeMS, and block
		// everyone else's work on those documents for that long.
		return asToday()
	}
	// Inserts into namespaces whose rules take no implicit locks are
	// returned to be checked as today, whatever happens here.
	all := slices.Clone(p.needs)
	guessed := len(p.unchecked) > 0
	for _, n := range p.unchecked {
		all.Add(n.NS, n.Rule, n.IDs...)
	}
	for _, n := range p.inserts {
		all.Add(n.NS, n.Rule, n.IDs...)
	}
	if len(all) == 0 {
		return inserts
	}
	// One global order, the lock store's (namespace, then key), so that
	// two implicit writers, or an implicit writer and acquireLock, never
	// wait for each other in a cycle (each namespace's ids are taken in
	// key order by the store, all or nothing).
	slices.SortFunc(all, func(a, b enforce.Need) int { return strings.Compare(a.NS.String()+"/", b.NS.String()+"/") })
	p.mode = config.UnlockedRefuseIfLocked
	var wait time.Duration
	for _, n := range all {
		if n.Rule.Unlocked == config.UnlockedWait {
			p.mode = config.UnlockedWait
			wait = max(wait, n.Rule.UnlockedWait)
		}
	}
	p.owner = g.implicitOwner(v.Req, *o)
	start := time.Now()
	deadline := start.Add(wait)
	// Every namespace's locks are taken before any is recorded for the
	// write, so that a guess proved wrong leaves nothing to undo but the
	// locks.
	type takenNS struct {
		n     enforce.Need
		locks []lockstore.Lock
		t0    time.Time
		// memory: the locks are held in the lock store's memory, and the
		// write must have ended within budget of t0.
		memory bool
		budget time.Duration
	}
	got := make([]takenNS, 0, len(all))
	for _, n := range all {
		t0 := time.Now()
		// A first attempt that does not wait tells a write that waited
		// from one that did not, for the metrics, at the price of one
		// more attempt only when the locks are busy.
		var locks []lockstore.Lock
		var err error
		var inMemory bool
		var budget time.Duration
		taking := g.flights.StartTaking()
		switch {
		case p.mode == config.UnlockedWait && n.NS.String() == p.busyNS:
			err = lockstore.ErrBusy
		case g.testImplicit != nil && g.testImplicit.naive:
			_, _ = g.opts.Store.Acquire(ctx, p.owner, n.NS, n.IDs, g.opts.ImplicitLease, 0)
			locks, err = g.naiveImplicit(ctx, p.owner, n.NS, n.IDs)
		default:
			if ml, ok := g.opts.Store.(memoryLocker); ok && !fenced(n.Rule) && !g.noMemoryLocks() {
				// Alone on the lock store, an uncontended write's locks
				// need no round trip (lockstore/memlock.go); a fenced
				// rule needs the store's tokens.
				locks, budget, inMemory = ml.AcquireInMemory(p.owner, n.NS, n.IDs)
				if inMemory && budget-n.Rule.LeaseMargin < minMemoryWrite {
					// The rule's lease margin would leave the write too
					// little time (launchDecision subtracts it): store
					// locks, with their lease, serve it better.
					g.releaseMemory(p.owner, n.NS, n.IDs)
					locks, inMemory = nil, false
				}
			}
			if !inMemory {
				locks, err = g.opts.Store.Acquire(ctx, p.owner, n.NS, n.IDs, g.opts.ImplicitLease, 0)
			}
		}
		if err != nil && guessed && !(g.testImplicit != nil && g.testImplicit.trustGuess) {
			g.flights.StopTaking(taking)
			// Some key was held (perhaps by this very session, through
			// another lockgate) or the store failed: the skipped checks
			// decide, as today, before anything else does.
			g.releaseImplicit(p)
			// Nothing of this attempt may outlive it: a write that the
			// checks find to be a lock holder's is not implicit.
			p.mode, p.waited = "", false
			if errors.Is(err, lockstore.ErrBusy) {
				p.busyNS = n.NS.String()
			}
			g.checkUnchecked(ctx, v, o)
			return g.takeImplicit(ctx, v, o, inserts)
		}
		if err != nil && ownInsert(p, n, o, err) {
			// The session holds the lock on an _id it inserts: the
			// lock-then-insert its lock is for. A lock-aware writer, it
			// is answered as today (its insert allowed, its other
			// writes checked), without waiting on its own lock.
			g.flights.StopTaking(taking)
			g.releaseImplicit(p)
			p.mode, p.waited = "", false
			return asToday()
		}
		if p.mode == config.UnlockedWait && errors.Is(err, lockstore.ErrBusy) {
			p.waited = true
			if h := g.testImplicit; h != nil && h.waiting != nil {
				h.waiting(n.NS)
			}
			locks, err = g.opts.Store.Acquire(ctx, p.owner, n.NS, n.IDs, g.opts.ImplicitLease, max(time.Until(deadline), time.Millisecond))
		}
		if err != nil {
			g.flights.StopTaking(taking)
			g.releaseImplicit(p)
			g.implicitRefused(ctx, v, n, o, err)
			g.metrics.implicit(p.mode, implicitOutcome(err), time.Since(start))
			return inserts
		}
		ids := make([]docid.ID, len(locks))
		for i, l := range locks {
			ids[i] = l.ID
		}
		p.taken.Add(n.NS, ids)
		if !g.flights.Took(&p.pending, p.owner, n.NS, ids, taking) {
			g.releaseImplicit(p)
			v.Violations = append(v.Violations, enforce.Violation{Rule: *n.Rule, Write: v.FirstWrite(n.NS), Reason: enforce.ReasonNotLocked,
				Detail: "this session holds no lock, and an operator force-released the lock on a document of this write while lockgate was taking it for the write, so the write is refused",
				Advice: "nothing was written: retry"})
			g.metrics.implicit(p.mode, "error", time.Since(start))
			return inserts
		}
		got = append(got, takenNS{n: n, locks: locks, t0: t0, memory: inMemory, budget: budget})
	}
	p.unchecked = nil // proved: the session held none of them
	for _, x := range got {
		n, locks := x.n, x.locks
		leaseLeft := g.opts.ImplicitLease - time.Since(x.t0) - g.opts.ImplicitLease/20
		if x.memory {
			// Not a lease: the time by which the write must have ended,
			// which its maxTimeMS is capped at (no renewal extends it).
			leaseLeft = x.budget - time.Since(x.t0)
		}
		ids := make([]docid.ID, len(locks))
		for i, l := range locks {
			ids[i] = l.ID
		}
		v.flightLocks(p.owner, n.Rule, n.NS, ids, leaseLeft)
		v.Check(n.NS, ids)
		if fenced(n.Rule) {
			if err := g.fenceImplicit(ctx, v, n, locks); err != nil {
				g.releaseImplicit(p)
				w := v.FirstWrite(n.NS)
				v.Violations = append(v.Violations, enforce.Violation{Rule: *n.Rule, Write: w, Reason: reasonFenceStamp,
					Detail: fmt.Sprintf("the fencing token of its implicit lock could not be stamped into the documents (%v)", err)})
				return inserts
			}
		}
	}
	if h := g.testImplicit; h != nil && h.taken != nil {
		h.taken(p.owner)
	}
	outcome := "taken"
	if p.waited {
		outcome = "waited"
	}
	g.metrics.implicit(p.mode, outcome, time.Since(start))
	if v.flight != nil {
		v.flight.implicit = p
	}
	return inserts
}

// ownInsert reports whether err says that the session o itself holds
// the lock on an _id that n's namespace's inserts of the write create.
func ownInsert(p *implicitPlan, n enforce.Need, o *lockstore.Owner, err error) bool {
	var he *lockstore.HeldError
	if len(o.Session) == 0 || !errors.As(err, &he) || he.Holder.SessionPrefix != lockstore.SessionPrefix(o.Session) {
		return false
	}
	for _, in := range p.inserts {
		if in.NS == n.NS && slices.ContainsFunc(in.IDs, he.ID.Equal) {
			return true
		}
	}
	return false
}

// minMemoryWrite is the least maxTimeMS a write under memory locks is
// given; below it the write takes store locks.
const minMemoryWrite = 250 * time.Millisecond

// releaseMemory gives back memory locks that will not be used (no round
// trip: the store holds them in memory).
func (g *Guard) releaseMemory(o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) {
	if _, err := g.opts.Store.Release(context.Background(), o, ns, ids, ""); err != nil {
		g.log.Warn("giving back unused memory locks failed; they end with their budget", zap.String("ns", ns.String()), zap.Error(err))
	}
}

// memoryLocker holds implicit locks in the lock store's memory when that
// is sound (lockstore.Store, while it is alone on its lock store).
type memoryLocker interface {
	AcquireInMemory(owner lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Lock, time.Duration, bool)
}

var _ memoryLocker = (*lockstore.Store)(nil)

// implicitOutcome is the metric label of a failed implicit acquire.
func implicitOutcome(err error) string {
	var he *lockstore.HeldError
	switch {
	case errors.As(err, &he) && he.Timeout:
		return "timeout"
	case errors.As(err, &he):
		return "refused"
	}
	return "error"
}

// implicitOwner is the owner of one write's implicit locks: a session of
// its own (random, so that no client session can ever act as it), shown
// with the writer's application, address and user, and marked implicit
// with the command.
func (g *Guard) implicitOwner(req *proxy.Request, o lockstore.Owner) lockstore.Owner {
	var s [16]byte
	_, _ = crand.Read(s[:])
	name := "write"
	if req.Command != nil {
		name = req.Command.Name
	}
	return lockstore.Owner{
		Session:  s[:],
		App:      req.Client.AppName(),
		Client:   req.Client.Addr,
		User:     req.Client.User(),
		Implicit: name,
	}
}

// implicitRefused records why the implicit locks of n could not be taken:
// held (refuseIfLocked), still held after unlockedWaitMS (wait), or the
// lock store's failure. Only an _id the request named is shown, with its
// holder; of a document found by resolving a filter, neither.
func (g *Guard) implicitRefused(ctx context.Context, v *verdict, n enforce.Need, o *lockstore.Owner, err error) {
	w := v.FirstWrite(n.NS)
	var he *lockstore.HeldError
	if !errors.As(err, &he) {
		v.Violations = append(v.Violations, enforce.Violation{Rule: *n.Rule, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store could not take the implicit locks of this session's write, which holds none (%v), so the write is refused (fail closed)", err)})
		return
	}
	if len(o.Session) > 0 && he.Holder.SessionPrefix == lockstore.SessionPrefix(o.Session) {
		// Its own lock, with too little lease left: the write is a lock
		// holder's after all, and is told so as today.
		g.checker.Refuse(ctx, &v.Verdict, n.Rule, o, n.NS, n.IDs)
		return
	}
	x := enforce.Violation{Rule: *n.Rule, Write: w, Reason: enforce.ReasonHeldByOther}
	what := "a document its filter matches"
	if v.IsNamed(n.NS, he.ID) {
		x.IDs, x.Holder = []docid.ID{he.ID}, &he.Holder
		what = "_id " + he.ID.String()
	}
	holder := ""
	if x.Holder != nil {
		holder = " (" + refuse.DescribeHolder(he.Holder) + ")"
	}
	if he.Timeout {
		x.Reason, x.Code = reasonImplicitTimeout, mongoerr.LockTimeout
		x.Detail = fmt.Sprintf("this session holds no lock, and %s was still locked by another session%s after %s (unlockedWaitMS)", what, holder, lockstore.FormatMS(n.Rule.UnlockedWait))
		x.Advice = "nothing was written: retry later"
	} else {
		x.Detail = fmt.Sprintf("this session holds no lock, and %s is locked by another session%s (unlockedWriters: refuseIfLocked)", what, holder)
		x.Advice = "nothing was written: retry once the holder has released it"
	}
	v.Violations = append(v.Violations, x)
}

// fenceImplicit stamps the tokens of a write's implicit locks into the
// documents of a fenced namespace, as acquireLock does, and gives them to
// the fence plan, so that the write applies only where the stamp is its
// own and a stale holder's late write is refused by the database.
func (g *Guard) fenceImplicit(ctx context.Context, v *verdict, n enforce.Need, locks []lockstore.Lock) error {
	ids := make([]docid.ID, len(locks))
	tokens := make([]int64, len(locks))
	for i, l := range locks {
		ids[i], tokens[i] = l.ID, l.Token
	}
	db, ok := g.opts.Resolver.(fence.DB)
	if !ok {
		return errors.New("no client to stamp documents with")
	}
	if err := db.StampFence(ctx, n.NS, n.Rule.FenceField, ids, tokens); err != nil {
		return err
	}
	fp := v.fencePlan()
	for i, id := range ids {
		fp.tokens[docid.KeyOf(n.NS, id)] = tokens[i]
	}
	// Inserts of this namespace carry their implicit lock's token.
	for i := range fp.stmts {
		s := &fp.stmts[i]
		if s.w.Kind != policy.KindInsert || s.w.NS.String() != n.NS.String() {
			continue
		}
		id, found, certain := policy.InsertID(s.w)
		if !found || !certain {
			continue
		}
		did, err := enforce.IDCopy(id)
		if err != nil {
			continue
		}
		if t, ok := fp.token(n.NS, did); ok {
			s.insertID, s.insertToken = did, []int64{t}
		}
	}
	return nil
}

// releaseImplicit frees a write's implicit locks: once the database has
// answered it (its flight lands), or at once when it is not forwarded.
// It runs before the answer is relayed, so that the writer's next write
// never finds its previous one's locks still held.
func (g *Guard) releaseImplicit(p *implicitPlan) {
	if p == nil {
		return
	}
	// Once the locks are given back (or were never taken), nothing of
	// this write can leave: a force-release need not wait for it.
	defer g.flights.Unhold(&p.pending)
	if len(p.taken) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range p.taken {
		if _, err := g.opts.Store.Release(ctx, p.owner, l.NS, l.IDs, ""); err != nil {
			g.log.Warn("releasing a write's implicit locks failed; they expire with their lease", zap.String("ns", l.NS.String()), zap.Error(err))
		}
	}
	p.taken = nil
}

// settleImplicit releases the implicit locks of a write that is not
// forwarded after all (refused by a later step: its audit record, its
// pinning), which no flight will release.
func (g *Guard) settleImplicit(v *verdict, d proxy.Decision) proxy.Decision {
	if v.implicit != nil && !v.implicit.launched {
		g.releaseImplicit(v.implicit)
	}
	return d
}

// implicitTestHooks let tests see and change how implicit locks are taken.
type implicitTestHooks struct {
	// waiting runs when a write starts queueing for its implicit locks.
	waiting func(ns namespace.Namespace)
	// taken runs once they are held, just before the write is decided.
	taken func(owner lockstore.Owner)
	// naive replaces taking the locks by a check that nobody holds them
	// (and releases the locks taken): the "check, then forward" that the
	// implicit lock exists to avoid, for the test that shows its window.
	naive bool
	// storeOnly keeps implicit locks out of the lock store's memory, for
	// tests of the store path.
	storeOnly bool
	// trustGuess takes skipHeldCheck's guess for proved even when the
	// implicit acquire fails: the shortcut without its confirmation, for
	// the test that shows what the confirmation is for.
	trustGuess bool
}

func (g *Guard) noMemoryLocks() bool { return g.testImplicit != nil && g.testImplicit.storeOnly }

// naiveImplicit is implicitTestHooks.naive's check: the locks are taken
// and given back at once, which only tells that nobody held them.
func (g *Guard) naiveImplicit(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Lock, error) {
	if _, err := g.opts.Store.Release(ctx, o, ns, ids, ""); err != nil {
		return nil, err
	}
	return nil, nil
}

// implicitMode is the unlockedWriters mode under which the write's
// implicit locks were taken or sought, "" for a write decided as a lock
// holder's: the decision log's "implicit" field.
func (v *verdict) implicitMode() string {
	if v.implicit == nil {
		return ""
	}
	return string(v.implicit.mode)
}

// implicitDetail is the audit trail's detail of an allowed write that ran
// under implicit locks.
func implicitDetail(mode string) string {
	return "written under implicit locks: the session held none (unlockedWriters: " + mode + ")"
}
