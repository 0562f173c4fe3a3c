package lockstore

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// Renew sets the lease of locks that owner holds to end lease from now,
// keeping their tokens. Only unexpired locks can be renewed: the ids that
// owner does not hold (never held, released, expired, taken over) are
// reported in a *NotHolderError (ErrNotHolder) while the others are
// renewed and returned.
func (s *Store) Renew(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]Lock, error) {
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
	out, ks := s.renewMemory(owner, ks)
	if len(ks) == 0 {
		return out, nil // all held in memory (memlock.go): nothing to write
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	var missing []docid.ID
	var whys []string
	for _, k := range ks {
		l, ok, why, err := s.extend(ctx, owner, k, lease, opRenew)
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, k.id)
			whys = append(whys, why)
			continue
		}
		out = append(out, l)
	}
	s.debug("renew", ns, owner, zap.Int("ids", len(ks)), zap.Int("renewed", len(out)))
	if len(missing) > 0 {
		return out, &NotHolderError{NS: ns, IDs: missing, Why: whys}
	}
	return out, nil
}

// Release frees the locks on ids that owner holds (expired or not, as long
// as nobody took them over) and returns how many it freed; ids owner does
// not hold are not an error, they just do not count. A non-empty errText is
// kept on each freed key as lastError for the next holder (Status shows
// it); an empty one clears it. Tokens are kept.
func (s *Store) Release(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return 0, err
	}
	rids := make([]string, len(ks))
	for i, k := range ks {
		rids[i] = k.rid
	}
	n, rest := s.releaseMemory(owner, rids)
	if n > 0 {
		// Waiters for a memory lock are woken here: no generation is
		// written for it.
		s.wq.notify(rids...)
	}
	if len(rest) == 0 {
		return n, nil
	}
	m, err := s.release(ctx, owner, ns, rest, errText)
	return n + m, err
}

// ReleaseAll frees every lock owner holds in namespace ns (releaseLock
// without ids), like Release.
func (s *Store) ReleaseAll(ctx context.Context, owner Owner, ns namespace.Namespace, errText string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	if ns.IsZero() {
		return 0, fmt.Errorf("%w: no namespace", ErrInvalidArgument)
	}
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	rids, err := s.releaseAllKeys(ctx, owner, ns)
	if err != nil {
		return 0, err
	}
	return s.release(ctx, owner, ns, rids, errText)
}

// releaseAllKeys returns the keys owner may hold in ns, in one of the
// store's releaseAllScans turns.
func (s *Store) releaseAllKeys(ctx context.Context, owner Owner, ns namespace.Namespace) ([]string, error) {
	if err := s.scans.take(ctx); err != nil {
		return nil, s.storeErr(ctx, opFind, err)
	}
	defer s.scans.done()
	rids, err := s.keysOf(ctx, bson.D{
		{Key: "owner", Value: sessionBinary(owner.Session)}, {Key: "ns", Value: ns.String()}, {Key: "head", Value: true},
	})
	if err != nil {
		return nil, err
	}
	// A head document can have been moved back to another owner's hold
	// while the owner's own claim after it is the key's newest (a late
	// head write, doc.go): the heads that name the owner miss that key,
	// and it stayed held until its lease ended. The owner's claims name
	// it: compaction keeps every claim after a key's head, so a newest
	// claim a head lags behind is always there. On FerretDB this is a
	// scan of the claims (it answers only exact _id filters from an
	// index), of at most CleanupAfter's worth of changes, as the query
	// of the heads is a scan of them: a connection's release-alls are
	// throttled by the guard, and at most releaseAllScans of them run at
	// once (scanturns.go). Keys the owner no longer holds are read and
	// left alone by releaseOne, as for the heads' own, but those this
	// Store saw move past the owner's claims (claimedKeys).
	seen := make(map[string]bool, len(rids))
	for _, rid := range rids {
		seen[rid] = true
	}
	rids, err = s.claimedKeys(ctx, opFind, bson.D{
		{Key: "owner", Value: sessionBinary(owner.Session)}, {Key: "ns", Value: ns.String()},
	}, func(g *gen) bool { return g.ownedBy(owner) }, seen, rids)
	if err != nil {
		return nil, err
	}
	return rids, nil
}

func (s *Store) release(ctx context.Context, owner Owner, ns namespace.Namespace, rids []string, errText string) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n, firstErr := s.releaseEach(ctx, rids, func(ctx context.Context, rid string) (bool, error) {
		return s.releaseOne(ctx, opRelease, rid, func(g *gen) bool { return g.ownedBy(owner) }, errText, false, true)
	})
	s.wq.notify(rids...)
	s.debug("release", ns, owner, zap.Int("ids", len(rids)), zap.Int("released", n),
		zap.Bool("error", errText != ""), zap.NamedError("err", firstErr))
	return n, firstErr
}

// keysOf returns the distinct keys of the generations matching filter.
func (s *Store) keysOf(ctx context.Context, filter bson.D) ([]string, error) {
	gens, err := s.findGens(ctx, filter, options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}))
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(gens))
	var rids []string
	for _, g := range gens {
		if !seen[g.Key] {
			seen[g.Key] = true
			rids = append(rids, g.Key)
		}
	}
	return rids, nil
}

// ReleaseSession frees every lock held by the session, whatever its
// binding (endSessions), and returns how many it freed at once. lastError
// is kept.
//
// The locks taken through this instance are known (the owned index) and
// freed before it returns, at the cost of the session's own locks and not
// of the store's size. Locks the session took through other instances are
// found by a background sweep that serves every session ended meanwhile
// with one query by owner of the heads (indexed on MongoDB; a scan on
// FerretDB) and one of the claims, which find a key whose head was moved
// back to another owner's hold (a scan on both), so a flood of endSessions
// cannot multiply scans of the lock store (sweep.go).
func (s *Store) ReleaseSession(ctx context.Context, session []byte) (int, error) {
	if len(session) == 0 {
		return 0, fmt.Errorf("%w: no session", ErrInvalidArgument)
	}
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	rids := s.owned.list(session)
	match := func(g *gen) bool { return string(g.Owner.Data) == string(session) }
	n, firstErr := s.releaseEach(ctx, rids, func(ctx context.Context, rid string) (bool, error) {
		return s.releaseOne(ctx, opRelease, rid, match, "", true, true)
	})
	cached := s.cache.removeSession(session)
	s.wq.notify(append(rids, cached...)...)
	s.sweeper.add(session)
	if ce := s.log.Check(zap.DebugLevel, "release session"); ce != nil {
		ce.Write(zap.String("holder", SessionPrefix(session)), zap.Int("released", n), zap.NamedError("err", firstErr))
	}
	return n, firstErr
}

// releaseParallel bounds the keys one release of many frees at once: each
// key costs two round trips, so a session's hundreds of locks are freed in
// a fraction of the time one by one would take, without one endSessions
// taking the whole lock store pool.
const releaseParallel = 8

// releaseEach runs release for every key, releaseParallel at a time, and
// returns how many it freed and the first error.
func (s *Store) releaseEach(ctx context.Context, rids []string, release func(context.Context, string) (bool, error)) (int, error) {
	var (
		mu       sync.Mutex
		n        int
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, releaseParallel)
	for _, rid := range rids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ok, err := release(ctx, rid)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = cmp.Or(firstErr, err)
			} else if ok {
				n++
			}
		}()
	}
	wg.Wait()
	return n, firstErr
}

// Status describes the locks on ids, in the order of the distinct ids,
// from the database: their heads (heads: one read per id up to
// perKeyReads ids, one $in above), then the newest claim of each head
// that names a holder. A lock whose lease has ended is reported as not
// held.
func (s *Store) Status(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID) ([]Status, error) {
	return s.status(ctx, owner, ns, ids, false)
}

func (s *Store) status(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, confirm bool) ([]Status, error) {
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, err
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	rids := make([]string, len(ks))
	for i, k := range ks {
		rids[i] = k.rid
	}
	hs, err := s.heads(ctx, rids)
	if err != nil {
		return nil, err
	}
	if confirm {
		if err := s.rollForward(ctx, rids, hs); err != nil {
			return nil, err
		}
	}
	now, _ := s.clock.Now()
	out := make([]Status, len(ks))
	for i, k := range ks {
		out[i] = Status{NS: ns, ID: k.id}
		if h := hs[k.rid]; h != nil && (!confirm || h.Kind != kindGC) {
			out[i] = h.status(now, &owner)
			out[i].ID = k.id
		}
	}
	s.memStatus(&owner, ks, out)
	s.debug("status", ns, owner, zap.Int("ids", len(ks)), zap.Bool("confirmed", confirm))
	return out, nil
}

// status renders a head generation; owner (optional) sets HeldByYou.
func (g *gen) status(now time.Time, owner *Owner) Status {
	st := Status{NS: namespace.Of(g.NS), ID: g.lockedID(), Token: g.Token, LastError: g.LastError, UpdatedAt: g.At}
	if g.heldAt(now) {
		st.Held = true
		st.Holder = g.holder()
		st.Since = g.AcquiredAt
		st.ExpiresAt = g.ExpiresAt
		st.HeldByYou = owner != nil && g.ownedBy(*owner)
	} else if g.Kind == kindForce && g.Owner == nil {
		st.ForceReleased, st.ForceReason = true, g.Reason
	}
	return st
}

// List returns lock keys for the admin view, held ones only unless
// opts.IncludeFree, ordered by namespace and key.
func (s *Store) List(ctx context.Context, opts ListOptions) ([]Status, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 1000
	}
	now, _ := s.clock.Now()
	filter := bson.D{{Key: "head", Value: true}}
	if !opts.NS.IsZero() {
		filter = append(filter, bson.E{Key: "ns", Value: opts.NS.String()})
	}
	if !opts.IncludeFree {
		filter = append(filter, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now}}})
	}
	rids, err := s.keysOf(ctx, filter)
	if err != nil {
		return nil, err
	}
	// Memory locks (memlock.go) are listed in their place, in key order;
	// the store never holds a key that is held in memory.
	memRids, memSts := s.memList(opts.NS)
	rids = slices.DeleteFunc(rids, func(rid string) bool { _, found := slices.BinarySearch(memRids, rid); return found })
	rids = append(rids, memRids...)
	slices.Sort(rids)
	var out []Status
	for len(rids) > 0 && len(out) < limit {
		batch := rids[:min(len(rids), 500)]
		rids = rids[len(batch):]
		hs, err := s.heads(ctx, batch)
		if err != nil {
			return nil, err
		}
		for _, rid := range batch {
			if i, found := slices.BinarySearch(memRids, rid); found {
				out = append(out, memSts[i])
				if len(out) == limit {
					break
				}
				continue
			}
			h := hs[rid]
			if h == nil || (!opts.IncludeFree && !h.heldAt(now)) {
				continue
			}
			out = append(out, h.status(now, nil))
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// ForceRelease frees a lock whoever holds it, for operators. It raises the
// fencing token (so that a fenced resource refuses the old holder), records
// reason on the new generation, logs an audit event at warn level and
// returns the state before. A key that was never locked is not an error.
//
// A key held in this Store's memory (memlock.go) has no token to raise:
// ForceRelease waits, bounded by ctx, until its write has surely ended,
// and returns the state before; past ctx it fails with a
// *MemoryHeldError (ErrHeldInMemory) and nothing changes.
func (s *Store) ForceRelease(ctx context.Context, ns namespace.Namespace, id docid.ID, reason string) (Status, error) {
	return s.forceRelease(ctx, ns, id, reason, nil)
}

// ForceReleaseOf is ForceRelease of the holding an operator saw: the one
// with fencing token token (0 for a lock held in memory, which has none).
// When the key has changed hands since (released and taken again, taken
// over, force-released), it fails with a *ChangedHandsError
// (ErrChangedHands) and nothing changes: the new holder is not the one the
// operator chose to free. The comparison is made on the generation the
// release is written after, so no change can slip in between.
func (s *Store) ForceReleaseOf(ctx context.Context, ns namespace.Namespace, id docid.ID, token int64, reason string) (Status, error) {
	return s.forceRelease(ctx, ns, id, reason, &token)
}

func (s *Store) forceRelease(ctx context.Context, ns namespace.Namespace, id docid.ID, reason string, want *int64) (Status, error) {
	ks, err := keys(ns, []docid.ID{id})
	if err != nil {
		return Status{}, err
	}
	if want != nil && *want != 0 {
		// A lock in memory has no token: one named is not it.
		if st, held := s.memStatusOf(ns, ks[0]); held {
			return st, &ChangedHandsError{NS: ns, ID: id, Want: *want, Now: st}
		}
	} else if st, held, err := s.forceMemory(ctx, ns, ks[0], reason); held {
		return st, err
	}
	if err := s.ready(ctx); err != nil {
		return Status{}, err
	}
	k := ks[0]
	var before *gen
	step := func(h *gen, now time.Time, unc time.Duration) (*gen, error) {
		before = h
		if want != nil && (h == nil || h.Token != *want) {
			e := &ChangedHandsError{NS: ns, ID: id, Want: *want}
			if h != nil {
				e.Now = h.status(now, nil)
				e.Now.ID = id
			}
			return nil, e
		}
		if h == nil {
			return nil, nil
		}
		n := h.next(kindForce, now)
		n.Owner, n.Bind, n.OwnerApp, n.OwnerClient, n.OwnerUser, n.Implicit = nil, "", "", "", "", ""
		n.AcquiredAt, n.ExpiresAt = time.Time{}, freeExpiry
		n.Token = h.Token + 1
		n.Reason = reason
		return n, nil
	}
	// Never act on a cached head: an operator's view must be current.
	s.cache.remove(k.rid)
	g, _, err := s.transition(ctx, opForce, k.rid, step)
	s.cache.remove(k.rid)
	if err != nil {
		return Status{}, err
	}
	now, _ := s.clock.Now()
	if g == nil {
		s.log.Warn("force release: no such lock", zap.String("ns", ns.String()), zap.Stringer("id", id), zap.String("reason", reason))
		return Status{NS: ns, ID: id}, nil
	}
	s.wq.notify(k.rid)
	if wk := s.wake.Load(); wk != nil {
		wk.freed(k.rid)
	}
	st := before.status(now, nil)
	st.ID = id
	s.log.Warn("force release",
		zap.String("ns", ns.String()), zap.Stringer("id", id), zap.String("reason", reason),
		zap.Bool("wasHeld", st.Held), zap.String("holderApp", st.Holder.App),
		zap.String("holder", st.Holder.SessionPrefix),
		zap.Int64("oldToken", before.Token), zap.Int64("newToken", g.Token))
	return st, nil
}

// Holds reports whether owner holds an unexpired lock on every id with at
// least margin of lease left, and lists the ids it does not. It answers from
// the local cache for locks whose current generation this Store wrote,
// confirmed within Config.CacheTrust, and reads the database for the rest
// (the head documents, and the claims after those that could hide a newer
// generation: a live hold, or a free head of a key this Store granted the
// owner), so a lock taken or changed through another instance is honoured.
// It fails closed: on error the answer is false.
func (s *Store) Holds(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error) {
	if err := checkOwner(owner); err != nil {
		return false, nil, err
	}
	ks, _, err := keysIndexed(ns, ids, false)
	if err != nil {
		return false, nil, err
	}
	ok, missing, _, err := s.holds(ctx, owner, ks, margin, nil)
	return ok, missing, err
}

// holds is Holds for keys already validated; when tokens is not nil (one
// per key), it also records the token of each key held, and returns the
// earliest lease end as Unix nanoseconds of server time, the clock's
// uncertainty already subtracted.
func (s *Store) holds(ctx context.Context, owner Owner, ks []lockKey, margin time.Duration, tokens []int64) (_ bool, _ []docid.ID, end int64, _ error) {
	end = math.MaxInt64
	earliest := func(t time.Time) { end = min(end, t.UnixNano()) }
	now, unc, local := s.nowLocal()
	need := now.Add(unc + margin) // the lease must surely outlast this
	var ask []int                 // indexes in ks of the keys the cache cannot answer
	for i, k := range ks {
		if s.cfg.CacheTrust > 0 {
			// Only a generation this Store wrote, confirmed lately, is
			// trusted: a change through another Store either shows here
			// within CacheTrust or waits that long first (quiesce).
			if e, ok := s.cache.get(k.rid); ok && e.g.ownedBy(owner) && e.g.ExpiresAt.After(need) &&
				e.g.Via == s.via && local.Sub(e.confirmed) <= s.cfg.CacheTrust {
				if tokens != nil {
					tokens[i] = e.g.Token
					earliest(e.g.ExpiresAt.Add(-unc))
				}
				continue
			}
		}
		ask = append(ask, i)
	}
	if len(ask) == 0 {
		return true, nil, end, nil
	}
	if err := s.ready(ctx); err != nil {
		return false, nil, 0, err
	}
	rids := make([]string, len(ask))
	for j, i := range ask {
		rids[j] = ks[i].rid
	}
	verified := time.Now()
	hs, err := s.heads(ctx, rids)
	if err != nil {
		return false, nil, 0, err
	}
	now, unc = s.clock.Now()
	need = now.Add(unc + margin)
	var missing []docid.ID
	for _, i := range ask {
		k := ks[i]
		h := hs[k.rid]
		if h != nil && !(h.ownedBy(owner) && h.ExpiresAt.After(need)) && (h.Owner == nil || !h.ExpiresAt.After(now.Add(-unc))) &&
			s.owned.has(owner.Session, k.rid, now.Add(-unc)) {
			// heads follows only a live hold to the claims after it: a
			// free or ended head that lags can only make a reader say
			// "not held". Here that answer would refuse the holder's own
			// write although this Store granted it the key, and a lagging
			// free head is what a release through another Store leaves
			// when its head write lands after this grant
			// (TestHolderHeldOverAHeadMovedBackToARelease): the claims
			// decide. Only then, so that refusing a writer that took
			// nothing here costs no more reads (one exact read was 50 ms
			// under load, on every refused write and scheme acquire).
			n, err := s.newestClaim(ctx, k.rid, h)
			if err != nil {
				return false, nil, 0, err
			}
			h = n
		}
		if h != nil && h.ownedBy(owner) && h.ExpiresAt.After(need) {
			s.cache.put(k.rid, holdEntry{g: h, verified: verified, confirmed: verified})
			if tokens != nil {
				tokens[i] = h.Token
				earliest(h.ExpiresAt.Add(-unc))
			}
			continue
		}
		missing = append(missing, k.id)
	}
	return len(missing) == 0, missing, end, nil
}

// Cleanup compacts the collection and returns how many claims it deleted:
// the claims older than Config.CleanupAfter, but those of a generation
// after their key's head document (compactClaims: a head moved back by a
// late write is noticed only through them). Head documents are never
// deleted, so a key's token can never be reset. Claims are otherwise only
// needed while a change is in flight (they are the compare-and-swap),
// which lasts milliseconds unless a store operation takes longer than
// CleanupAfter, which Config forbids (at least 12 x OpTimeout). The
// background janitor calls it every Config.CleanupInterval; it is the
// only compaction (no TTL index on the claims: claimsindex.go).
func (s *Store) Cleanup(ctx context.Context) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	now, unc := s.clock.Now()
	horizon := now.Add(-unc - s.cfg.CleanupAfter)
	n, err := s.compactClaims(ctx, horizon)
	if err != nil {
		return 0, err
	}
	s.m.cleaned.Add(float64(n))
	return int(n), nil
}

func (s *Store) debug(op string, ns namespace.Namespace, owner Owner, fields ...zap.Field) {
	if ce := s.log.Check(zap.DebugLevel, op); ce != nil {
		ce.Write(append([]zap.Field{zap.String("ns", ns.String()), zap.String("holder", SessionPrefix(owner.Session)),
			zap.String("app", owner.App)}, fields...)...)
	}
}
