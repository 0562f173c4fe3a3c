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
	if left, tokens, ok = g.heldFromMemo(ts, v, r, o, ns, ids); ok {
		// Answered from the connection's memo: the store is unchanged
		// since it answered the same check.
	} else if ti, ok := ts.(tokenIntoStore); ok {
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

// heldMemoStore answers a connection's repeated check of one lock from the
// connection's memo while the store is unchanged since it filled it
// (lockstore.HeldMemo): no key built, no shared mutex, no map.
type heldMemoStore interface {
	HeldTokenMemo(m *lockstore.HeldMemo, owner lockstore.Owner, ns string, id docid.ID, margin time.Duration) (time.Duration, int64, bool)
}

// heldFromMemo is the check of one id answered through the connection's
// memo of its latest check of that document, else through the one it
// replaces next; false: ask the store as usual.
func (g *Guard) heldFromMemo(ts tokenStore, v *verdict, r *policy.Rule, o lockstore.Owner, ns string, ids []docid.ID) (time.Duration, []int64, bool) {
	ms, ok := ts.(heldMemoStore)
	if !ok || len(ids) != 1 || v.req == nil {
		return 0, nil, false
	}
	st := connStateOf(v.req)
	if st == nil {
		return 0, nil, false
	}
	m := &st.held[st.nextHeld]
	for i := range st.held {
		if st.held[i].Of(ns, ids[0]) {
			m = &st.held[i]
			break
		}
	}
	if m == &st.held[st.nextHeld] {
		st.nextHeld = (st.nextHeld + 1) % len(st.held)
	}
	left, token, ok := ms.HeldTokenMemo(m, o, ns, ids[0], r.LeaseMargin)
	st.mu.Unlock()
	if !ok {
		return 0, nil, false
	}
	tokens := v.tokenBuf[:1]
	tokens[0] = token
	return left, tokens, true
}
