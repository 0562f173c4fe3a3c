package guard

import (
	"context"
	"fmt"
	"strings"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// refuseMissingCollection refuses acquireLock in a collection that does not
// exist where the namespace's rule says so (refuseLocksOnMissingCollection):
// a misspelt collection then fails at the lock, where the mistake is made,
// instead of at the first write. Without the option the lock is granted
// with a warning (namespaceHints). It runs after the caller's authority is
// checked, so that it tells nobody about collections they may not write.
// A failure to read the collection list grants the lock: this check is a
// convenience, not a protection.
func (g *Guard) refuseMissingCollection(ctx context.Context, a *lockArgs) *refuse.Error {
	if a.op != wire.LockAcquire {
		return nil
	}
	pol := g.policy.Load()
	if pol == nil {
		return nil
	}
	rule := pol.Lookup(a.ns)
	if !rule.RefuseLocksOnMissingCollection {
		return nil
	}
	c, ok := g.opts.Resolver.(collectionChecker)
	if !ok {
		return nil
	}
	if exists, err := c.CollectionExists(ctx, a.ns); err != nil || exists {
		return nil
	}
	return &refuse.Error{Code: mongoerr.NamespaceNotFound, Reason: refuse.ReasonNoCollection, NS: a.ns,
		Msg: fmt.Sprintf("lockgate: acquireLock refused: the collection %s does not exist, and the policy rule %q refuses locks in missing collections "+
			"(refuseLocksOnMissingCollection); check the database and collection name, or create the collection first", a.ns, rule.Match)}
}

// caseTwinFinder is implemented by resolvers that can find an existing
// collection whose name differs from a missing one only by case.
type caseTwinFinder interface {
	CaseTwin(ctx context.Context, ns string) (string, bool)
}

// CaseTwin returns the namespace of a collection of ns's database whose
// name differs from ns's only by case ("Orders" for "orders"): MongoDB's
// names are case-sensitive, so a lock on the one covers no write to the
// other. Only the hint path of a lock command on a missing collection asks.
func (r *MongoResolver) CaseTwin(ctx context.Context, ns string) (string, bool) {
	db, coll := namespace.Of(ns).Parts()
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
