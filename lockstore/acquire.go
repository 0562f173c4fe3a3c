package lockstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// streamPollCap is the backoff ceiling while a change stream delivers
// releases: polling is then only a safety net.
const streamPollCap = 2 * time.Second

// lockKey is one distinct lock key of a call.
type lockKey struct {
	rid string   // record _id: namespace + canonical key
	id  docid.ID // the caller's _id
	// floor, when above 0, is a token a grant to a new holder must pass
	// (WithTokenFloors).
	floor int64
}

// keys validates ns and returns the distinct keys of ids in request order
// (the first spelling of an id wins: [1, 1.0] is one key).
func keys(ns namespace.Namespace, ids []docid.ID) ([]lockKey, error) {
	ks, _, err := keysIndexed(ns, ids, false)
	return ks, err
}

// canonicalOrder returns the keys sorted by record id, the one order in
// which every caller takes several locks.
func canonicalOrder(ks []lockKey) []lockKey {
	s := slices.Clone(ks)
	slices.SortFunc(s, func(a, b lockKey) int { return strings.Compare(a.rid, b.rid) })
	return s
}

func checkOwner(o Owner) error {
	if len(o.Session) == 0 {
		return fmt.Errorf("%w: a lock needs a session (lsid)", ErrInvalidArgument)
	}
	return nil
}

// lease resolves a requested lease: 0 means DefaultLease.
func (s *Store) lease(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("%w: negative lease %s", ErrInvalidLease, FormatMS(d))
	case d == 0:
		return s.cfg.DefaultLease, nil
	case d > s.cfg.MaxLease:
		return 0, fmt.Errorf("%w: lease %s exceeds the maximum (lockstore.maxLeaseMS) of %s", ErrInvalidLease, FormatMS(d), FormatMS(s.cfg.MaxLease))
	}
	return d, nil
}

// Acquire takes the locks on ids in namespace ns for owner, all or nothing.
//
// lease 0 means Config.DefaultLease; a lease over Config.MaxLease is
// ErrInvalidLease. wait 0 fails fast with a *HeldError (ErrBusy) if any id
// is held by another owner; wait > 0 waits up to that long and then fails
// with a *HeldError (ErrTimeout). Ids that the owner already holds are
// re-entrant: their lease is set to end lease from now and their token is
// kept. Keys are taken in canonical order; when one is busy, the ones this
// call newly took are released again (their tokens may have advanced: tokens
// have gaps but never go back) and the ones the owner already held stay
// held. Duplicate ids (as MongoDB compares them) count once. The returned
// locks follow the order of the distinct ids.
//
// A context made by WithTokenFloors gives each id a token its grant must
// pass.
func (s *Store) Acquire(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]Lock, error) {
	floors, _ := ctx.Value(floorsKey{}).([]int64)
	if floors != nil && len(floors) != len(ids) {
		return nil, fmt.Errorf("%w: %d token floors for %d ids", ErrInvalidArgument, len(floors), len(ids))
	}
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	lease, err := s.lease(lease)
	if err != nil {
		return nil, err
	}
	if wait < 0 {
		return nil, fmt.Errorf("%w: negative wait %s", ErrInvalidArgument, FormatMS(wait))
	}
	ks, idx, err := keysIndexed(ns, ids, floors != nil)
	if err != nil {
		return nil, err
	}
	for i, f := range floors {
		k := 0
		if idx != nil {
			k = idx[i]
		}
		ks[k].floor = max(ks[k].floor, f)
	}
	if err := s.ready(ctx); err != nil {
		s.m.acquisitions.WithLabelValues(resultError).Inc()
		return nil, err
	}
	if err := s.checkSessionLimit(owner, ks); err != nil {
		s.m.acquisitions.WithLabelValues(resultError).Inc()
		return nil, err
	}
	start := time.Now()
	ordered := canonicalOrder(ks)
	var got map[string]Lock
	if wait == 0 {
		got, err = s.acquireAll(ctx, owner, ns, ordered, lease, nil)
	} else {
		got, err = s.acquireWait(ctx, owner, ns, ordered, lease, wait)
		s.m.waitSeconds.Observe(time.Since(start).Seconds())
	}
	result := resultOK
	switch {
	case errors.Is(err, ErrBusy):
		result = resultBusy
	case errors.Is(err, ErrTimeout):
		result = resultTimeout
	case err != nil:
		result = resultError
	}
	s.m.acquisitions.WithLabelValues(result).Inc()
	if ce := s.log.Check(zap.DebugLevel, "acquire"); ce != nil {
		ce.Write(zap.String("ns", ns.String()), zap.Int("ids", len(ks)), zap.String("holder", SessionPrefix(owner.Session)),
			zap.String("app", owner.App), zap.Duration("lease", lease), zap.Duration("wait", wait),
			zap.String("result", result), zap.Duration("took", time.Since(start)), zap.Error(err))
	}
	if err != nil {
		return nil, err
	}
	out := make([]Lock, len(ks))
	for i, k := range ks {
		out[i] = got[k.rid]
	}
	return out, nil
}

// checkSessionLimit refuses an acquire that would leave owner's session
// holding more than Config.MaxLocksPerSession locks through this Store.
// Concurrent acquires of one session may overshoot by what they add
// together; a session is used by one caller at a time.
func (s *Store) checkSessionLimit(owner Owner, ks []lockKey) error {
	max := s.cfg.MaxLocksPerSession
	if max <= 0 {
		return nil
	}
	rids := make([]string, len(ks))
	for i, k := range ks {
		rids[i] = k.rid
	}
	now, unc := s.clock.Now()
	held, fresh := s.owned.count(owner.Session, rids, now.Add(-unc))
	if held+fresh > max {
		return fmt.Errorf("%w: the session holds %d locks and asks for %d more, over the limit of %d per session; release locks it no longer needs first",
			ErrTooManyLocks, held, fresh, max)
	}
	return nil
}

// HoldsAnyHere reports whether session holds, or may still hold, a lock
// taken or renewed through this Store, from memory (the owned index).
// false says nothing of locks taken through other Stores: the guard only
// uses it to guess that a write is a legacy writer's before the implicit
// acquire, which refuses any key the session holds, confirms the guess
// (guard/implicit.go).
func (s *Store) HoldsAnyHere(session []byte) bool {
	now, unc := s.clock.Now()
	held, _ := s.owned.count(session, nil, now.Add(-unc))
	return held > 0
}

// acquireAll makes one all-or-nothing attempt in canonical order. self is
// the calling waiter, not woken by its own rollback.
func (s *Store) acquireAll(ctx context.Context, owner Owner, ns namespace.Namespace, ordered []lockKey, lease time.Duration, self *waiter) (map[string]Lock, error) {
	if err := s.startAcquire(ns, ordered); err != nil {
		return nil, err // a key is held in memory (memlock.go)
	}
	defer s.doneAcquire(ns)
	got := make(map[string]Lock, len(ordered))
	var fresh []string
	for _, k := range ordered {
		l, isNew, err := s.tryOne(ctx, owner, ns, k, lease)
		if err != nil {
			s.rollback(ctx, owner, fresh, self)
			return nil, err
		}
		if isNew {
			fresh = append(fresh, k.rid)
		}
		got[k.rid] = l
	}
	return got, nil
}

// tryOne takes one key or reports who holds it. isNew is false when the
// owner already held it (re-entrant: same token, lease extended).
func (s *Store) tryOne(ctx context.Context, owner Owner, ns namespace.Namespace, k lockKey, lease time.Duration) (l Lock, isNew bool, err error) {
	if s.testHookTry != nil {
		s.testHookTry(k.rid)
	}
	var reentrant, takeover bool
	var former Holder
	var at time.Time
	step := func(h *gen, now time.Time, unc time.Duration) (*gen, error) {
		reentrant, takeover, at = false, false, now
		exp := now.Add(lease).Truncate(time.Millisecond)
		if h != nil && h.Owner != nil && h.ExpiresAt.Add(s.cfg.TakeoverGrace).After(now.Add(-unc)) {
			if !h.ownedBy(owner) {
				return nil, &HeldError{NS: ns, ID: k.id, Holder: h.holder()}
			}
			reentrant = true
			n := h.next(kindRenew, now)
			n.ExpiresAt = exp
			return n, nil
		}
		// Free, or expired for certain whatever this instance's clock error.
		var n *gen
		if h == nil {
			n = &gen{ID: genID(k.rid, 1), Key: k.rid, Seq: 1, NS: ns.String(), Value: k.id.Raw(), At: now,
				Token: now.UnixNano()} // see docs/LOCKS.md, "Fencing tokens"
		} else {
			takeover = h.Owner != nil
			if takeover {
				former = h.holder()
			}
			n = h.next(kindAcquire, now)
			n.Token = h.Token + 1
		}
		n.Token = aboveFloor(n.Token, k.floor, now, unc)
		n.Kind = kindAcquire
		n.Owner, n.Bind, n.OwnerApp, n.OwnerClient, n.OwnerUser = sessionBinary(owner.Session), owner.Bind, owner.App, owner.Client, owner.User
		n.Implicit = owner.Implicit
		n.AcquiredAt, n.ExpiresAt = now, exp
		return n, nil
	}
	g, _, err := s.transition(ctx, opAcquire, k.rid, step)
	var ue *unsureError
	if errors.As(err, &ue) && !reentrant {
		// The caller is told it holds nothing and will release nothing:
		// a grant that landed regardless must not outlive this call.
		s.undoGrant(ctx, owner, ue.g)
	}
	if errors.Is(err, errContended) {
		// The key kept changing hands under us: for the caller that is
		// "busy" (and a waiter simply tries again).
		return l, false, &HeldError{NS: ns, ID: k.id}
	}
	if err != nil {
		return l, false, err
	}
	if takeover {
		s.m.expired.Inc() // a lease ended without a release
		if s.onExpire != nil {
			s.onExpire(Expiry{NS: ns, ID: k.id, Former: former, Token: g.Token, At: at})
		}
	}
	return Lock{ID: k.id, Token: g.Token, ExpiresAt: g.ExpiresAt, LastError: g.LastError}, !reentrant, nil
}

type floorsKey struct{}

// WithTokenFloors is ctx for an Acquire whose locks may have to pass a
// token the caller knows of: floors[i] for the acquire's ids[i] (0:
// none), such as the fence stamp a fenced document carries, which
// another lock store (a lockgate with a lock store of its own, or one
// whose clock estimate is ahead) may have written. A grant to a new
// holder, a first token included, then gets a token above its floor; a
// re-entrant acquire keeps its token. The floors ride on the context,
// not on a method of their own, so that every wrapper of the store's
// Acquire (the audit trail's) sees the acquire as it is.
func WithTokenFloors(ctx context.Context, floors []int64) context.Context {
	return context.WithValue(ctx, floorsKey{}, floors)
}

// floorAhead bounds how far above the server's time a floor may be and
// still be taken for a token some lock store handed out: a first token is
// the server clock in nanoseconds, and each grant adds one, so a key
// would need billions of grants to get an hour ahead. A stamp further
// ahead was written by hand (or by a writer the fence does not cover),
// and tokens built on it would have nowhere left to grow: it is no floor,
// and the caller's stamp fails as it would have.
const floorAhead = time.Hour

// aboveFloor is token, raised above floor where floor is a token some
// store could have handed out by now.
func aboveFloor(token, floor int64, now time.Time, unc time.Duration) int64 {
	if floor < token || floor > now.Add(unc+floorAhead).UnixNano() {
		return token
	}
	return floor + 1
}

// maxRaces bounds how often one operation retries a key whose head keeps
// changing under it.
const maxRaces = 8

// errContended reports a key that changed maxRaces times during one call.
var errContended = errors.New("lock key changed too often during the call")

// stepFunc decides the next generation of a key from its head (nil when
// the key has none) at server time now ± unc. It returns nil to do nothing
// (with an error, e.g. *HeldError, or without). It may run several times.
type stepFunc func(h *gen, now time.Time, unc time.Duration) (*gen, error)

// transition applies step to the state of rid and makes the result the
// next generation: it inserts the claim (the atomic step) and then the head
// document. It starts from the cached head when that is recent (one round
// trip fewer), confirms any refusal made on a cached head with a read, and
// on a duplicate claim reads the claim that won and goes on from there. It
// returns the generation written (nil if step declined) and the last state
// seen.
func (s *Store) transition(ctx context.Context, op, rid string, step stepFunc) (written, head *gen, err error) {
	// h is the state to build on; maybeStale says a newer one may exist
	// (h came from the cache or from a claim that beat us).
	h, maybeStale := s.guess(rid), true
	if h == nil {
		maybeStale = false
		if h, err = s.head(ctx, rid); err != nil {
			return nil, nil, err
		}
		s.remember(rid, h)
	}
	quiesced := int64(-1) // the generation after which quiesce waited
	searched := false     // whether a refusal was checked against the claims
	for range maxRaces {
		now, unc := s.clock.Now()
		next, serr := step(h, now, unc)
		if next == nil {
			if maybeStale {
				// Decide on the current head document instead, unless it
				// lags behind what we already know.
				maybeStale = false
				fresh, err := s.head(ctx, rid)
				if err != nil {
					return nil, nil, err
				}
				if fresh != nil && (h == nil || fresh.Seq > h.Seq) {
					h = fresh
					s.remember(rid, h)
					continue
				}
			}
			if !searched {
				// The head document may lag behind the claims (a late head
				// write moves it back): a refusal stands only on the
				// newest claim, or a holder's renewal or release would be
				// refused, and an acquire kept waiting, on a hold that has
				// ended. One read when nothing follows h, as newest.
				searched = true
				fresh, err := s.newestClaim(ctx, rid, h)
				if err != nil {
					return nil, nil, err
				}
				// A tombstone there (the key collected) leaves the refusal
				// as it is: a collected key is free, and fails closed.
				if fresh != nil && fresh.Kind != kindGC && (h == nil || fresh.Seq > h.Seq) {
					h = fresh
					s.remember(rid, h)
					continue
				}
			}
			return nil, h, serr
		}
		next.Via = s.via
		next.Shared = continues(h, next) && (h.Shared || h.Via != s.via)
		mark := s.mustQuiesce(h, next, now, unc) && quiesced != h.Seq
		if mark {
			// Another Store may answer "held" for h from memory: first
			// write a generation of the same hold through this one (that
			// Store stops trusting h at its next confirmation), then wait
			// until its trust in h has surely run out.
			next = h.next(kindRenew, now)
			next.Via, next.Shared = s.via, true
		}
		if next.Owner != nil && !continues(h, next) {
			// A new holder: no other Store's insert check may be blind
			// to it (instances.go).
			if err := s.mayGrant(ctx); err != nil {
				return nil, h, err
			}
		}
		sent := time.Now()
		if next.Owner != nil {
			s.heldNS.mark(next.NS, sent)
		}
		s.gview.writing(next)
		ok, err := s.insert(ctx, op, next)
		s.gview.written(next, s.cfg.TakeoverGrace, ok, err)
		if err != nil {
			// The claim may have landed all the same (a reply lost).
			s.cache.remove(rid)
			return nil, h, &unsureError{g: next, err: err}
		}
		if ok {
			if s.testHookHead != nil {
				s.testHookHead(next)
			}
			if err := s.writeHead(ctx, op, next); err != nil {
				// The claim stands but readers of the head document do not
				// see it yet; the next change rolls forward past it. Report
				// the failure: the caller must not rely on the change (an
				// acquire undoes it: undoGrant).
				s.cache.remove(rid)
				return nil, h, &unsureError{g: next, err: err}
			}
			// Unless a later generation reached the cache meanwhile (this
			// head write was overtaken by a change through this Store).
			s.cache.putUnlessNewer(rid, holdEntry{g: next, verified: time.Now(), confirmed: sent, own: next.Owner != nil && !mark}, sent)
			s.owned.changed(rid, h, next)
			if next.Owner != nil {
				// Again, now that the grant has landed: a refresh sent
				// before this moment may have missed it (heldns.go).
				s.heldNS.mark(next.NS, time.Now())
			}
			if !mark {
				return next, next, nil
			}
			if err := s.quiesce(ctx, time.Now()); err != nil {
				return nil, next, err
			}
			h, maybeStale, quiesced = next, true, next.Seq
			continue
		}
		// Someone else made generation next.Seq first: go on from it (and
		// check the head document if that leads to a refusal).
		// The head document is usually already there (and is the cheaper
		// read); the winning claim is the fallback while it lags.
		s.cache.remove(rid)
		maybeStale = true
		fresh, err := s.head(ctx, rid)
		if err != nil {
			return nil, nil, err
		}
		if fresh == nil || fresh.Seq < next.Seq {
			won, err := s.claim(ctx, rid, next.Seq)
			if err != nil {
				return nil, nil, err
			}
			if won != nil { // nil: compacted meanwhile, only after CleanupAfter
				// The head lags behind the claims: go on from the newest
				// claim, not from one generation after another (a head
				// far behind would use up maxRaces on duplicates).
				if won.Kind != kindGC {
					if won, err = s.newestClaim(ctx, rid, won); err != nil {
						return nil, nil, err
					}
				}
				fresh = won
			}
		}
		if fresh != nil && fresh.Kind == kindGC {
			// The janitor's tombstone (CollectHeads).
			s.cache.remove(rid)
			h, maybeStale = afterTombstone(h, fresh, s.cfg.CleanupAfter), false
			continue
		}
		h = fresh
	}
	if h != nil && h.Owner != nil {
		return nil, h, &HeldError{NS: namespace.Of(h.NS), ID: h.lockedID(), Holder: h.holder()}
	}
	return nil, h, fmt.Errorf("%w: %w", ErrUnavailable, errContended)
}

// continues tells whether next keeps the hold of h (a renewal or a
// re-entrant acquire): same owner, same token.
func continues(h, next *gen) bool {
	return h != nil && h.Owner != nil && next.Owner != nil && next.Token == h.Token &&
		string(h.Owner.Data) == string(next.Owner.Data) && h.Bind == next.Bind
}

// mustQuiesce tells whether next, which ends the hold of h (a release,
// force-release or handoff), must wait for other Stores first: one of them
// may still answer "held" for h from memory when it wrote h, or an earlier
// generation of the same hold (h.Shared). A lease that surely ended is
// trusted nowhere, and a hold only this Store changed is in no other
// Store's cache as trusted.
func (s *Store) mustQuiesce(h, next *gen, now time.Time, unc time.Duration) bool {
	if s.cfg.CacheTrust <= 0 || h == nil || h.Owner == nil || !h.ExpiresAt.After(now.Add(-unc)) || continues(h, next) {
		return false
	}
	return h.Via != s.via || h.Shared
}

// quiesce waits until every other Store's trust in the generations before
// the one whose claim and head this Store had written by local time
// written has run out. Each trusts one for CacheTrust after a moment at
// which it was surely the newest (holdEntry.confirmed: before a write of
// it, or before a read of its head), which came before that head write;
// the wait adds a margin for the rate at which two machines' clocks may
// differ.
func (s *Store) quiesce(ctx context.Context, written time.Time) error {
	d := time.Until(written.Add(s.cfg.CacheTrust + s.cfg.CacheTrust/64 + time.Millisecond))
	if d <= 0 {
		return nil
	}
	s.m.quiesces.Inc()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lockstore: waiting for other lockgates to stop trusting the lock: %w", ctx.Err())
	case <-s.ctx.Done():
		return ErrClosed
	}
}

// remember caches a head document just read, so that the next change of
// the key can start from it.
func (s *Store) remember(rid string, h *gen) {
	if h != nil {
		s.cache.put(rid, holdEntry{g: h, verified: time.Now()})
	}
}

// writeHead replaces the head document of claim g's key. It filters on _id
// alone (the only filter FerretDB answers from an index); a slower writer
// of an older generation may therefore move the head document back, even
// to a hold that has ended since. Changes are decided by the claims, and
// readers of a head that names a holder check the claim after it (newest).
func (s *Store) writeHead(ctx context.Context, op string, g *gen) error {
	err := s.rt(ctx, op, func(ctx context.Context) error {
		_, err := s.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: g.Key}}, g.asHead(), options.Replace().SetUpsert(true))
		return err
	})
	if mongo.IsDuplicateKeyError(err) {
		return nil // a concurrent first write of the head document
	}
	if err == nil && s.testHookWrote != nil {
		err = s.testHookWrote("head", g)
	}
	return s.storeErr(ctx, op, err)
}

// guess returns the cached state of rid if it is recent enough to build on
// without a read; a wrong guess costs one duplicate claim. It must be much
// younger than the compaction grace (see Cleanup).
func (s *Store) guess(rid string) *gen {
	e, ok := s.cache.get(rid)
	if !ok || time.Since(e.verified) > min(s.cfg.CleanupAfter/8, 30*time.Second) {
		return nil
	}
	return e.g
}

// insert inserts claim g; ok is false if that generation already exists (a
// duplicate key: someone else changed the key first), which is never an
// error.
func (s *Store) insert(ctx context.Context, op string, g *gen) (bool, error) {
	err := s.rt(ctx, op, func(ctx context.Context) error {
		_, err := s.claims.InsertOne(ctx, g)
		return err
	})
	if mongo.IsDuplicateKeyError(err) {
		return false, nil
	}
	if err == nil && s.testHookWrote != nil {
		err = s.testHookWrote("claim", g)
	}
	if err != nil {
		return false, s.storeErr(ctx, op, err)
	}
	return true, nil
}

// head reads the head document of rid; nil if the key was never locked.
// A writer may decide on it as it is: a head that lags only costs it a
// duplicate claim. A reader that answers from it uses heads.
func (s *Store) head(ctx context.Context, rid string) (*gen, error) {
	return s.byID(ctx, s.coll, rid)
}

// maxProbes bounds the claim reads of one newest call. Its search
// covers twice as many generations with each read until it finds a
// missing one, so a key that gains generations while it reads (each
// needs a claim and a head write) is overtaken within a few reads; the
// bound only stops a store that answers wrongly (and keeps the step far
// from overflowing: 2^47 generations ahead at most). Past it newest
// fails, so that callers fail closed.
const maxProbes = 48

// newest returns head h, unless the claims hold a later generation of its
// key: then the newest of those, as it stood at some moment during the
// call. The head write is not conditional (see writeHead), so the writer
// of an older generation can replace a newer head after it and leave the
// head showing a hold that has ended since: a holder's renewal overtaken
// by its own release and another owner's acquire would then be "held" by
// the holder that released. Claims are never replaced, so they tell;
// only where h names a holder whose lease may not have ended (a free or
// ended head that lags can only make a reader say "not held").
//
// A key's claims after h are one run of generations: each is inserted
// only once the one before it exists, and compaction deletes the oldest
// first. The newest is found by exact _id reads (the only reads FerretDB
// answers from an index), one when nothing follows h: the distance
// ahead doubles while claims are found, then halves between the newest
// found and the first missing. A generation whose claim existed while
// the one after it did not was the newest at that moment; nothing in the
// generations jumped over changes the answer (tombstones aside, see
// probe). A key whose generations keep coming is therefore never chased
// one claim at a time.
func (s *Store) newest(ctx context.Context, rid string, h *gen) (*gen, error) {
	now, unc := s.clock.Now()
	if h.Owner == nil || !h.ExpiresAt.After(now.Add(-unc)) {
		return h, nil
	}
	return s.newestClaim(ctx, rid, h)
}

// newestClaim is newest's search from h whatever it shows; h nil (no head
// document) searches from generation 1 and returns nil if it has no claim.
func (s *Store) newestClaim(ctx context.Context, rid string, h *gen) (*gen, error) {
	var lo int64 // the newest generation found, and its state cur
	cur := h
	if h != nil {
		lo = h.Seq
	}
	var hi int64 // a generation found missing, 0 until one is
	step := int64(1)
	for probes := 0; hi != lo+1; probes++ {
		if probes == maxProbes {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, errHeadBehind)
		}
		q := lo + step
		if hi != 0 {
			q = lo + (hi-lo)/2
		}
		g, gap, err := s.probe(ctx, rid, q, lo, cur)
		if err != nil {
			return nil, err
		}
		switch {
		case g != nil:
			lo, cur = q, g
			if hi == 0 {
				step *= 2
			}
		case gap != 0:
			hi = gap
		default:
			hi = q
		}
	}
	return cur, nil
}

// probe reads generation q of rid for newest, which knows generation lo
// (state cur, lo < q) to exist. It returns q's state, or nil when q has no
// claim. A tombstone (CollectHeads) is the one claim that can stand apart
// from the key's run of claims: a relic of the key's previous life, ahead
// of a new life that has not reached it. It counts only if the claim
// before it exists (one more read unless that is lo); if not, that
// missing generation is returned as gap. A tombstone after the key's own
// state is stepped over as a writer would (afterTombstone).
func (s *Store) probe(ctx context.Context, rid string, q, lo int64, cur *gen) (g *gen, gap int64, err error) {
	g, err = s.claim(ctx, rid, q)
	if err != nil || g == nil || g.Kind != kindGC {
		return g, 0, err
	}
	prev := cur
	if q-1 != lo {
		if prev, err = s.claim(ctx, rid, q-1); err != nil {
			return nil, 0, err
		}
		if prev == nil {
			return nil, q - 1, nil
		}
	}
	if skip := afterTombstone(prev, g, s.cfg.CleanupAfter); skip != nil {
		return skip, 0, nil
	}
	return g, 0, nil
}

// claim reads the claim of generation seq of rid; nil if there is none.
func (s *Store) claim(ctx context.Context, rid string, seq int64) (*gen, error) {
	if s.testHookClaim != nil {
		s.testHookClaim(rid, seq)
	}
	return s.byID(ctx, s.claims, genID(rid, seq))
}

func (s *Store) byID(ctx context.Context, c *mongo.Collection, id string) (*gen, error) {
	var g gen
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		return c.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&g)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, s.storeErr(ctx, opFind, err)
	}
	return &g, nil
}

// heads reads the head documents of rids (readHeads), each replaced by
// the newest generation after it where it names a holder (newestAll):
// what Holds, Status, List and the background confirmation answer from.
func (s *Store) heads(ctx context.Context, rids []string) (map[string]*gen, error) {
	hs, err := s.readHeads(ctx, rids)
	if err != nil {
		return nil, err
	}
	return hs, s.newestAll(ctx, hs)
}

// readHeads reads the head documents of rids, keyed by record id (a key
// without one is absent): by exact _id for up to perKeyReads keys, else
// with one $in. FerretDB pushes only an exact _id filter down to SQLite
// and reads every head document into its own process for a $in
// (BenchmarkHeadReads). Stock FerretDB v1.24 then still scans the table
// in SQLite, whose _id index is on another expression; the tests'
// embedded server adds one it uses (testserver/embedded, idIndexer).
func (s *Store) readHeads(ctx context.Context, rids []string) (map[string]*gen, error) {
	if len(rids) <= perKeyReads {
		return s.headsByID(ctx, rids)
	}
	return s.headsIn(ctx, rids)
}

// headsIn reads the head documents of rids with one $in.
func (s *Store) headsIn(ctx context.Context, rids []string) (map[string]*gen, error) {
	gens, err := s.findGens(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}}}, nil)
	if err != nil {
		return nil, err
	}
	return headsOf(gens), nil
}

// headsByID reads the head documents of rids one exact _id read after
// another. It answers what headsIn does: each key's head as it stood at
// some moment during the call. A $in promises no more: MongoDB gives no
// snapshot across the documents of one find (it may yield between them;
// FerretDB on SQLite happens to read one statement's snapshot), and
// nothing here needs one, since no write changes two keys' heads at once
// and newestAll goes on to read each live key's claims afterwards anyway.
// The reads go one after another: four at a time gained nothing steady on
// a 2-core machine (BenchmarkHeadReads, exact4), and the store may share
// its client's connection pool with the proxied traffic.
func (s *Store) headsByID(ctx context.Context, rids []string) (map[string]*gen, error) {
	out := make(map[string]*gen, len(rids))
	for _, rid := range rids {
		if _, done := out[rid]; done {
			continue
		}
		h, err := s.head(ctx, rid)
		if err != nil {
			return nil, err
		}
		if h != nil {
			out[h.Key] = h
		}
	}
	return out, nil
}

// perKeyReads is how many keys a read of their heads (readHeads), and a
// read of the claims after them (newestAll), reads by exact _id each
// rather than with one $in: FerretDB answers $in by scanning the
// collection, which on 5000 claims costs 60-110 exact reads
// (BenchmarkClaimReads) and on 5000 heads 25-50 (BenchmarkHeadReads: 16
// exact reads took 0.5-0.6 times a $in, 64 took 1.9-2.2 times).
const perKeyReads = 16

// newestAll is newest for every head in hs: by exact reads for a few keys,
// otherwise after one round trip for the claims after all of them, by
// exact reads for the keys that have one.
func (s *Store) newestAll(ctx context.Context, hs map[string]*gen) error {
	now, unc := s.clock.Now()
	var live []string
	for rid, h := range hs {
		if h.Owner != nil && h.ExpiresAt.After(now.Add(-unc)) {
			live = append(live, rid)
		}
	}
	if len(live) > perKeyReads {
		after := make([]string, len(live))
		for i, rid := range live {
			after[i] = genID(rid, hs[rid].Seq+1)
		}
		var next []gen
		err := s.rt(ctx, opFind, func(ctx context.Context) error {
			cur, err := s.claims.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: after}}}})
			if err != nil {
				return err
			}
			return cur.All(ctx, &next)
		})
		if err != nil {
			return s.storeErr(ctx, opFind, err)
		}
		live = live[:0]
		for _, g := range next {
			live = append(live, g.Key)
		}
	}
	for _, rid := range live {
		var err error
		if hs[rid], err = s.newestClaim(ctx, rid, hs[rid]); err != nil {
			return err
		}
	}
	return nil
}

// headsOf keeps the highest generation of each key.
func headsOf(gens []gen) map[string]*gen {
	out := make(map[string]*gen)
	for i := range gens {
		g := &gens[i]
		if h := out[g.Key]; h == nil || g.Seq > h.Seq {
			out[g.Key] = g
		}
	}
	return out
}

// findGens returns the generations matching filter.
func (s *Store) findGens(ctx context.Context, filter bson.D, opts *options.FindOptions) ([]gen, error) {
	var gens []gen
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		cur, err := s.coll.Find(ctx, filter, opts)
		if err != nil {
			return err
		}
		return cur.All(ctx, &gens)
	})
	return gens, s.storeErr(ctx, opFind, err)
}

// extend sets the lease of a lock that owner holds (and whose lease has not
// ended by this instance's estimate) to end lease from now; ok is false if
// owner does not hold it.
func (s *Store) extend(ctx context.Context, owner Owner, k lockKey, lease time.Duration, op string) (l Lock, ok bool, why string, err error) {
	step := func(h *gen, now time.Time, unc time.Duration) (*gen, error) {
		why = "" // the step runs again on a fresher state: only its last reason counts
		switch {
		case h == nil:
			why = "it was never taken"
		case h.Kind == kindForce && h.Owner == nil:
			why = "an operator force-released it"
			if h.Reason != "" {
				why += fmt.Sprintf(" (reason: %q)", h.Reason)
			}
		case h.Owner == nil:
			why = "it was released"
		case !h.ownedBy(owner):
			why = "another session holds it now"
		case !h.ExpiresAt.After(now):
			why = "its lease ended at " + h.ExpiresAt.UTC().Format(time.RFC3339)
		}
		if why != "" {
			return nil, nil
		}
		n := h.next(kindRenew, now)
		n.ExpiresAt = now.Add(lease).Truncate(time.Millisecond)
		return n, nil
	}
	g, _, err := s.transition(ctx, op, k.rid, step)
	if err != nil || g == nil {
		return l, false, why, err
	}
	return Lock{ID: k.id, Token: g.Token, ExpiresAt: g.ExpiresAt, LastError: g.LastError}, true, "", nil
}

// releaseOne frees rid if match accepts its holder. errText becomes
// lastError unless keepLastError (rollback, session end). With handoff, a
// local waiter for rid alone is granted the key in the same generation
// (handoff.go); it still counts as freed.
func (s *Store) releaseOne(ctx context.Context, op, rid string, match func(*gen) bool, errText string, keepLastError, handoff bool) (bool, error) {
	step := func(h *gen, now time.Time, unc time.Duration) (*gen, error) {
		if h == nil || h.Owner == nil || !match(h) {
			return nil, nil
		}
		n := h.next(kindRelease, now)
		n.Owner, n.Bind, n.OwnerApp, n.OwnerClient, n.OwnerUser, n.Implicit = nil, "", "", "", "", ""
		n.AcquiredAt, n.ExpiresAt = time.Time{}, freeExpiry
		if !keepLastError {
			n.LastError = errText
		}
		return n, nil
	}
	var x *waiter
	if handoff {
		x = s.wq.takeForHandoff(rid)
		if x != nil && s.testHookHandoff != nil {
			s.testHookHandoff(rid)
		}
	}
	g, _, err := s.transition(ctx, op, rid, handoffStep(step, x))
	s.endHandoff(x, g, err)
	if err != nil {
		s.cache.remove(rid) // outcome unknown
		return false, err
	}
	if wk := s.wake.Load(); g != nil && g.Owner == nil && wk != nil {
		wk.freed(rid)
	}
	return g != nil, nil
}

// unsureError is a failed write of generation g whose claim may have
// landed: its insert failed without a duplicate key, or its head document
// write failed after the claim landed. It unwraps to the cause.
type unsureError struct {
	g   *gen
	err error
}

func (e *unsureError) Error() string { return e.err.Error() }
func (e *unsureError) Unwrap() error { return e.err }

// undoGrant releases g, a grant to owner reported failed, if its claim
// landed and the key has not moved on. A release starting from the head
// document cannot see it (the head lags or was never written), so the
// release is built on the claim itself; the release's own head write then
// rolls the head forward too. It runs even if ctx was cancelled; when the
// store fails again the grant ends with its lease, as rollback's.
func (s *Store) undoGrant(ctx context.Context, owner Owner, g *gen) {
	ctx = context.WithoutCancel(ctx)
	c, err := s.claim(ctx, g.Key, g.Seq)
	if err == nil && c != nil && c.ownedBy(owner) && c.Token == g.Token {
		s.cache.put(g.Key, holdEntry{g: c, verified: time.Now()})
		_, err = s.releaseOne(ctx, opRelease, g.Key, func(h *gen) bool { return h.ownedBy(owner) && h.Token == g.Token }, "", true, false)
	}
	if err != nil {
		s.log.Warn("could not undo an acquire reported failed; if its grant landed, the lock expires with its lease",
			zap.String("key", g.Key), zap.Error(err))
		return
	}
	s.wq.notify(g.Key)
}

// rollback releases the keys a failed attempt newly took. It does not touch
// lastError or tokens, and runs even if ctx was cancelled.
func (s *Store) rollback(ctx context.Context, owner Owner, rids []string, self *waiter) {
	if len(rids) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, rid := range rids {
		_, err := s.releaseOne(ctx, opRelease, rid, func(g *gen) bool { return g.ownedBy(owner) }, "", true, false)
		if err != nil {
			s.log.Warn("rollback of a partial acquire failed; the lock expires with its lease",
				zap.String("key", rid), zap.Error(err))
		}
	}
	s.wq.notifyExcept(self, rids...)
}

// acquireWait retries acquireAll until it succeeds or wait elapses: woken
// by local releases (FIFO, see waitQueues), by the blocking holder's lease
// end, by change-stream events where available, and by a jittered
// exponential backoff poll for releases through other instances.
func (s *Store) acquireWait(ctx context.Context, owner Owner, ns namespace.Namespace, ordered []lockKey, lease, wait time.Duration) (map[string]Lock, error) {
	rids := make([]string, len(ordered))
	for i, k := range ordered {
		rids[i] = k.rid
	}
	w := newWaiter(rids)
	w.who = waiterOf(owner, s.clock)
	if len(ordered) == 1 {
		w.want = &handoffWant{ctx: ctx, owner: owner, ns: ns.String(), key: ordered[0], lease: lease}
	}
	if !s.wq.join(w, s.cfg.MaxWaiters) {
		return nil, fmt.Errorf("%w: %d acquires already wait for one of these locks on this lockgate; retry later", ErrTooManyWaiters, s.cfg.MaxWaiters)
	}
	defer s.wq.leave(w)

	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	cap := s.cfg.MaxPoll
	bo := newBackoff(s.cfg.MinPoll, cap)
	var last *HeldError
	for {
		kicked := false
		select {
		case r := <-w.handed:
			if ctx.Err() != nil {
				// The caller is gone: nobody would release the lock.
				s.rollback(ctx, owner, []string{w.want.key.rid}, w)
				return nil, ctx.Err()
			}
			return map[string]Lock{w.want.key.rid: r.lock}, nil
		case <-w.kick:
			kicked = true
		case <-retry.C:
		case <-deadline.C:
			// A grant that was being written when the wait elapsed is
			// kept, as when the waiter's own attempt was under way.
			if got, ok := s.giveUp(ctx, w, owner, true); ok {
				return got, nil
			}
			return nil, s.timeoutErr(ctx, ns, ordered, last)
		case <-ctx.Done():
			s.giveUp(ctx, w, owner, false)
			return nil, ctx.Err()
		case <-s.ctx.Done():
			s.giveUp(ctx, w, owner, false)
			return nil, ErrClosed
		}
		if !s.wq.startTry(w) {
			// Behind an older local waiter (it will wake us), or a release
			// is handing the key over to us (its result wakes us).
			retry.Stop()
			continue
		}
		got, err := s.acquireAll(ctx, owner, ns, ordered, lease, w)
		if err == nil {
			return got, nil
		}
		var he *HeldError
		if !errors.As(err, &he) {
			return nil, err
		}
		blocked := ""
		for _, k := range ordered {
			if k.id.Equal(he.ID) {
				blocked = k.rid
				break
			}
		}
		s.wq.block(w, blocked)
		if wk := s.wake.Load(); wk != nil && blocked != "" {
			wk.waiting(blocked)
		}
		if last == nil || kicked || he.Holder.Token != last.Holder.Token {
			bo.reset() // a new holder: start polling fast again
		}
		last = he
		if s.streamActive.Load() {
			bo.max = max(cap, streamPollCap)
		} else {
			bo.max = cap
		}
		d := bo.next()
		now, unc := s.clock.Now()
		if untilExpiry := he.Holder.ExpiresAt.Sub(now) + s.cfg.TakeoverGrace + unc + time.Millisecond; untilExpiry < d {
			d = max(untilExpiry, 0)
		}
		retry.Reset(d)
	}
}

// timeoutErr builds the ErrTimeout error, reading the holder if this call
// never got to try (it waited behind other local waiters).
func (s *Store) timeoutErr(ctx context.Context, ns namespace.Namespace, ordered []lockKey, last *HeldError) error {
	he := &HeldError{NS: ns, ID: ordered[0].id, Timeout: true}
	if last != nil {
		he.ID, he.Holder = last.ID, last.Holder
		return he
	}
	if h, err := s.head(ctx, ordered[0].rid); err == nil && h != nil {
		he.Holder = h.holder()
	}
	return he
}
