package lockstore

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/mongoerr"
)

// claimsAtKey is the claims' one secondary index, which the janitor's
// compaction reads by.
var claimsAtKey = bson.D{{Key: "at", Value: 1}}

// indexSpec is what ensureClaimsIndex reads of a listIndexes entry.
type indexSpec struct {
	Name string   `bson:"name"`
	Key  bson.Raw `bson:"key"`
	// TTL is expireAfterSeconds, absent (Type 0) on a plain index.
	TTL bson.RawValue `bson:"expireAfterSeconds"`
}

// onAt tells an index on exactly {at: 1}: the one versions before this
// one made a TTL index where the server allowed it.
func (ix indexSpec) onAt() bool {
	els, err := ix.Key.Elements()
	if err != nil || len(els) != 1 || els[0].Key() != "at" {
		return false
	}
	v, ok := els[0].Value().AsInt64OK()
	return ok && v == 1
}

// ensureClaimsIndex makes the claims' {at: 1} index a plain one. A TTL
// index there (what versions before this one made on MongoDB) deletes
// claims by age whatever their key's head says; compactClaims keeps the
// claims after a head that a late write moved back, without which the
// stale head reads as current: a fencing token given twice, a held key
// granted to a second owner. So such an index is dropped, by name, and
// the plain one made; where the user may not drop it the store still
// starts, and logs at Error level, and counts in a gauge, what the
// operator must run. Any other TTL index on the claims is reported the
// same way, never dropped: lockgate did not make it.
func (s *Store) ensureClaimsIndex(ctx context.Context) error {
	specs, err := s.claimsIndexes(ctx)
	if err != nil {
		if isUnreachable(err) {
			return s.storeErr(ctx, opIndex, err)
		}
		s.log.Warn("listing the claims' indexes failed; a TTL index left there by an older version is not looked for until the next start", zap.Error(err))
	}
	left, atLeft := 0, false
	for _, ix := range specs {
		if ix.TTL.Type == 0 {
			continue
		}
		if !ix.onAt() {
			left++
			s.log.Error(s.ttlAdvice(ix.Name, "lockgate did not make it, so it does not drop it"), zap.String("index", ix.Name))
			continue
		}
		err := s.rt(ctx, opIndex, func(ctx context.Context) error {
			_, err := s.claims.Indexes().DropOne(ctx, ix.Name)
			return err
		})
		var ce mongo.CommandError
		switch {
		case err == nil:
			s.log.Info("dropped the TTL index an older lockgate made on the claims; the janitor alone compacts them now",
				zap.String("collection", s.cfg.Database+"."+s.claims.Name()), zap.String("index", ix.Name))
		case errors.As(err, &ce) && ce.Code == int32(mongoerr.IndexNotFound):
			s.log.Info("another lockgate dropped the claims' TTL index first", zap.String("index", ix.Name))
		case isUnreachable(err):
			return s.storeErr(ctx, opIndex, err)
		default:
			left, atLeft = left+1, true
			s.log.Error(s.ttlAdvice(ix.Name, fmt.Sprintf("this instance could not drop it (%v)", err)), zap.String("index", ix.Name), zap.Error(err))
		}
	}
	if !atLeft { // else a plain index of the same key would only be refused
		err := s.rt(ctx, opIndex, func(ctx context.Context) error {
			_, err := s.claims.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: claimsAtKey})
			return err
		})
		var ce mongo.CommandError
		switch {
		case err == nil:
		case isUnreachable(err):
			return s.storeErr(ctx, opIndex, err)
		case errors.As(err, &ce) && ce.Code == int32(mongoerr.IndexOptionsConflict):
			// at_1 is there with other options: a TTL index that the
			// listing missed, or that an older lockgate starting
			// meanwhile made again between the drop and this create.
			left++
			s.log.Error(s.ttlAdvice("at_1", fmt.Sprintf("creating the plain index in its place was refused (%v)", err)), zap.String("index", "at_1"), zap.Error(err))
		default:
			s.log.Warn("creating lock index failed; continuing without it", zap.Error(err))
		}
	}
	s.m.claimsTTL.Set(float64(left))
	return nil
}

// ttlAdvice is the Error an operator reads about a TTL index on the
// claims that stays: what it breaks and the command that ends it.
func (s *Store) ttlAdvice(name, why string) string {
	return fmt.Sprintf("the claims collection %s.%s has the TTL index %q and %s: it deletes claims by age whatever their key's head document says, "+
		"so a head moved back by a late write can read as current, and a fencing token be handed out twice or a held lock granted to a second owner. "+
		"Drop it as a user allowed to (dropIndex on that collection): in database %s run db.%s.dropIndex(%q); the next start of lockgate makes the plain index",
		s.cfg.Database, s.claims.Name(), name, why, s.cfg.Database, s.claims.Name(), name)
}

// claimsIndexes lists the claims' indexes; none when the collection does
// not exist yet (the driver answers NamespaceNotFound so).
func (s *Store) claimsIndexes(ctx context.Context) ([]indexSpec, error) {
	var specs []indexSpec
	err := s.rt(ctx, opIndex, func(ctx context.Context) error {
		cur, err := s.claims.Indexes().List(ctx)
		if err != nil {
			return err
		}
		return cur.All(ctx, &specs)
	})
	return specs, err
}
