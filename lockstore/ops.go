package lockstore

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// Renew sets the lease of locks that owner holds to end lease from now,
// keeping their tokens. Only unexpired locks can be renewed: the ids that
// owner does not hold (never held, released, expired, taken over) are
// reported in a *NotHolderError (ErrNotHolder) while the others are
// renewed and returned.
func (s *Store) Renew(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, lease time.Duration) ([]Lock, error) {
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
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	var out []Lock
	var missing []bson.RawValue
	for _, k := range ks {
		l, ok, err := s.extend(ctx, owner, k, lease, opRenew)
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, k.id)
			continue
		}
		out = append(out, l)
	}
	s.debug("renew", ns, owner, zap.Int("ids", len(ks)), zap.Int("renewed", len(out)))
	if len(missing) > 0 {
		return out, &NotHolderError{NS: ns, IDs: missing}
	}
	return out, nil
}

// Release frees the locks on ids that owner holds (expired or not, as long
// as nobody took them over) and returns how many it freed; ids owner does
// not hold are not an error, they just do not count. A non-empty errText is
// kept on each freed record as lastError for the next holder (Status shows
// it); an empty one clears it. Tokens are kept: records are not deleted.
func (s *Store) Release(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, errText string) (int, error) {
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
	return s.release(ctx, owner, ns, rids, errText)
}

// ReleaseAll frees every lock owner holds in namespace ns (releaseLock
// without ids), like Release.
func (s *Store) ReleaseAll(ctx context.Context, owner Owner, ns string, errText string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	if ns == "" {
		return 0, ErrInvalidArgument
	}
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	filter := append(bson.D{{Key: "ns", Value: ns}}, ownerFilter(owner)...)
	rids, err := s.findIDs(ctx, filter)
	if err != nil {
		return 0, err
	}
	if len(rids) == 0 {
		s.debug("release", ns, owner, zap.Int("released", 0))
		return 0, nil
	}
	return s.release(ctx, owner, ns, rids, errText)
}

func (s *Store) release(ctx context.Context, owner Owner, ns string, rids []string, errText string) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	now, _ := s.clock.Now()
	filter := append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}}}, ownerFilter(owner)...)
	var res *mongo.UpdateResult
	err := s.rt(ctx, opRelease, func(ctx context.Context) error {
		var err error
		res, err = s.coll.UpdateMany(ctx, filter, s.releaseUpdate(now, errText, false))
		return err
	})
	if err != nil {
		// The outcome is unknown: forget the cache entries either way.
		s.cache.remove(rids...)
		return 0, s.storeErr(ctx, opRelease, err)
	}
	s.cache.remove(rids...)
	s.wq.notify(rids...)
	s.debug("release", ns, owner, zap.Int("ids", len(rids)), zap.Int64("released", res.MatchedCount),
		zap.Bool("error", errText != ""))
	return int(res.MatchedCount), nil
}

// ReleaseSession frees every lock held by the session, whatever its
// binding (endSessions), and returns how many.
func (s *Store) ReleaseSession(ctx context.Context, session []byte) (int, error) {
	if len(session) == 0 {
		return 0, ErrInvalidArgument
	}
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	filter := bson.D{{Key: "owner", Value: sessionBinary(session)}}
	rids, err := s.findIDs(ctx, filter)
	if err != nil {
		return 0, err
	}
	now, _ := s.clock.Now()
	var res *mongo.UpdateResult
	err = s.rt(ctx, opRelease, func(ctx context.Context) error {
		var err error
		res, err = s.coll.UpdateMany(ctx, filter, s.releaseUpdate(now, "", true))
		return err
	})
	cached := s.cache.removeSession(session)
	if err != nil {
		return 0, s.storeErr(ctx, opRelease, err)
	}
	s.wq.notify(append(rids, cached...)...)
	if ce := s.log.Check(zap.DebugLevel, "release session"); ce != nil {
		ce.Write(zap.String("session", SessionPrefix(session)), zap.Int64("released", res.MatchedCount))
	}
	return int(res.MatchedCount), nil
}

// findIDs returns the record ids matching filter.
func (s *Store) findIDs(ctx context.Context, filter bson.D) ([]string, error) {
	var rids []string
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		cur, err := s.coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			return err
		}
		defer cur.Close(ctx)
		for cur.Next(ctx) {
			if id, ok := cur.Current.Lookup("_id").StringValueOK(); ok {
				rids = append(rids, id)
			}
		}
		return cur.Err()
	})
	return rids, s.storeErr(ctx, opFind, err)
}

// findRecords returns the records matching filter.
func (s *Store) findRecords(ctx context.Context, filter bson.D, opts *options.FindOptions) ([]record, error) {
	var recs []record
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		cur, err := s.coll.Find(ctx, filter, opts)
		if err != nil {
			return err
		}
		return cur.All(ctx, &recs)
	})
	return recs, s.storeErr(ctx, opFind, err)
}

// Status describes the locks on ids, in the order of the distinct ids,
// from the database (one round trip). A lock whose lease has ended is
// reported as not held.
func (s *Store) Status(ctx context.Context, owner Owner, ns string, ids []bson.RawValue) ([]Status, error) {
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
	recs, err := s.findRecords(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}}}, nil)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*record, len(recs))
	for i := range recs {
		byID[recs[i].ID] = &recs[i]
	}
	now, _ := s.clock.Now()
	out := make([]Status, len(ks))
	for i, k := range ks {
		out[i] = Status{NS: ns, ID: k.id}
		if r := byID[k.rid]; r != nil {
			out[i] = r.status(now, &owner)
			out[i].ID = k.id
		}
	}
	s.debug("status", ns, owner, zap.Int("ids", len(ks)))
	return out, nil
}

// status renders a record; owner (optional) sets HeldByYou.
func (r *record) status(now time.Time, owner *Owner) Status {
	st := Status{
		NS: r.NS, ID: r.Value, Token: r.token(), LastError: r.LastError, UpdatedAt: r.UpdatedAt,
	}
	if r.Owner != nil && r.ExpiresAt.After(now) {
		st.Held = true
		st.Holder = r.holder()
		st.Since = r.AcquiredAt
		st.ExpiresAt = r.ExpiresAt
		st.HeldByYou = owner != nil && r.ownedBy(*owner)
	}
	return st
}

// List returns lock records for the admin view, held ones only unless
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
	filter := bson.D{}
	if opts.NS != "" {
		filter = append(filter, bson.E{Key: "ns", Value: opts.NS})
	}
	if !opts.IncludeFree {
		filter = append(filter, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now}}},
			bson.E{Key: "owner", Value: bson.D{{Key: "$ne", Value: nil}}})
	}
	recs, err := s.findRecords(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, err
	}
	out := make([]Status, len(recs))
	for i := range recs {
		out[i] = recs[i].status(now, nil)
	}
	return out, nil
}

// ForceRelease frees a lock whoever holds it, for operators. It raises the
// fencing token (so that a fenced resource refuses the old holder), records
// reason and the time on the record, logs an audit event at warn level and
// returns the state before. A key without a record is not an error.
func (s *Store) ForceRelease(ctx context.Context, ns string, id bson.RawValue, reason string) (Status, error) {
	ks, err := keys(ns, []bson.RawValue{id})
	if err != nil {
		return Status{}, err
	}
	if err := s.ready(ctx); err != nil {
		return Status{}, err
	}
	k := ks[0]
	now, _ := s.clock.Now()
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "owner", Value: nil},
			{Key: "expiresAt", Value: freeExpiry},
			{Key: "updatedAt", Value: now},
			{Key: "gcAt", Value: now.Add(s.cfg.CleanupAfter)},
			{Key: "forcedAt", Value: now},
			{Key: "forceReason", Value: reason},
		}},
		{Key: "$inc", Value: bson.D{{Key: "tokenSeq", Value: int64(1)}}},
	}
	var before record
	err = s.rt(ctx, opForce, func(ctx context.Context) error {
		return s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: k.rid}}, update,
			options.FindOneAndUpdate().SetReturnDocument(options.Before)).Decode(&before)
	})
	s.cache.remove(k.rid)
	if errors.Is(err, mongo.ErrNoDocuments) {
		s.log.Warn("force release: no such lock", zap.String("ns", ns), zap.Stringer("id", id), zap.String("reason", reason))
		return Status{NS: ns, ID: id}, nil
	}
	if err != nil {
		return Status{}, s.storeErr(ctx, opForce, err)
	}
	s.wq.notify(k.rid)
	st := before.status(now, nil)
	st.ID = id
	s.log.Warn("force release",
		zap.String("ns", ns), zap.Stringer("id", id), zap.String("reason", reason),
		zap.Bool("wasHeld", st.Held), zap.String("holderApp", st.Holder.App),
		zap.String("holderSession", st.Holder.SessionPrefix),
		zap.Int64("oldToken", before.token()), zap.Int64("newToken", before.token()+1))
	return st, nil
}

// Holds reports whether owner holds an unexpired lock on every id with at
// least margin of lease left, and lists the ids it does not. It answers from
// the local cache for locks written or verified through this Store within
// Config.CacheTrust, and reads the database (one round trip) for the rest,
// so a lock taken through another instance is honoured. It fails closed:
// on error the answer is false.
func (s *Store) Holds(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, margin time.Duration) (bool, []bson.RawValue, error) {
	if err := checkOwner(owner); err != nil {
		return false, nil, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return false, nil, err
	}
	now, unc := s.clock.Now()
	need := now.Add(unc + margin) // the lease must surely outlast this
	local := time.Now()
	var ask []lockKey
	for _, k := range ks {
		if s.cfg.CacheTrust > 0 {
			if e, ok := s.cache.get(k.rid); ok && e.session == string(owner.Session) && e.bind == owner.Bind &&
				e.expiresAt.After(need) && local.Sub(e.verified) <= s.cfg.CacheTrust {
				continue
			}
		}
		ask = append(ask, k)
	}
	if len(ask) == 0 {
		return true, nil, nil
	}
	if err := s.ready(ctx); err != nil {
		return false, nil, err
	}
	rids := make([]string, len(ask))
	for i, k := range ask {
		rids[i] = k.rid
	}
	recs, err := s.findRecords(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}}}, nil)
	if err != nil {
		return false, nil, err
	}
	now, unc = s.clock.Now()
	need = now.Add(unc + margin)
	verified := time.Now()
	held := make(map[string]bool, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.ownedBy(owner) && r.ExpiresAt.After(need) {
			held[r.ID] = true
			s.cache.put(r.ID, holdEntry{
				session: string(owner.Session), bind: owner.Bind, token: r.token(),
				expiresAt: r.ExpiresAt, verified: verified,
			})
		}
	}
	var missing []bson.RawValue
	for _, k := range ask {
		if !held[k.rid] {
			missing = append(missing, k.id)
		}
	}
	return len(missing) == 0, missing, nil
}

// Cleanup deletes records that have been free (or expired) for at least
// Config.CleanupAfter, and returns how many. The background janitor calls
// it every Config.CleanupInterval; operators and tests may call it too.
// A record is deleted only if its last token is older than the cutoff in
// server-clock nanoseconds, and the delete is conditional on the record not
// having been written since it was read, so tokens never go back (see
// docs/LOCKS.md).
func (s *Store) Cleanup(ctx context.Context) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	now, unc := s.clock.Now()
	horizon := now.Add(-unc)
	cutoff := horizon.Add(-s.cfg.CleanupAfter).UnixNano()
	recs, err := s.findRecords(ctx, bson.D{{Key: "gcAt", Value: bson.D{{Key: "$lte", Value: horizon}}}},
		options.Find().SetLimit(1000).SetProjection(bson.D{{Key: "tokenBase", Value: 1}, {Key: "tokenSeq", Value: 1}}))
	if err != nil {
		return 0, err
	}
	var rids []string
	for _, r := range recs {
		if r.token() < cutoff {
			rids = append(rids, r.ID)
		} else {
			s.log.Warn("idle lock record has a token from the future; not deleting it",
				zap.String("record", r.ID), zap.Int64("token", r.token()))
		}
	}
	if len(rids) == 0 {
		return 0, nil
	}
	var res *mongo.DeleteResult
	err = s.rt(ctx, opCleanup, func(ctx context.Context) error {
		var err error
		res, err = s.coll.DeleteMany(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$in", Value: rids}}},
			// Any write since the read moved gcAt past the horizon.
			{Key: "gcAt", Value: bson.D{{Key: "$lte", Value: horizon}}},
		})
		return err
	})
	if err != nil {
		return 0, s.storeErr(ctx, opCleanup, err)
	}
	s.m.cleaned.Add(float64(res.DeletedCount))
	return int(res.DeletedCount), nil
}

func (s *Store) debug(op, ns string, owner Owner, fields ...zap.Field) {
	if ce := s.log.Check(zap.DebugLevel, op); ce != nil {
		ce.Write(append([]zap.Field{zap.String("ns", ns), zap.String("session", SessionPrefix(owner.Session)),
			zap.String("app", owner.App)}, fields...)...)
	}
}
