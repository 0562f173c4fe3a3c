package guard

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
)

// elsewhereFinder is implemented by lock stores that can find a session's
// lock on the same _id in another namespace (*lockstore.Store does).
type elsewhereFinder interface {
	HeldElsewhere(ctx context.Context, owner lockstore.Owner, ns string, ids []docid.ID) (string, docid.ID, bool, error)
}

// heldInOtherNamespace explains, on the refusal path only, a lock taken in
// the wrong namespace: most often acquireLock run on another database than
// the write (mongosh starts on "test"), or on a misspelt collection. It
// returns the text to append to the refusal, naming only ids the request
// named and a namespace the session itself locked in.
func (g *Guard) heldInOtherNamespace(ctx context.Context, o lockstore.Owner, ns string, ids []docid.ID) (string, bool) {
	f, ok := g.opts.Store.(elsewhereFinder)
	if !ok || len(ids) == 0 {
		return "", false
	}
	other, id, ok, err := f.HeldElsewhere(ctx, o, ns, ids[:min(len(ids), 10)])
	if err != nil || !ok {
		return "", false
	}
	db, coll := namespace.Of(ns).Parts()
	return fmt.Sprintf(" (it holds the lock on _id %s in %s instead: a lock covers only the namespace it was taken in; run {acquireLock: %q} on database %s)",
		id.String(), other, coll, db), true
}
