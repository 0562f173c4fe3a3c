package lockstore

import (
	"context"
	"strings"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// HeldTokens is Holds for enforcement that needs more than yes or no:
// when owner holds every id with at least margin of lease left, it returns
// the fencing token of each id, in the order of ids, and how much lease
// the earliest-ending of them surely has left, measured now on the lock
// store server's clock (its uncertainty subtracted); otherwise no tokens
// and the ids not held. Like Holds it answers from the cache where it can
// and fails closed.
func (s *Store) HeldTokens(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error) {
	if err := checkOwner(owner); err != nil {
		return nil, 0, nil, err
	}
	// Each id's key is made once; idx maps an id to its key.
	ks, idx, err := keysIndexed(ns, ids, true)
	if err != nil {
		return nil, 0, nil, err
	}
	var one [1]int64
	byKey := one[:0]
	if len(ks) > 1 {
		byKey = make([]int64, 0, len(ks))
	}
	byKey = byKey[:len(ks)]
	ok, missing, end, err := s.holds(ctx, owner, ks, margin, byKey)
	if err != nil || !ok {
		return nil, 0, missing, err
	}
	out := make([]int64, len(ids))
	for i := range ids {
		if idx == nil {
			out[i] = byKey[i]
		} else {
			out[i] = byKey[idx[i]]
		}
	}
	now, _ := s.clock.Now()
	return out, time.Duration(end - now.UnixNano()), nil, nil
}

// HeldTokensInto is HeldTokens writing the tokens into tokens (len(ids)
// long) instead of a new slice. A single id whose lock the cache can
// vouch for, the usual enforced write, is answered without an allocation:
// its record id is built on the stack and looked up as it is. Anything
// else takes HeldTokens' path, and so the same answers.
func (s *Store) HeldTokensInto(ctx context.Context, owner Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration, tokens []int64) (time.Duration, []docid.ID, error) {
	if len(ids) == 1 && len(tokens) == 1 && s.cfg.CacheTrust > 0 && len(owner.Session) > 0 && !ids[0].IsZero() {
		if left, ok := s.heldCached(owner, ns, ids[0], margin, &tokens[0]); ok {
			return left, nil, nil
		}
	}
	toks, left, missing, err := s.HeldTokens(ctx, owner, ns, ids, margin)
	if err != nil || len(missing) > 0 {
		return 0, missing, err
	}
	copy(tokens, toks)
	return left, nil, nil
}

// heldCached answers HeldTokens for one id from the cache alone, under the
// same trust rule as holds: a generation this Store wrote, owned by owner,
// whose lease surely outlasts margin, confirmed within CacheTrust. false
// means "ask the long way", never "not held".
func (s *Store) heldCached(owner Owner, ns namespace.Namespace, id docid.ID, margin time.Duration, token *int64) (time.Duration, bool) {
	return s.heldCachedMemo(&owner, ns, id, margin, token, nil)
}

// heldCachedMemo is heldCached, filling memo (when not nil) with what it
// answered from and the cache's generation it read it at.
func (s *Store) heldCachedMemo(owner *Owner, ns namespace.Namespace, id docid.ID, margin time.Duration, token *int64, memo *HeldMemo) (time.Duration, bool) {
	key := id.Key()
	if ns.IsZero() || len(key) > maxPlainKey || strings.IndexByte(ns.String(), 0) >= 0 {
		return 0, false
	}
	var buf [192]byte
	rid := append(buf[:0], ns.String()...)
	rid = append(rid, keySeparator...)
	const digits = "0123456789abcdef" // as recordID spells it
	for i := 0; i < len(key); i++ {
		rid = append(rid, digits[key[i]>>4], digits[key[i]&0x0f])
	}
	s.cache.mu.Lock()
	e, ok := s.cache.m[string(rid)]
	gen := s.cache.gen.Load() // changed under mu only: e's
	s.cache.mu.Unlock()
	if !ok {
		return 0, false
	}
	now, unc, local := s.nowLocal()
	if !e.g.ownedBy(*owner) || !e.g.ExpiresAt.After(now.Add(unc+margin)) || e.g.Via != s.via ||
		local.Sub(e.confirmed) > s.cfg.CacheTrust {
		return 0, false
	}
	*token = e.g.Token
	if memo != nil {
		memo.Fill(&s.cache.gen, gen, owner, ns, key, e.g.ExpiresAt, e.g.Token, e.confirmed, s.epoch)
	}
	return e.g.ExpiresAt.Add(-unc).Sub(now), true
}

// monotonicEstimate is the store's own server-clock estimate when a
// cached check can read it on the monotonic clock alone
// (serverClock.monotonicEstimate); nil with an injected clock.
func (s *Store) monotonicEstimate() *clockEstimate {
	if s.sclock == nil || s.clock != Clock(s.sclock) {
		return nil
	}
	return s.sclock.monotonicEstimate()
}

// nowLocal is s.clock.Now and the local time.Now of the same instant.
// With the store's own server-clock estimate, whose local clock is
// time.Now, one reading serves both: a cached lock check reads the clock
// once, not twice. An injected clock is read apart from the local one.
func (s *Store) nowLocal() (now time.Time, unc time.Duration, local time.Time) {
	if s.sclock != nil && s.clock == Clock(s.sclock) {
		local = time.Now()
		now, unc = s.sclock.nowAt(local)
		return now, unc, local
	}
	// The local reading after the injected clock's, as before: the
	// cache's trust window is never measured short.
	now, unc = s.clock.Now()
	return now, unc, time.Now()
}
