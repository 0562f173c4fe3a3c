package guard

import (
	"context"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/namespace"
)

// fenceFloors reads the fence stamps of the documents an acquireLock in
// a fenced namespace is about to lock, for the lock store to grant tokens
// above them (lockstore.WithTokenFloors). A stamp the lock store does not
// know of comes from another lock store: a lockgate with a lock store of
// its own, or whose estimate of the server clock, which a key's first
// token is taken from, is ahead of this one's. Without the floor the new
// holder's token came out below that stamp and its own stamp was refused
// ("another holder's stamp"), for a retry that moved the token up by one.
// nil when the namespace is not fenced or the stamps cannot be read: the
// stamp after the acquire decides then, as before.
func (g *Guard) fenceFloors(ctx context.Context, ns namespace.Namespace, ids []docid.ID) []int64 {
	pol := g.policy.Load()
	if pol == nil {
		return nil
	}
	r := pol.Lookup(ns)
	if !fenced(&r) {
		return nil
	}
	db, ok := g.opts.Resolver.(fence.DB)
	if !ok {
		return nil
	}
	stamps, exists, err := db.FenceStamps(ctx, ns, r.FenceField, ids)
	if err != nil || len(stamps) != len(ids) {
		return nil
	}
	floors := make([]int64, len(ids))
	for i := range ids {
		if exists[i] {
			floors[i], _ = fence.StampToken(stamps[i])
		}
	}
	return floors
}
