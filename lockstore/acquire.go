package lockstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// maxAcquireRaces bounds how often one key is retried when the record
// changes between the conditional upsert and the read that explains it.
const maxAcquireRaces = 3

// streamPollCap is the backoff ceiling while a change stream delivers
// releases: polling is then only a safety net.
const streamPollCap = 2 * time.Second

// lockKey is one distinct lock key of a call.
type lockKey struct {
	rid string        // record _id: namespace + canonical key
	id  bson.RawValue // the caller's _id value
}

// keys validates ns and ids and returns the distinct keys in request order
// (the first spelling of an id wins: [1, 1.0] is one key).
func keys(ns string, ids []bson.RawValue) ([]lockKey, error) {
	if ns == "" || strings.IndexByte(ns, 0) >= 0 {
		return nil, fmt.Errorf("%w: bad namespace %q", ErrInvalidArgument, ns)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no ids", ErrInvalidArgument)
	}
	out := make([]lockKey, 0, len(ids))
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		ck, err := canonicalID(id)
		if err != nil {
			return nil, err
		}
		rid := recordID(ns, ck)
		if _, dup := seen[rid]; dup {
			continue
		}
		seen[rid] = struct{}{}
		out = append(out, lockKey{rid: rid, id: id})
	}
	return out, nil
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
		return 0, fmt.Errorf("%w: negative lease %v", ErrInvalidLease, d)
	case d == 0:
		return s.cfg.DefaultLease, nil
	case d > s.cfg.MaxLease:
		return 0, fmt.Errorf("%w: lease %v exceeds the maximum %v", ErrInvalidLease, d, s.cfg.MaxLease)
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
func (s *Store) Acquire(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, lease, wait time.Duration) ([]Lock, error) {
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	lease, err := s.lease(lease)
	if err != nil {
		return nil, err
	}
	if wait < 0 {
		return nil, fmt.Errorf("%w: negative wait %v", ErrInvalidArgument, wait)
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return nil, err
	}
	if err := s.ready(ctx); err != nil {
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
		ce.Write(zap.String("ns", ns), zap.Int("ids", len(ks)), zap.String("session", SessionPrefix(owner.Session)),
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

// acquireAll makes one all-or-nothing attempt in canonical order. self is
// the calling waiter, not woken by its own rollback.
func (s *Store) acquireAll(ctx context.Context, owner Owner, ns string, ordered []lockKey, lease time.Duration, self *waiter) (map[string]Lock, error) {
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
// owner already held it (re-entrant).
func (s *Store) tryOne(ctx context.Context, owner Owner, ns string, k lockKey, lease time.Duration) (l Lock, isNew bool, err error) {
	var seen *record
	for range maxAcquireRaces {
		if s.testHookTry != nil {
			s.testHookTry(k.rid)
		}
		now, unc := s.clock.Now()
		if e, ok := s.cache.get(k.rid); ok && e.session == string(owner.Session) && e.bind == owner.Bind && e.expiresAt.After(now.Add(unc)) {
			// Probably re-entrant: try the cheap extension first.
			l, ok, err := s.extend(ctx, owner, k, lease, opAcquire)
			if err != nil || ok {
				return l, false, err
			}
		}
		exp := now.Add(lease).Truncate(time.Millisecond)
		filter := bson.D{
			{Key: "_id", Value: k.rid},
			// Taken over only once expired for certain, whatever the error
			// of this instance's clock estimate.
			{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now.Add(-unc)}}},
		}
		update := bson.D{
			{Key: "$set", Value: bson.D{
				{Key: "owner", Value: sessionBinary(owner.Session)},
				{Key: "bind", Value: owner.Bind},
				{Key: "ownerApp", Value: owner.App},
				{Key: "ownerClient", Value: owner.Client},
				{Key: "acquiredAt", Value: now},
				{Key: "expiresAt", Value: exp},
				{Key: "updatedAt", Value: now},
				{Key: "gcAt", Value: exp.Add(s.cfg.CleanupAfter)},
			}},
			{Key: "$inc", Value: bson.D{{Key: "tokenSeq", Value: int64(1)}}},
			{Key: "$setOnInsert", Value: bson.D{
				{Key: "ns", Value: ns},
				{Key: "id", Value: k.id},
				{Key: "tokenBase", Value: now.UnixNano()},
			}},
		}
		opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)
		var before record
		err := s.rt(ctx, opAcquire, func(ctx context.Context) error {
			return s.coll.FindOneAndUpdate(ctx, filter, update, opts).Decode(&before)
		})
		var token int64
		switch {
		case err == nil:
			token = before.token() + 1
			l.LastError = before.LastError
			if before.Owner != nil {
				s.m.expired.Inc() // a lease ended without a release
			}
		case errors.Is(err, mongo.ErrNoDocuments):
			token = now.UnixNano() + 1 // created
		case mongo.IsDuplicateKeyError(err):
			// The record exists and is not (certainly) expired: the upsert
			// tried to insert it. An ordinary "busy" unless it is ours.
			r, err := s.findOne(ctx, k.rid)
			if err != nil {
				return l, false, err
			}
			if r == nil {
				continue // deleted meanwhile
			}
			now, unc := s.clock.Now()
			if r.ownedBy(owner) && r.ExpiresAt.After(now.Add(unc)) {
				l, ok, err := s.extend(ctx, owner, k, lease, opAcquire)
				if err != nil || ok {
					return l, false, err
				}
				continue
			}
			if !r.ExpiresAt.After(now.Add(-unc)) {
				continue // released meanwhile
			}
			seen = r
			return l, false, &HeldError{NS: ns, ID: k.id, Holder: r.holder()}
		default:
			return l, false, s.storeErr(ctx, opAcquire, err)
		}
		l.ID, l.Token, l.ExpiresAt = k.id, token, exp
		s.cache.put(k.rid, holdEntry{
			session: string(owner.Session), bind: owner.Bind, token: token,
			expiresAt: exp, verified: time.Now(), own: true,
		})
		return l, true, nil
	}
	// The record kept changing under us: report it as busy.
	he := &HeldError{NS: ns, ID: k.id}
	if seen != nil {
		he.Holder = seen.holder()
	}
	return l, false, he
}

// extend sets the lease of a lock that owner holds and whose lease has not
// ended to end lease from now; ok is false if owner does not hold it.
func (s *Store) extend(ctx context.Context, owner Owner, k lockKey, lease time.Duration, op string) (l Lock, ok bool, err error) {
	now, unc := s.clock.Now()
	exp := now.Add(lease).Truncate(time.Millisecond)
	filter := append(bson.D{{Key: "_id", Value: k.rid}}, ownerFilter(owner)...)
	filter = append(filter, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now.Add(unc)}}})
	update := bson.D{{Key: "$set", Value: bson.D{
		{Key: "expiresAt", Value: exp},
		{Key: "updatedAt", Value: now},
		{Key: "gcAt", Value: exp.Add(s.cfg.CleanupAfter)},
	}}}
	var r record
	err = s.rt(ctx, op, func(ctx context.Context) error {
		return s.coll.FindOneAndUpdate(ctx, filter, update,
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&r)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return l, false, nil
	}
	if err != nil {
		return l, false, s.storeErr(ctx, op, err)
	}
	s.cache.put(k.rid, holdEntry{
		session: string(owner.Session), bind: owner.Bind, token: r.token(),
		expiresAt: exp, verified: time.Now(), own: true,
	})
	return Lock{ID: k.id, Token: r.token(), ExpiresAt: exp, LastError: r.LastError}, true, nil
}

// rollback releases the keys a failed attempt newly took. It does not touch
// lastError or tokens, and runs even if ctx was cancelled.
func (s *Store) rollback(ctx context.Context, owner Owner, rids []string, self *waiter) {
	if len(rids) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	now, _ := s.clock.Now()
	filter := append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}}}, ownerFilter(owner)...)
	err := s.rt(ctx, opRelease, func(ctx context.Context) error {
		_, err := s.coll.UpdateMany(ctx, filter, s.releaseUpdate(now, "", true))
		return err
	})
	s.cache.remove(rids...)
	if err != nil {
		s.log.Warn("rollback of a partial acquire failed; the locks expire with their lease",
			zap.Strings("keys", rids), zap.Error(err))
	}
	s.wq.notifyExcept(self, rids...)
}

// releaseUpdate frees a record. errText becomes lastError unless
// keepLastError (rollback) leaves it alone; a clean release clears it.
func (s *Store) releaseUpdate(now time.Time, errText string, keepLastError bool) bson.D {
	set := bson.D{
		{Key: "owner", Value: nil},
		{Key: "expiresAt", Value: freeExpiry},
		{Key: "updatedAt", Value: now},
		{Key: "gcAt", Value: now.Add(s.cfg.CleanupAfter)},
	}
	if !keepLastError {
		set = append(set, bson.E{Key: "lastError", Value: errText})
	}
	return bson.D{{Key: "$set", Value: set}}
}

// acquireWait retries acquireAll until it succeeds or wait elapses: woken
// by local releases (FIFO, see waitQueues), by the blocking holder's lease
// end, by change-stream events where available, and by a jittered
// exponential backoff poll for releases through other instances.
func (s *Store) acquireWait(ctx context.Context, owner Owner, ns string, ordered []lockKey, lease, wait time.Duration) (map[string]Lock, error) {
	rids := make([]string, len(ordered))
	for i, k := range ordered {
		rids[i] = k.rid
	}
	w := newWaiter(rids)
	s.wq.join(w)
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
		case <-w.kick:
			kicked = true
		case <-retry.C:
		case <-deadline.C:
			return nil, s.timeoutErr(ctx, ns, ordered, last)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, ErrClosed
		}
		if !s.wq.isHead(w) {
			retry.Stop()
			continue // behind an older local waiter; it will wake us
		}
		got, err := s.acquireAll(ctx, owner, ns, ordered, lease, w)
		if err == nil {
			return got, nil
		}
		var he *HeldError
		if !errors.As(err, &he) {
			return nil, err
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
		if untilExpiry := he.Holder.ExpiresAt.Sub(now) + unc + time.Millisecond; untilExpiry < d {
			d = max(untilExpiry, 0)
		}
		retry.Reset(d)
	}
}

// timeoutErr builds the ErrTimeout error, reading the holder if this call
// never got to try (it waited behind other local waiters).
func (s *Store) timeoutErr(ctx context.Context, ns string, ordered []lockKey, last *HeldError) error {
	he := &HeldError{NS: ns, ID: ordered[0].id, Timeout: true}
	if last != nil {
		he.ID, he.Holder = last.ID, last.Holder
		return he
	}
	if r, err := s.findOne(ctx, ordered[0].rid); err == nil && r != nil {
		he.Holder = r.holder()
	}
	return he
}

// findOne reads one record; nil if there is none.
func (s *Store) findOne(ctx context.Context, rid string) (*record, error) {
	var r record
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		return s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: rid}}).Decode(&r)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, s.storeErr(ctx, opFind, err)
	}
	return &r, nil
}
