package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
)

// holds checks the locks of ids like Store.Holds, records for an enforced
// rule what the write's flight needs (the owner, the locks, the lease they
// surely have left, measured now) and, for a fenced rule, their tokens for
// the rewrite.
func (g *Guard) holds(ctx context.Context, v *verdict, r *policy.Rule, o lockstore.Owner, ns string, ids []docid.ID) (bool, []docid.ID, error) {
	ts, ok := g.opts.Store.(tokenStore)
	if !ok {
		if fenced(*r) {
			return false, nil, fmt.Errorf("%w: this lock store cannot report fencing tokens", lockstore.ErrUnavailable)
		}
		return g.opts.Store.Holds(ctx, o, ns, ids, r.LeaseMargin)
	}
	// Read before the store answers: a force-release under way since is
	// seen at the launch (launchAt).
	seq := g.flights.ForceSeq()
	var tokens []int64
	var left time.Duration
	var missing []docid.ID
	var err error
	if ti, ok := ts.(tokenIntoStore); ok {
		tokens = v.tokenBuf[:0]
		if len(ids) > len(v.tokenBuf) {
			tokens = make([]int64, 0, len(ids))
		}
		tokens = tokens[:len(ids)]
		left, missing, err = ti.HeldTokensInto(ctx, o, ns, ids, r.LeaseMargin, tokens)
	} else {
		tokens, left, missing, err = ts.HeldTokens(ctx, o, ns, ids, r.LeaseMargin)
	}
	if err != nil || len(missing) > 0 {
		return false, missing, err
	}
	if r.Mode == policy.Enforce {
		v.flightLocksSince(o, r, ns, ids, left, true, seq)
	}
	if !fenced(*r) {
		return true, nil, nil
	}
	p := v.fencePlan()
	for i, id := range ids {
		p.tokens[docid.KeyOf(namespace.Of(ns), id)] = tokens[i]
	}
	return true, nil, nil
}
