package lockstore

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// A release through this Store that finds a local waiter for the key hands
// the key over in the release's own generation: instead of "free" followed
// by the waiter's own "acquire" (two more round trips after the release is
// written, plus the wake-up), the releaser writes one generation, kind
// handoff, that takes the key from the releasing owner and gives it to the
// waiter with token + 1 and the waiter's lease. It is decided by the same
// claim insert as every change (so a concurrent writer through another
// instance either wins generation seq+1 first, and the handoff re-decides
// on what it wrote, or loses it), and it is exactly the state a release
// followed by the waiter's acquire would leave, one generation sooner.
//
// Only a waiter for one key is handed to (a waiter for several must take
// them all in one call, in canonical order), and only the waiter the
// release would otherwise wake: first in the key's queue and first
// everywhere, idle (not in its own attempt), with its caller still there.
// The waiter states in waitq.go make the handoff and the waiter's own
// giving up exclude each other: a waiter that gives up while a handoff to
// it is being written waits for its outcome, keeps the lock if its wait
// merely elapsed (like an attempt that was under way at the deadline) and
// releases it again if its caller is gone.

// handoffWant is what a waiter of one key offers to releases.
type handoffWant struct {
	ctx   context.Context // the Acquire call's: a handoff skips a caller that is gone
	owner Owner
	ns    string
	key   lockKey
	lease time.Duration
}

// handoffResult is a handoff's outcome for the waiter.
type handoffResult struct {
	granted bool
	lock    Lock
}

// handoffStep wraps a release step: when the release frees the key and x is
// not nil, the freed generation is turned into a grant to x.
func handoffStep(release stepFunc, x *waiter) stepFunc {
	if x == nil {
		return release
	}
	return func(h *gen, now time.Time, unc time.Duration) (*gen, error) {
		n, err := release(h, now, unc)
		w := x.want
		if n == nil || string(h.Owner.Data) == string(w.owner.Session) {
			// Nothing freed, or the waiter's session is the one releasing
			// (another binding, or endSessions): a plain release, and the
			// waiter tries on its own.
			return n, err
		}
		n.Kind = kindHandoff
		n.Token = aboveFloor(h.Token+1, w.key.floor, now, unc)
		n.Owner, n.Bind, n.OwnerApp, n.OwnerClient, n.OwnerUser = sessionBinary(w.owner.Session), w.owner.Bind, w.owner.App, w.owner.Client, w.owner.User
		n.Implicit = w.owner.Implicit
		n.AcquiredAt, n.ExpiresAt = now, now.Add(w.lease).Truncate(time.Millisecond)
		return n, nil
	}
}

// endHandoff reports the outcome of a release that took x (nil: none) to
// it: g is the generation the release wrote (nil if it freed nothing),
// err its error.
func (s *Store) endHandoff(x *waiter, g *gen, err error) {
	if x == nil {
		return
	}
	r := handoffResult{granted: err == nil && g != nil && g.Kind == kindHandoff}
	if r.granted {
		r.lock = Lock{ID: x.want.key.id, Token: g.Token, ExpiresAt: g.ExpiresAt, LastError: g.LastError}
		s.m.handoffs.Inc()
	}
	s.wq.handoffDone(x, r)
}

// giveUp ends a wait that did not succeed. It returns the lock a handoff
// gave the waiter meanwhile (ok), which the caller keeps when keep is set
// (the wait merely elapsed); otherwise the lock is released again, and
// ok is false.
func (s *Store) giveUp(ctx context.Context, w *waiter, owner Owner, keep bool) (map[string]Lock, bool) {
	if !s.wq.abandon(w) {
		return nil, false
	}
	r := <-w.handed
	rid := w.want.key.rid
	if keep {
		return map[string]Lock{rid: r.lock}, true
	}
	s.log.Debug("a waiter that gave up was handed a lock; releasing it", zap.String("ns", w.want.ns))
	s.rollback(ctx, owner, []string{rid}, w)
	return nil, false
}
