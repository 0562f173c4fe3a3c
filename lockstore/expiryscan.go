package lockstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.uber.org/zap"
)

// maxExpiryScan bounds the ended leases waiting to be confirmed and the
// reported expiries remembered against a second report.
const maxExpiryScan = 100000

// expiryScan finds the leases granted or renewed through this Store that
// ended without a release, so that the expiry hook hears of a lock that
// simply runs out, not only of one an acquire takes over. The hold cache
// drops such an entry when its lease ends; the scan keeps its generation
// and, once the lease has been over for OpTimeout (time for a renewal
// sent before the end to have landed), reads the key's head: still that
// generation, held, its lease over, means nobody released or renewed it,
// and the expiry is reported (Expiry.Scanned). A later takeover of the
// same generation through this Store is then not reported again. It only
// runs with an expiry hook.
type expiryScan struct {
	mu      sync.Mutex
	pending []*gen
	// noted maps the lock to the generation whose expiry the scan
	// reported.
	noted map[docid.Key]notedExpiry
	// passes counts finished scans (tests wait for one to end).
	passes atomic.Uint64
}

type notedExpiry struct {
	token int64
	end   time.Time
}

func expiryKey(ns namespace.Namespace, id docid.ID) docid.Key {
	return docid.KeyOf(ns, id)
}

// add keeps the ended own leases of ended for the next scan.
func (e *expiryScan) add(ended []*gen) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range ended {
		if len(e.pending) < maxExpiryScan {
			e.pending = append(e.pending, g)
		}
	}
}

// due takes the pending generations whose lease ended before cutoff.
func (e *expiryScan) due(cutoff time.Time) []*gen {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*gen
	kept := e.pending[:0]
	for _, g := range e.pending {
		if g.ExpiresAt.After(cutoff) {
			kept = append(kept, g)
		} else {
			out = append(out, g)
		}
	}
	clear(e.pending[len(kept):])
	e.pending = kept
	return out
}

// note remembers a reported expiry; reported tells whether one was
// reported for this generation (and forgets it: a takeover happens once).
func (e *expiryScan) note(key docid.Key, token int64, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.noted == nil {
		e.noted = map[docid.Key]notedExpiry{}
	}
	if len(e.noted) < maxExpiryScan {
		e.noted[key] = notedExpiry{token, end}
	}
}

func (e *expiryScan) reported(key docid.Key, token int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n, ok := e.noted[key]; ok && n.token == token {
		delete(e.noted, key)
		return true
	}
	return false
}

// forget drops the remembered expiries of leases that ended before
// cutoff: idle lock records are deleted after CleanupAfter, so no
// takeover of them can come.
func (e *expiryScan) forget(cutoff time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, n := range e.noted {
		if n.end.Before(cutoff) {
			delete(e.noted, k)
		}
	}
}

// scanExpiries reports the pending leases that ended before low (the
// server time's lower bound) minus OpTimeout and whose head still shows
// them; a failed read puts them back for the next tick.
func (s *Store) scanExpiries(ctx context.Context, low time.Time) {
	defer s.expScan.passes.Add(1)
	s.expScan.forget(low.Add(-s.cfg.CleanupAfter))
	due := s.expScan.due(low.Add(-s.cfg.OpTimeout))
	for len(due) > 0 {
		batch := due[:min(len(due), 1000)]
		rids := make([]string, len(batch))
		for i, g := range batch {
			rids[i] = g.Key
		}
		hs, err := s.heads(ctx, rids)
		if err != nil {
			s.log.Debug("expiry scan: reading lock heads failed; retrying", zap.Error(err))
			s.expScan.add(due)
			return
		}
		due = due[len(batch):]
		for _, g := range batch {
			h := hs[g.Key]
			if h == nil || h.Owner == nil || g.Owner == nil || string(h.Owner.Data) != string(g.Owner.Data) ||
				h.Token != g.Token || h.ExpiresAt.After(low) {
				continue // released, renewed, taken over or deleted since
			}
			id := h.lockedID()
			s.expScan.note(expiryKey(namespace.Of(h.NS), id), h.Token, h.ExpiresAt)
			s.onExpire(Expiry{NS: namespace.Of(h.NS), ID: id, Former: h.holder(), At: h.ExpiresAt, Scanned: true})
		}
	}
}
