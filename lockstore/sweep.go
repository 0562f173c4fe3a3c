package lockstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// maxPendingSweeps bounds the ended sessions waiting for a sweep; beyond
// it the oldest wait for their leases instead.
const maxPendingSweeps = 100000

// sweepPause separates two sweeps.
const sweepPause = time.Second

// sessionSweeper finds the locks of ended sessions that this instance did
// not take (taken through another proxy with the same session): one query
// by owner for every session ended since the last sweep, so that a flood
// of endSessions costs one query per sweep and not one scan per session on
// servers that cannot answer an owner query from an index (FerretDB scans
// the whole lock collection for it).
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
		n, err := s.sweepOnce(s.ctx)
		// Sessions ended during a short pause share the next query: a
		// flood of endSessions costs a few queries a second at most.
		select {
		case <-s.ctx.Done():
		case <-time.After(sweepPause):
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
		var gens []gen
		err := s.rt(ctx, opSweep, func(ctx context.Context) error {
			cur, err := s.coll.Find(ctx, bson.D{{Key: "owner", Value: bson.D{{Key: "$in", Value: batch}}}, {Key: "head", Value: true}},
				options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}))
			if err != nil {
				return err
			}
			return cur.All(ctx, &gens)
		})
		if err != nil {
			return total, s.storeErr(ctx, opSweep, err)
		}
		rids := make([]string, len(gens))
		for i, g := range gens {
			rids[i] = g.Key
		}
		match := func(g *gen) bool { _, ok := pending[string(g.Owner.Data)]; return ok }
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
