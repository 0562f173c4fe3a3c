package lockcmd

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/wire"
)

// refuseMissingCollection refuses acquireLock in a collection that does not
// exist where the namespace's rule says so (refuseLocksOnMissingCollection):
// a misspelt collection then fails at the lock, where the mistake is made,
// instead of at the first write. Without the option the lock is granted
// with a warning (namespaceHints). It runs after the caller's authority is
// checked, so that it tells nobody about collections they may not write.
// A failure to read the collection list grants the lock: this check is a
// convenience, not a protection.
func (s *Stage) refuseMissingCollection(ctx context.Context, a *lockArgs) *refuse.Error {
	if a.op != wire.LockAcquire {
		return nil
	}
	pol := s.cfg.Policy()
	if pol == nil {
		return nil
	}
	rule := pol.Lookup(a.ns)
	if !rule.RefuseLocksOnMissingCollection {
		return nil
	}
	if s.cfg.Collections == nil {
		return nil
	}
	if exists, err := s.cfg.Collections.CollectionExists(ctx, a.ns); err != nil || exists {
		return nil
	}
	return &refuse.Error{Code: mongoerr.NamespaceNotFound, Reason: refuse.ReasonNoCollection, NS: a.ns.String(),
		Msg: fmt.Sprintf("lockgate: acquireLock refused: the collection %s does not exist, and the policy rule %q refuses locks in missing collections "+
			"(refuseLocksOnMissingCollection); check the database and collection name, or create the collection first", a.ns, rule.Match)}
}
