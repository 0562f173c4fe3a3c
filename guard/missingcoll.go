package guard

import (
	"context"
	"strings"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// CaseTwin returns the namespace of a collection of ns's database whose
// name differs from ns's only by case ("Orders" for "orders"): MongoDB's
// names are case-sensitive, so a lock on the one covers no write to the
// other. Only the hint path of a lock command on a missing collection asks.
func (r *MongoResolver) CaseTwin(ctx context.Context, ns namespace.Namespace) (string, bool) {
	db, coll := ns.Parts()
	names, err := r.client.Database(db).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return "", false
	}
	for _, n := range names {
		if n != coll && strings.EqualFold(n, coll) {
			return db + "." + n, true
		}
	}
	return "", false
}
