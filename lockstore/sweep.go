package lockstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// maxPendingSweeps bounds the ended sessions waiting for a sweep; beyond
// it the oldest wait for their leases instead.
const maxPendingSweeps = 100000

// sweepPause separates two sweeps, at least; sweepDuty times the last
// sweep's duration when that is longer.
const (
	sweepPause = time.Second
	sweepDuty  = 4
)

// sessionSweeper finds the locks of ended sessions that this instance did
// not take (taken through another proxy with the same session): one query
// by owner of the heads and one of the claims (sweepKeys) for every
// session ended since the last sweep, so that a flood of endSessions
// costs two queries per sweep and not two scans per session on servers
// that cannot answer an owner query from an index (FerretDB scans both
// collections for them).
type sessionSweeper struct {
	mu      sync.Mutex
	pending map[string]struct{}
	kick    chan struct{}
	busy    atomic.Bool // a sweep is running (tests wait for quiescence)
}

func newSessionSweeper() *sessionSweeper {
	return &sessionSweeper{pending: map[string]struct{}{}, kick: make(chan struct{}, 1)}
}

func (w *sessionSweeper) add(session []byte) {
	w.mu.Lock()
	if len(w.pending) < maxPendingSweeps {
		w.pending[string(session)] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// idle reports whether no ended session waits and no sweep runs.
func (w *sessionSweeper) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending) == 0 && !w.busy.Load()
}

func (w *sessionSweeper) take() map[string]struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = map[string]struct{}{}
	return p
}

// sweepSessions runs until the store closes.
func (s *Store) sweepSessions() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.sweeper.kick:
		}
		s.sweeper.busy.Store(true)
		start := time.Now()
		n, err := s.sweepOnce(s.ctx)
		// Sessions ended during the pause share the next sweep: a flood of
		// endSessions costs one sweep a pause. The pause grows with the
		// sweep's own time, so that scans of a large lock store (FerretDB
		// answers the sweep's queries by scanning) take at most a fifth of
		// one of its connections.
		select {
		case <-s.ctx.Done():
		case <-time.After(max(sweepPause, sweepDuty*time.Since(start))):
		}
		s.sweeper.busy.Store(false)
		if err != nil {
			s.log.Warn("releasing the locks of ended sessions failed; they expire with their leases", zap.Error(err))
		} else if n > 0 {
			s.log.Debug("released the locks of ended sessions held through other instances", zap.Int("released", n))
		}
	}
}

// sweepOnce releases every lock held by a pending ended session.
func (s *Store) sweepOnce(ctx context.Context) (int, error) {
	pending := s.sweeper.take()
	if len(pending) == 0 {
		return 0, nil
	}
	owners := make([]any, 0, len(pending))
	for sess := range pending {
		owners = append(owners, sessionBinary([]byte(sess)))
	}
	total := 0
	for len(owners) > 0 {
		batch := owners[:min(len(owners), 1000)]
		owners = owners[len(batch):]
		match := func(g *gen) bool { _, ok := pending[string(g.Owner.Data)]; return ok }
		rids, err := s.sweepKeys(ctx, batch, match)
		if err != nil {
			return total, err
		}
		n, err := s.releaseEach(ctx, rids, func(ctx context.Context, rid string) (bool, error) {
			return s.releaseOne(ctx, opRelease, rid, match, "", true, true)
		})
		total += n
		s.wq.notify(rids...)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// sweepKeys returns the keys that the sessions in owners may hold (mine
// tells their generations): those whose head document names one of them,
// and those one of them has a claim on. A head can have been moved back
// to another owner's hold while the session's claim after it is the key's
// newest (a late head write, doc.go), and only the claims name that key
// (compaction keeps every claim after a key's head), as for ReleaseAll.
// Each is one query for up to a thousand sessions, a scan on FerretDB (it
// answers only exact _id filters from an index) of the lock collection
// and of at most CleanupAfter's worth of claims; sweeps are a sweepPause
// apart at least, whatever the number of sessions ended meanwhile. Keys
// no session of owners holds are read and left alone by releaseOne, but
// those the cache saw move past their claims (claimedKeys).
func (s *Store) sweepKeys(ctx context.Context, owners []any, mine func(*gen) bool) ([]string, error) {
	byOwner := bson.E{Key: "owner", Value: bson.D{{Key: "$in", Value: owners}}}
	seen := map[string]bool{}
	rids, err := s.headKeys(ctx, opSweep, bson.D{byOwner, {Key: "head", Value: true}}, seen, nil)
	if err != nil {
		return nil, err
	}
	return s.claimedKeys(ctx, opSweep, bson.D{byOwner}, mine, seen, rids)
}

// headKeys appends to rids the keys of the head documents matching filter
// that seen does not hold yet, and adds them to seen.
func (s *Store) headKeys(ctx context.Context, op string, filter bson.D, seen map[string]bool, rids []string) ([]string, error) {
	gens, err := s.find(ctx, op, s.coll, filter)
	if err != nil {
		return rids, err
	}
	for _, g := range gens {
		if !seen[g.Key] {
			seen[g.Key] = true
			rids = append(rids, g.Key)
		}
	}
	return rids, nil
}

// claimedKeys appends to rids the keys of the claims matching filter that
// seen does not hold yet, and adds them to seen, but for the keys this
// Store's cache knows a generation of that is later than every claim
// found and not mine: a key that moved past them is not held by whoever
// wrote them (the keys the caller released through this Store just now,
// the usual ones), and reading it again would double a release's cost.
func (s *Store) claimedKeys(ctx context.Context, op string, filter bson.D, mine func(*gen) bool, seen map[string]bool, rids []string) ([]string, error) {
	gens, err := s.find(ctx, op, s.claims, filter)
	if err != nil {
		return rids, err
	}
	newest := map[string]gen{}
	for _, g := range gens {
		if n, ok := newest[g.Key]; !seen[g.Key] && (!ok || g.Seq > n.Seq) {
			newest[g.Key] = g
		}
	}
	for rid, c := range newest {
		// Later in the key's chain, and written later: a key collected
		// by the janitor starts its chain afresh (headgc.go), so a cached
		// generation of its previous life can have the higher seq, never
		// the later time (the key was idle for CleanupAfter in between).
		if e, ok := s.cache.get(rid); ok && e.g.Seq > c.Seq && e.g.At.After(c.At) && (e.g.Owner == nil || !mine(e.g)) {
			continue
		}
		seen[rid] = true
		rids = append(rids, rid)
	}
	return rids, nil
}

// find returns the key, seq and time of c's generations matching filter.
func (s *Store) find(ctx context.Context, op string, c *mongo.Collection, filter bson.D) ([]gen, error) {
	var gens []gen
	err := s.rt(ctx, op, func(ctx context.Context) error {
		cur, err := c.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "seq", Value: 1}, {Key: "at", Value: 1}}))
		if err != nil {
			return err
		}
		return cur.All(ctx, &gens)
	})
	return gens, s.storeErr(ctx, op, err)
}
