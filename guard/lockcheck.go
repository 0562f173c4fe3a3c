package guard

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
)

// holds checks the locks of ids (enforce.Locks.Check, through the
// connection's memo for a single id), and records for an enforced rule
// what the write's flight needs (the owner, the locks, the lease they
// surely have left, measured now) and, for a fenced rule, their tokens
// for the rewrite. It is enforce.Checker.Held: a closure over g, not the
// method value of a method, whose wrapper moved the ten words of
// arguments one register along to put g first (two of them onto the
// stack) on every write.
func (g *Guard) holds() func(ctx context.Context, v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (bool, []docid.ID, error) {
	return func(ctx context.Context, v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (bool, []docid.ID, error) {
		// Read before the store answers: a force-release under way
		// since is seen at the launch (launchAt).
		seq := g.flights.ForceSeq()
		if left, ok := g.heldFromMemo(v, r, o, ns, ids); ok {
			g.held(v, r, o, ns, ids, left, v.TokenBuf[:1], seq)
			return true, nil, nil
		}
		h, err := g.locks.Check(ctx, o, ns, ids, r.LeaseMargin, fenced(r), v.TokenBuf[:0])
		if err != nil || len(h.Missing) > 0 {
			return false, h.Missing, err
		}
		if h.Measured {
			g.held(v, r, o, ns, ids, h.Left, h.Tokens, seq)
		}
		return true, nil, nil
	}
}

// held records the locks of ids, found held with left past the margin
// (measured) and tokens, checked after the tracker's ForceSeq read seq:
// in the flight of an enforced rule's write, and for a fenced rule their
// tokens for the rewrite.
func (g *Guard) held(v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID, left time.Duration, tokens []int64, seq uint64) {
	if r.Mode == policy.Enforce {
		v.flightLocksSince(o, r, ns, ids, left, true, seq)
	}
	if !fenced(r) {
		return
	}
	p := v.fencePlan()
	for i, id := range ids {
		p.tokens[docid.KeyOf(ns, id)] = tokens[i]
	}
}

// heldFromMemo is the check of one id answered through the writer's
// memos (enforce.HeldMemos, the session's or the connection's): the
// lease left past the margin, the token in v.TokenBuf; false: ask the
// store as usual. The answer is for v.Now, which the checker keeps fresh
// (enforce.Checker.Needs), so the flight's lease is measured from the
// very instant its check was for, and the memo reads no clock.
func (g *Guard) heldFromMemo(v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (time.Duration, bool) {
	if len(ids) != 1 || v.Req == nil || !g.locks.Measures() {
		return 0, false
	}
	st := v.conn(v.Req)
	if st == nil {
		return 0, false
	}
	left, token, ok := st.memo().held.Left(g.locks, o, ns, &ids[0], r.LeaseMargin, v.Now)
	st.unlock(v.Req)
	v.TokenBuf[0] = token
	return left, ok
}
