package lockstore

import (
	"context"
	"errors"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// confirmWindow is how many claims after each head ConfirmedStatus reads
// in its first round trip when it reads them together (more than
// perKeyReads keys); a key with that many goes on by newestClaim's search.
const confirmWindow = 8

// errHeadBehind says that newestClaim's search did not end within
// maxProbes reads, which only a store answering wrongly makes it do.
var errHeadBehind = errors.New("a lock record's head is too far behind its claims")

// ConfirmedStatus is Status for callers that would let a write through on
// "not held" (the check that an inserted _id is not locked by another
// session). Status reads the head records, which can lag behind the claims
// that decide every grant: for the moment between a claim and its head
// write, or longer when the writer of an older change is delayed past a
// newer one. A lagging head reads as not held. ConfirmedStatus also reads
// the claims after each head (one more round trip) and reports the newest
// generation, so it errs towards "held" like the claims do.
func (s *Store) ConfirmedStatus(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID) ([]Status, error) {
	return s.status(ctx, owner, ns, ids, true)
}

// rollForward replaces each head in latest (by rid) with the newest claim
// after it (newestClaim), as newest does but whatever the head shows. For
// many keys it first reads confirmWindow claims of every key in one round
// trip, and walks each key's run of claims from its head: a tombstone of
// the key's previous life ahead of its new one is not its state
// (afterTombstone), and a claim after a missing one is not in the run.
func (s *Store) rollForward(ctx context.Context, rids []string, latest map[string]*gen) error {
	if len(rids) <= perKeyReads {
		for _, rid := range rids {
			g, err := s.newestClaim(ctx, rid, latest[rid])
			if err != nil {
				return err
			}
			if g != nil {
				latest[rid] = g
			}
		}
		return nil
	}
	want := make([]string, 0, len(rids)*confirmWindow)
	for _, rid := range rids {
		var seq int64
		if h := latest[rid]; h != nil {
			seq = h.Seq
		}
		for i := int64(1); i <= confirmWindow; i++ {
			want = append(want, genID(rid, seq+i))
		}
	}
	var gens []gen
	err := s.rt(ctx, opFind, func(ctx context.Context) error {
		cur, err := s.claims.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: want}}}})
		if err != nil {
			return err
		}
		return cur.All(ctx, &gens)
	})
	if err != nil {
		return s.storeErr(ctx, opFind, err)
	}
	byID := make(map[string]*gen, len(gens))
	for i := range gens {
		byID[gens[i].ID] = &gens[i]
	}
	for _, rid := range rids {
		cur := latest[rid]
		var seq int64
		if cur != nil {
			seq = cur.Seq
		}
		full := true
		for i := int64(1); i <= confirmWindow && full; i++ {
			g := byID[genID(rid, seq+i)]
			switch {
			case g == nil:
				full = false
			case g.Kind == kindGC:
				if skip := afterTombstone(cur, g, s.cfg.CleanupAfter); skip != nil {
					g = skip
				}
				cur = g
			default:
				cur = g
			}
		}
		if full {
			if cur, err = s.newestClaim(ctx, rid, cur); err != nil {
				return err
			}
		}
		if cur != nil {
			latest[rid] = cur
		}
	}
	return nil
}
