package guard

import (
	"context"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
)

// holds checks the locks of ids (enforce.Locks.Check, through the
// connection's memo for a single id), and records for an enforced rule
// what the write's flight needs (the owner, the locks, the lease they
// surely have left, measured now) and, for a fenced rule, their tokens
// for the rewrite.
func (g *Guard) holds(ctx context.Context, v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (bool, []docid.ID, error) {
	// Read before the store answers: a force-release under way since is
	// seen at the launch (launchAt).
	seq := g.flights.ForceSeq()
	h, ok := g.heldFromMemo(v, r, o, ns, ids)
	if !ok {
		var err error
		if h, err = g.locks.Check(ctx, o, ns, ids, r.LeaseMargin, fenced(*r), v.TokenBuf[:0]); err != nil || len(h.Missing) > 0 {
			return false, h.Missing, err
		}
	}
	if !h.Measured {
		return true, nil, nil
	}
	if r.Mode == policy.Enforce {
		v.flightLocksSince(o, r, ns, ids, h.Left, true, seq)
	}
	if !fenced(*r) {
		return true, nil, nil
	}
	p := v.fencePlan()
	for i, id := range ids {
		p.tokens[docid.KeyOf(ns, id)] = h.Tokens[i]
	}
	return true, nil, nil
}

// heldFromMemo is the check of one id answered through the writer's
// memos (enforce.HeldMemos, the session's or the connection's); false:
// ask the store as usual.
func (g *Guard) heldFromMemo(v *verdict, r *policy.Rule, o *lockstore.Owner, ns namespace.Namespace, ids []docid.ID) (enforce.Held, bool) {
	if len(ids) != 1 || v.Req == nil || !g.locks.Measures() {
		return enforce.Held{}, false
	}
	st := connStateOf(v.Req)
	if st == nil {
		return enforce.Held{}, false
	}
	h, ok := st.memo().held.Check(g.locks, o, ns, ids[0], r.LeaseMargin, v.TokenBuf[:])
	st.unlock(v.Req)
	return h, ok
}
