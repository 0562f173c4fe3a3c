package lockstore

import (
	"context"
	"sync"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// heldNamespaces remembers which namespaces had a held lock at the last
// refresh, so that an insert into a namespace where nobody holds any lock
// needs no lock store round trip to prove that its _id is not locked.
// It errs only towards "may hold": unknown before the first refresh, after
// a failed one, and once the last refresh is older than the trust period;
// a lock taken through this Store marks its namespace at once.
type heldNamespaces struct {
	mu    sync.Mutex
	ns    map[string]bool
	at    time.Time // local time the last successful refresh was sent
	trust time.Duration
	// marked is when each namespace was last marked, kept until a refresh
	// sent after that has been applied: a refresh whose query ran before
	// a grant's write landed does not list the namespace, and must not
	// erase the mark of that grant when its answer arrives.
	marked map[string]time.Time
}

// mark records that a lock is granted in ns through this Store at local
// time now: before the grant's write, so that no check runs between the
// write and the mark, and again after it has landed, which is the mark a
// refresh sent earlier must not erase.
func (h *heldNamespaces) mark(ns string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns != nil {
		h.ns[ns] = true
	}
	if h.marked == nil {
		h.marked = map[string]time.Time{}
	}
	h.marked[ns] = now
}

// set installs the namespaces a refresh sent at local time at found,
// with every namespace marked since it was sent.
func (h *heldNamespaces) set(ns map[string]bool, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for n, t := range h.marked {
		if t.Before(at) {
			// Its grant landed before the refresh was sent: the refresh
			// saw it if it is still held.
			delete(h.marked, n)
			continue
		}
		ns[n] = true
	}
	h.ns, h.at = ns, at
}

func (h *heldNamespaces) mayHold(ns namespace.Namespace, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns == nil || h.trust <= 0 || now.Sub(h.at) > h.trust {
		return true
	}
	return h.ns[ns.String()]
}

// MayHoldLocks reports whether a lock may be held in ns. false means: no
// lock was held there at the last refresh (at most CacheTrust ago) and
// none was taken through this Store since, and no other Store could have
// taken one unseen: none was live at this Store's last read of the
// registry, and one that starts grants nothing until that read has aged out
// (instances.go), and no implicit lock is held there in memory
// (memlock.go), and none granted through this Store may still be held
// there by its generations (the refresh reads head documents, which can
// lag or go back: grantView.ownMayHold). Inserts use it to skip the
// per-_id check.
func (s *Store) MayHoldLocks(ns namespace.Namespace) bool {
	now := time.Now()
	return !s.alone(now) || s.heldNS.mayHold(ns, now) || s.memHeldIn(ns) || s.gview.ownMayHold(ns)
}

// refreshHeldNamespaces reads the namespaces that have a held lock, in one
// round trip.
func (s *Store) refreshHeldNamespaces(ctx context.Context) {
	if !s.setupDone.Load() {
		return
	}
	start := time.Now()
	now, unc := s.clock.Now()
	var vals []any
	err := s.rt(ctx, opHeldNamespaces, func(ctx context.Context) error {
		var err error
		vals, err = s.coll.Distinct(ctx, "ns", bson.D{{Key: "head", Value: true}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now.Add(-unc)}}}})
		return err
	})
	// The generations this Store wrote whose leases ended before the
	// query's floor cannot be held any more.
	s.gview.prune(now.Add(-unc))
	if err != nil {
		return // the old view ages out after CacheTrust
	}
	m := make(map[string]bool, len(vals))
	for _, v := range vals {
		if ns, ok := v.(string); ok {
			m[ns] = true
		}
	}
	s.heldNS.set(m, start)
}

// MayBeHeldIn lists the _ids of ns (as first locked) that may be locked
// now, at most limit of them; complete: no other may be. The insert check
// under a collation that is not simple reads it, as it cannot name the
// keys it must check (docs/SECURITY.md). It errs towards listing, like
// ConfirmedStatus: a head record can lag behind its claims, or be missing
// for a moment for a key just locked for the first time, so the claims
// whose lease has not ended by the clock's earliest estimate are read as
// well as the heads, and the locks held in memory; whether each listed
// _id is held is for ConfirmedStatus to say. Two round trips; the claims
// are not indexed by namespace, so the second scans them on MongoDB too,
// which the caller only pays for an insert of a string _id into such a
// namespace where a lock may be held.
func (s *Store) MayBeHeldIn(ctx context.Context, ns namespace.Namespace, limit int) ([]docid.ID, bool, error) {
	if err := s.ready(ctx); err != nil {
		return nil, false, err
	}
	now, unc := s.clock.Now()
	filter := bson.D{{Key: "ns", Value: ns.String()}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now.Add(-unc)}}}}
	// A key is listed once however many generations it has; a claim per
	// renewal can outnumber the keys, so the claims get a larger bound,
	// and reaching it counts as incomplete.
	seen := map[string]bool{}
	var ids []docid.ID
	complete := true
	add := func(id docid.ID) {
		if id.IsZero() || seen[id.Key()] {
			return
		}
		seen[id.Key()] = true
		if len(ids) == limit {
			complete = false
			return
		}
		ids = append(ids, id)
	}
	proj := bson.D{{Key: "id", Value: 1}}
	for _, c := range []struct {
		coll  string
		bound int
	}{{"heads", limit + 1}, {"claims", 8*limit + 1}} {
		var gens []gen
		err := s.rt(ctx, opFind, func(ctx context.Context) error {
			coll, f := s.coll, append(bson.D{{Key: "head", Value: true}}, filter...)
			if c.coll == "claims" {
				coll, f = s.claims, filter
			}
			cur, err := coll.Find(ctx, f, options.Find().SetProjection(proj).SetLimit(int64(c.bound)))
			if err != nil {
				return err
			}
			return cur.All(ctx, &gens)
		})
		if err != nil {
			return nil, false, s.storeErr(ctx, opFind, err)
		}
		if len(gens) == c.bound {
			complete = false
		}
		for i := range gens {
			add(gens[i].lockedID())
		}
	}
	_, sts := s.memList(ns)
	for _, st := range sts {
		add(st.ID)
	}
	return ids, complete, nil
}
