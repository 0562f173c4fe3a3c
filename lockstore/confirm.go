package lockstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
)

// confirmWindow and confirmRounds bound ConfirmedStatus's roll forward:
// each round reads the next confirmWindow claims of every key in one round
// trip. A head further behind its claims than that is not expected; it is
// reported as an error, so that callers fail closed.
const (
	confirmWindow = 8
	confirmRounds = 4
)

// errHeadBehind says that a head record is further behind its claims than
// ConfirmedStatus reads.
var errHeadBehind = errors.New("a lock record's head is too far behind its claims")

// ConfirmedStatus is Status for callers that would let a write through on
// "not held" (the check that an inserted _id is not locked by another
// session). Status reads the head records, which can lag behind the claims
// that decide every grant: for the moment between a claim and its head
// write, or longer when the writer of an older change is delayed past a
// newer one. A lagging head reads as not held. ConfirmedStatus also reads
// the claims after each head (one more round trip) and reports the newest
// generation, so it errs towards "held" like the claims do.
func (s *Store) ConfirmedStatus(ctx context.Context, owner Owner, ns string, ids []docid.ID) ([]Status, error) {
	return s.status(ctx, owner, ns, ids, true)
}

// rollForward replaces each head in latest (by rid) with the newest claim
// after it, reading confirmWindow claims of every key per round trip.
func (s *Store) rollForward(ctx context.Context, rids []string, latest map[string]*gen) error {
	pending := map[string]bool{}
	for _, rid := range rids {
		pending[rid] = true
	}
	for round := 0; len(pending) > 0; round++ {
		if round == confirmRounds {
			return fmt.Errorf("%w: %w", ErrUnavailable, errHeadBehind)
		}
		want := make([]string, 0, len(pending)*confirmWindow)
		for rid := range pending {
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
		found := map[string]int{}
		for i := range gens {
			g := &gens[i]
			if !pending[g.Key] {
				continue
			}
			found[g.Key]++
			if h := latest[g.Key]; h == nil || g.Seq > h.Seq {
				latest[g.Key] = g
			}
		}
		// A key whose window was not full has no claim after its newest:
		// it is current. A full window may have more behind it.
		for rid := range pending {
			if found[rid] < confirmWindow {
				delete(pending, rid)
			}
		}
	}
	return nil
}
