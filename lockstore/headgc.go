package lockstore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/bson"
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
	err := s.rt(ctx, opCleanup, func(ctx context.Context) error {
		_, err := s.claims.DeleteMany(ctx, bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: horizon}}}})
		return err
	})
	if err != nil {
		return 0, s.storeErr(ctx, opCleanup, err)
	}
	var idle []gen
	err = s.rt(ctx, opCleanup, func(ctx context.Context) error {
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
