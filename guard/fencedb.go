package guard

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
)

// fenceDB is what the document fence needs from the deployment, through
// the proxy's own client (MongoResolver implements it): never over a
// client's connection, since the stamps are re-read from the upstream pump,
// which must not wait for its own connection.
type fenceDB interface {
	// StampFence raises field to tokens[i] in the document ids[i] of ns,
	// where it exists, never lowering it ($max).
	StampFence(ctx context.Context, ns, field string, ids []docid.ID, tokens []int64) error
	// FenceStamps reads field of the documents ids of ns: for each id, the
	// stamp (zero Type when the field is absent) and whether the document
	// exists.
	FenceStamps(ctx context.Context, ns, field string, ids []docid.ID) (stamps []bson.RawValue, exists []bool, err error)
}

// StampFence implements fenceDB: one update command, one statement per id.
// $max makes it monotonic whatever order two stamps of one document
// arrive in, so a slow stamp of an older holder can never lower it.
func (r *MongoResolver) StampFence(ctx context.Context, ns, field string, ids []docid.ID, tokens []int64) error {
	db, coll := splitNS(ns)
	ups := make(bson.A, len(ids))
	for i, id := range ids {
		ups[i] = bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: id}}},
			{Key: "u", Value: bson.D{{Key: "$max", Value: bson.D{{Key: field, Value: tokens[i]}}}}},
		}
	}
	var reply bson.Raw
	err := r.client.Database(db).RunCommand(ctx, bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: ups}, {Key: "ordered", Value: false}}).Decode(&reply)
	if err != nil {
		return fmt.Errorf("stamping the fencing token into %s: %w", ns, err)
	}
	if we, err := reply.LookupErr("writeErrors"); err == nil {
		return fmt.Errorf("stamping the fencing token into %s: %v", ns, we)
	}
	if wce, err := reply.LookupErr("writeConcernError"); err == nil {
		return fmt.Errorf("stamping the fencing token into %s: %v", ns, wce)
	}
	return nil
}

// FenceStamps implements fenceDB with one find on the primary.
func (r *MongoResolver) FenceStamps(ctx context.Context, ns, field string, ids []docid.ID) ([]bson.RawValue, []bool, error) {
	db, coll := splitNS(ns)
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
