package lockstore

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/docid"
)

// HeldTokens is Holds for enforcement that needs more than yes or no:
// when owner holds every id with at least margin of lease left, it returns
// the fencing token of each id, in the order of ids, and how much lease
// the earliest-ending of them surely has left, measured now on the lock
// store server's clock (its uncertainty subtracted); otherwise no tokens
// and the ids not held. Like Holds it answers from the cache where it can
// and fails closed.
func (s *Store) HeldTokens(ctx context.Context, owner Owner, ns string, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error) {
	if err := checkOwner(owner); err != nil {
		return nil, 0, nil, err
	}
	// Each id's key is made once; idx maps an id to its key.
	ks, idx, err := keysIndexed(ns, ids, true)
	if err != nil {
		return nil, 0, nil, err
	}
	var one [1]int64
	byKey := one[:0]
	if len(ks) > 1 {
		byKey = make([]int64, 0, len(ks))
	}
	byKey = byKey[:len(ks)]
	ok, missing, end, err := s.holds(ctx, owner, ks, margin, byKey)
	if err != nil || !ok {
		return nil, 0, missing, err
	}
	out := make([]int64, len(ids))
	for i := range ids {
		if idx == nil {
			out[i] = byKey[i]
		} else {
			out[i] = byKey[idx[i]]
		}
	}
	now, _ := s.clock.Now()
	return out, time.Duration(end - now.UnixNano()), nil, nil
}
