package lockstore

import (
	"context"
	"maps"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// kindGC marks the tombstone claim with which the janitor deletes a key's
// head document (see CollectHeads).
const kindGC = "gc"

// maxCollectPerPass bounds the head documents one janitor pass deletes.
const maxCollectPerPass = 1000

// CollectHeads deletes the head documents of keys nobody has held or
// changed for Config.CleanupAfter, and returns how many. Without it every
// key ever locked would cost a record for ever, and on servers that answer
// queries by scanning (FerretDB) every lock operation would slow down with
// them.
//
// A key is deleted in two steps, each safe on its own:
//
//  1. the janitor claims the key's next generation with a tombstone (kind
//     "gc"), an ordinary claim insert, so that no writer can change the key
//     from the state it is deleting: a writer building on that head finds
//     the tombstone, takes the key as gone and starts it afresh;
//  2. it deletes the head document, only while it still shows that state.
//
// A key started afresh takes the server clock in nanoseconds as its first
// token, as a new key does: the deleted head was idle for at least
// CleanupAfter, so its tokens are below that (docs/LOCKS.md, "Fencing
// tokens"): tokens never go back. The tombstone is compacted like every
// claim; a new chain of the key that reaches its generation before then
// sees that it is older than its own head and steps over it.
func (s *Store) CollectHeads(ctx context.Context) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	now, unc := s.clock.Now()
	horizon := now.Add(-unc - s.cfg.CleanupAfter)
	// First the claims older than the horizon (what Cleanup deletes): every
	// claim of a key whose head is older than the horizon goes with them,
	// so a key started afresh never meets a claim of its previous life
	// but the tombstone.
	if _, err := s.compactClaims(ctx, horizon); err != nil {
		return 0, err
	}
	var idle []gen
	err := s.rt(ctx, opCleanup, func(ctx context.Context) error {
		cur, err := s.coll.Find(ctx, bson.D{{Key: "head", Value: true}, {Key: "owner", Value: nil}, {Key: "at", Value: bson.D{{Key: "$lt", Value: horizon}}}},
			options.Find().SetLimit(maxCollectPerPass))
		if err != nil {
			return err
		}
		return cur.All(ctx, &idle)
	})
	if err != nil {
		return 0, s.storeErr(ctx, opCleanup, err)
	}
	n := 0
	for i := range idle {
		h := &idle[i]
		if h.Owner != nil || h.Kind == kindGC || !h.At.Before(horizon) {
			continue
		}
		now, _ := s.clock.Now()
		t := h.next(kindGC, now)
		ok, err := s.insert(ctx, opCleanup, t)
		if err != nil {
			return n, err
		}
		if !ok {
			continue // someone changed the key meanwhile: it is in use
		}
		s.cache.remove(h.Key)
		err = s.rt(ctx, opCleanup, func(ctx context.Context) error {
			_, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: h.Key}, {Key: "seq", Value: h.Seq}})
			return err
		})
		if err != nil {
			return n, s.storeErr(ctx, opCleanup, err)
		}
		n++
	}
	if n > 0 {
		s.log.Debug("deleted idle lock keys", zap.Int("count", n))
	}
	return n, nil
}

// afterTombstone decides how a writer that built on h goes on when the
// claim of h's next generation is the tombstone t. The janitor only buries
// a head older than t by CleanupAfter, so an h younger than t minus half of
// that (far beyond any clock skew) is from the key's new life, and t a
// relic of its previous one: stepped over, h going on as if it had that
// generation too. Otherwise the key is being deleted from the state h
// shows, and the writer starts it afresh (nil).
func afterTombstone(h, t *gen, cleanupAfter time.Duration) *gen {
	if h != nil && t.Seq == h.Seq+1 && h.At.After(t.At.Add(-cleanupAfter/2)) {
		skip := *h
		skip.Seq = t.Seq
		return &skip
	}
	return nil
}

// compactClaims deletes the claims older than horizon, but not those of a
// generation after their key's head document. A head is replaced by _id
// alone, so a late head write (a renewal or release overtaken by newer
// generations) can leave the head behind its claims; readers go on from
// it to the newest claim (newest), which they can do only while the claim
// right after the head exists. Compaction must not delete it: with it
// gone, the stale head read as current gave its token out again, or let a
// second owner take a lock held under a later claim
// (TestStaleHeadAfterCompaction, TestStaleFreeHeadAfterCompaction). Those
// claims stay until a writer moves the head past them; the key's head is
// not collected meanwhile (its tombstone's insert meets the claim). A
// head read after the claims were listed can only be newer, which keeps
// more; a late head write that lands meanwhile names a generation whose
// claims are seconds old, not older than horizon.
func (s *Store) compactClaims(ctx context.Context, horizon time.Time) (int64, error) {
	old := bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: horizon}}}}
	var claims []struct {
		ID  string `bson:"_id"`
		Key string `bson:"key"`
		Seq int64  `bson:"seq"`
	}
	err := s.rt(ctx, opCleanup, func(ctx context.Context) error {
		cur, err := s.claims.Find(ctx, old, options.Find().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "seq", Value: 1}}))
		if err != nil {
			return err
		}
		return cur.All(ctx, &claims)
	})
	if err != nil {
		return 0, s.storeErr(ctx, opCleanup, err)
	}
	if len(claims) == 0 {
		return 0, nil
	}
	newest := make(map[string]int64, len(claims))
	for _, c := range claims {
		if c.Seq > newest[c.Key] {
			newest[c.Key] = c.Seq
		}
	}
	rids := make([]string, 0, len(newest))
	for rid := range newest {
		rids = append(rids, rid)
	}
	// Only the keys whose old claims may run past their head: a head at
	// or after a key's newest old claim leaves nothing to keep.
	hs := make(map[string]*gen, len(rids))
	for start := 0; start < len(rids); start += 1000 {
		batch, err := s.readHeads(ctx, rids[start:min(start+1000, len(rids))])
		if err != nil {
			return 0, err
		}
		maps.Copy(hs, batch)
	}
	var keep []string
	for _, c := range claims {
		if h := hs[c.Key]; h != nil && c.Seq > h.Seq {
			keep = append(keep, c.ID)
		}
	}
	filter := old
	if len(keep) > 0 {
		filter = bson.D{old[0], {Key: "_id", Value: bson.D{{Key: "$nin", Value: keep}}}}
		s.log.Info("compaction keeps claims after their key's head (a head moved back by a late write)", zap.Int("claims", len(keep)))
	}
	var res *mongo.DeleteResult
	err = s.rt(ctx, opCleanup, func(ctx context.Context) error {
		var err error
		res, err = s.claims.DeleteMany(ctx, filter)
		return err
	})
	if err != nil {
		return 0, s.storeErr(ctx, opCleanup, err)
	}
	return res.DeletedCount, nil
}
