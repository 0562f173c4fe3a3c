package lockstore

import (
	"context"
	"strings"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// maxElsewhere bounds the held locks HeldElsewhere reads of one owner.
const maxElsewhere = 1000

// HeldElsewhere finds a namespace other than ns in which owner holds an
// unexpired lock on one of ids (the same _id as MongoDB compares it), and
// returns that namespace and the id. It serves one purpose: explaining a
// refused write whose lock was taken in the wrong namespace (acquireLock
// run on mongosh's default database "test", or on "shop.orders" from
// database shop), so it runs on the refusal path only. It reads at most
// maxElsewhere of the owner's held locks, through the (owner, ns) index,
// and confirms a match on its head record.
func (s *Store) HeldElsewhere(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID) (string, docid.ID, bool, error) {
	if err := checkOwner(owner); err != nil {
		return "", docid.ID{}, false, err
	}
	ks, err := keys(ns, ids)
	if err != nil {
		return "", docid.ID{}, false, err
	}
	// A record id is the namespace, the separator and the canonical key,
	// so the same _id has the same suffix in every namespace.
	want := make(map[string]docid.ID, len(ks))
	for _, k := range ks {
		want[strings.TrimPrefix(k.rid, ns.String()+keySeparator)] = k.id
	}
	if err := s.ready(ctx); err != nil {
		return "", docid.ID{}, false, err
	}
	now, _ := s.clock.Now()
	gens, err := s.findGens(ctx, bson.D{
		{Key: "owner", Value: sessionBinary(owner.Session)},
		{Key: "head", Value: true},
		{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now}}},
	}, options.Find().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "ns", Value: 1}}).SetLimit(maxElsewhere))
	if err != nil {
		return "", docid.ID{}, false, err
	}
	var rids []string
	found := map[string]docid.ID{}
	for _, g := range gens {
		if g.NS == ns.String() {
			continue
		}
		if id, ok := want[strings.TrimPrefix(g.Key, g.NS+keySeparator)]; ok {
			rids = append(rids, g.Key)
			found[g.Key] = id
		}
	}
	if len(rids) == 0 {
		return "", docid.ID{}, false, nil
	}
	hs, err := s.heads(ctx, rids)
	if err != nil {
		return "", docid.ID{}, false, err
	}
	for _, rid := range rids {
		if h := hs[rid]; h != nil && h.heldAt(now) && h.ownedBy(owner) {
			return h.NS, found[rid], true, nil
		}
	}
	return "", docid.ID{}, false, nil
}
