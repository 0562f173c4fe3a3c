package guard

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
)

// StampFence implements fence.DB: one update command, two statements per
// id, then one read that confirms every stamp.
//
// $max makes the stamp monotonic whatever order two stamps of one document
// arrive in, so a slow stamp of an older holder can never lower it. But
// $max compares across types in BSON order, where strings, objects and
// arrays sort above every number: it leaves such a value in place without
// an error. So each id's $max is preceded by a repair that replaces a
// value that is not a number (an array, whatever it holds, or any other
// non-null type) with the token. That is safe: lockgate writes nothing but
// its tokens into the field and drops clients' writes of it, so such a
// value was written before the fence was turned on or by a writer the rule
// does not cover, and carries no fencing state; the caller holds the lock
// now, and a number (a newer holder's token) is never replaced. The read
// that follows confirms that each existing document carries exactly the
// token: otherwise (a value the repair cannot match, a newer holder's
// token, or an older one written over the stamp where the upstream's
// updates are not atomic) the stamp failed and so does acquireLock.
func (r *MongoResolver) StampFence(ctx context.Context, ns namespace.Namespace, field string, ids []docid.ID, tokens []int64) error {
	db, coll := ns.Parts()
	notAToken := bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: field, Value: bson.D{{Key: "$type", Value: "array"}}}},
		bson.D{{Key: field, Value: bson.D{{Key: "$exists", Value: true}, {Key: "$ne", Value: nil}, {Key: "$not", Value: bson.D{{Key: "$type", Value: "number"}}}}}},
	}}}
	ups := make(bson.A, 0, 2*len(ids))
	for i, id := range ids {
		ups = append(ups,
			bson.D{
				{Key: "q", Value: append(bson.D{{Key: "_id", Value: id}}, notAToken...)},
				{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: field, Value: tokens[i]}}}}},
			},
			bson.D{
				{Key: "q", Value: bson.D{{Key: "_id", Value: id}}},
				{Key: "u", Value: bson.D{{Key: "$max", Value: bson.D{{Key: field, Value: tokens[i]}}}}},
			})
	}
	var reply bson.Raw
	err := r.client.Database(db).RunCommand(ctx, bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: ups}, {Key: "ordered", Value: true}}).Decode(&reply)
	if err != nil {
		return fmt.Errorf("stamping the fencing token into %s: %w", ns, err)
	}
	if we, err := reply.LookupErr("writeErrors"); err == nil {
		return fmt.Errorf("stamping the fencing token into %s: %v", ns, we)
	}
	if wce, err := reply.LookupErr("writeConcernError"); err == nil {
		return fmt.Errorf("stamping the fencing token into %s: %v", ns, wce)
	}
	stamps, exists, err := r.FenceStamps(ctx, ns, field, ids)
	if err != nil {
		return fmt.Errorf("confirming the fencing token in %s: %w", ns, err)
	}
	for i, id := range ids {
		if !exists[i] {
			continue // nothing to stamp: lock, then insert
		}
		t, ok := fence.StampToken(stamps[i])
		switch {
		case !ok:
			return fmt.Errorf("the fence field %s of _id %s in %s holds %s, which is not a fencing token and could not be replaced by one; remove the field outside lockgate", field, id, ns, fence.DescribeStamp(stamps[i]))
		case t != tokens[i]:
			return fmt.Errorf("the fence field %s of _id %s in %s holds token %d after stamping %d: another holder's stamp", field, id, ns, t, tokens[i])
		}
	}
	return nil
}

// FenceStamps implements fence.DB with one find on the primary.
func (r *MongoResolver) FenceStamps(ctx context.Context, ns namespace.Namespace, field string, ids []docid.ID) ([]bson.RawValue, []bool, error) {
	db, coll := ns.Parts()
	in := make(bson.A, len(ids))
	for i, id := range ids {
		in[i] = id
	}
	cur, err := r.client.Database(db).RunCommandCursor(ctx, bson.D{
		{Key: "find", Value: coll},
		{Key: "filter", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}},
		{Key: "projection", Value: bson.D{{Key: "_id", Value: 1}, {Key: field, Value: 1}}},
		{Key: "batchSize", Value: int64(len(ids) + 1)},
	}, options.RunCmd().SetReadPreference(readpref.Primary()))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the fence stamps of %s: %w", ns, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	stamps := make([]bson.RawValue, len(ids))
	exists := make([]bool, len(ids))
	at := make(map[string][]int, len(ids))
	for i, id := range ids {
		at[id.Key()] = append(at[id.Key()], i)
	}
	for cur.Next(ctx) {
		v, err := cur.Current.LookupErr("_id")
		if err != nil {
			continue
		}
		id, err := docid.New(v)
		if err != nil {
			continue
		}
		for _, i := range at[id.Key()] {
			exists[i] = true
			if s, err := cur.Current.LookupErr(field); err == nil {
				stamps[i] = bson.RawValue{Type: s.Type, Value: append([]byte(nil), s.Value...)}
			}
		}
	}
	if err := cur.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading the fence stamps of %s: %w", ns, err)
	}
	return stamps, exists, nil
}
