package guard

import (
	"context"
	"fmt"
)

// refuseMissingCollection refuses acquireLock in a collection that does not
// exist where the namespace's rule says so (refuseLocksOnMissingCollection):
// a misspelt collection then fails at the lock, where the mistake is made,
// instead of at the first write. Without the option the lock is granted
// with a warning (namespaceHints). It runs after the caller's authority is
// checked, so that it tells nobody about collections they may not write.
// A failure to read the collection list grants the lock: this check is a
// convenience, not a protection.
func (g *Guard) refuseMissingCollection(ctx context.Context, a *lockArgs) *cmdError {
	if a.name != cmdAcquire {
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
	return &cmdError{code: codeNamespaceNotFound, reason: reasonNoCollection, ns: a.ns,
		msg: fmt.Sprintf("lockgate: acquireLock refused: the collection %s does not exist, and the policy rule %q refuses locks in missing collections "+
			"(refuseLocksOnMissingCollection); check the database and collection name, or create the collection first", a.ns, rule.Match)}
}
