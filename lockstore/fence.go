package lockstore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// HeldTokens is Holds for enforcement that needs more than yes or no:
// when owner holds every id with at least margin of lease left, it returns
// the fencing token of each id, in the order of ids, and how much lease
// the earliest-ending of them surely has left, measured now on the lock
// store server's clock (its uncertainty subtracted); otherwise no tokens
// and the ids not held. Like Holds it answers from the cache where it can
// and fails closed.
func (s *Store) HeldTokens(ctx context.Context, owner Owner, ns string, ids []bson.RawValue, margin time.Duration) ([]int64, time.Duration, []bson.RawValue, error) {
	byKey := make(map[string]int64, len(ids)+1)
	ok, missing, err := s.holds(ctx, owner, ns, ids, margin, byKey)
	if err != nil || !ok {
		return nil, 0, missing, err
	}
	out := make([]int64, len(ids))
	for i, id := range ids {
		ck, err := canonicalID(id)
		if err != nil {
			return nil, 0, nil, err
		}
		out[i] = byKey[recordID(ns, ck)]
	}
	now, _ := s.clock.Now()
	return out, time.Duration(byKey[""] - now.UnixNano()), nil, nil
}

// IDKey is the canonical form of an _id as a lock key compares it (1,
// NumberLong(1) and 1.0 give the same key), for maps keyed by document.
func IDKey(id bson.RawValue) (string, error) {
	ck, err := canonicalID(id)
	if err != nil {
		return "", err
	}
	return string(ck), nil
}
