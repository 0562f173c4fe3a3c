package lockstore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// HeldTokens is Holds for the document fence: when owner holds every id
// with at least margin of lease left, it returns the fencing token of each
// id, in the order of ids; otherwise no tokens and the ids not held. Like
// Holds it answers from the cache where it can and fails closed.
func (s *Store) HeldTokens(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, margin time.Duration) ([]int64, []bson.RawValue, error) {
	byKey := make(map[string]int64, len(ids))
	ok, missing, err := s.holds(ctx, owner, ns, ids, margin, byKey)
	if err != nil || !ok {
		return nil, missing, err
	}
	out := make([]int64, len(ids))
	for i, id := range ids {
		ck, err := canonicalID(id)
		if err != nil {
			return nil, nil, err
		}
		out[i] = byKey[recordID(ns, ck)]
	}
	return out, nil, nil
}
