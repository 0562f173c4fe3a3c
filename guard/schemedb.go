package guard

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/scheme"
	"github.com/lockgate/lockgate/namespace"
)

var _ scheme.Reader = (*MongoResolver)(nil)

// LockFields implements scheme.Reader with one find on the primary.
func (r *MongoResolver) LockFields(ctx context.Context, ns namespace.Namespace, id docid.ID, top []string) (bsoncore.Document, bool, error) {
	db, coll := ns.Parts()
	proj := bson.D{{Key: "_id", Value: 1}}
	for _, f := range top {
		proj = append(proj, bson.E{Key: f, Value: 1})
	}
	cur, err := r.client.Database(db).RunCommandCursor(ctx, bson.D{
		{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "projection", Value: proj}, {Key: "limit", Value: int64(1)}, {Key: "singleBatch", Value: true},
	}, options.RunCmd().SetReadPreference(readpref.Primary()))
	if err != nil {
		return nil, false, fmt.Errorf("reading the lock fields of %s: %w", ns, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	if !cur.Next(ctx) {
		if err := cur.Err(); err != nil {
			return nil, false, fmt.Errorf("reading the lock fields of %s: %w", ns, err)
		}
		return nil, false, nil
	}
	return bsoncore.Document(append([]byte(nil), cur.Current...)), true, nil
}
