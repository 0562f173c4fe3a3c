package lockstore

import (
	"sync"
	"time"
)

// ownedIndex is each session's locks taken or renewed through this Store,
// with their lease ends: it bounds the locks one session may hold
// (Config.MaxLocksPerSession) without a round trip, and lets ReleaseSession
// start from what it knows. It is per instance: a session that takes locks
// through several proxies is bounded on each. Entries leave on release,
// rollback, session end, or when their lease has ended.
type ownedIndex struct {
	mu sync.Mutex
	m  map[string]map[string]time.Time // session -> rid -> lease end
}

func newOwnedIndex() *ownedIndex { return &ownedIndex{m: map[string]map[string]time.Time{}} }

// changed records the transition of rid from prev to next (either may be
// nil): the new holder gains it, the previous one loses it.
func (o *ownedIndex) changed(rid string, prev, next *gen) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev != nil && prev.Owner != nil && (next == nil || next.Owner == nil || string(next.Owner.Data) != string(prev.Owner.Data)) {
		o.removeLocked(string(prev.Owner.Data), rid)
	}
	if next != nil && next.Owner != nil {
		s := string(next.Owner.Data)
		rids := o.m[s]
		if rids == nil {
			rids = map[string]time.Time{}
			o.m[s] = rids
		}
		rids[rid] = next.ExpiresAt
	}
}

func (o *ownedIndex) removeLocked(session, rid string) {
	if rids := o.m[session]; rids != nil {
		delete(rids, rid)
		if len(rids) == 0 {
			delete(o.m, session)
		}
	}
}

// count returns how many locks session holds with a lease ending after
// now, and how many of rids are not among them; expired entries are dropped
// on the way, so the cost is the session's own locks.
func (o *ownedIndex) count(session []byte, rids []string, now time.Time) (held, fresh int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.m[string(session)]
	for rid, exp := range m {
		if !exp.After(now) {
			delete(m, rid)
		}
	}
	if len(m) == 0 {
		delete(o.m, string(session))
	}
	for _, rid := range rids {
		if _, ok := m[rid]; !ok {
			fresh++
		}
	}
	return len(m), fresh
}

// has reports whether session took or renewed rid through this Store with
// a lease ending after now, as far as this Store has seen.
func (o *ownedIndex) has(session []byte, rid string, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	exp, ok := o.m[string(session)][rid]
	return ok && exp.After(now)
}

// list returns the keys of session's locks; the transitions that free
// them remove them.
func (o *ownedIndex) list(session []byte) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.m[string(session)]
	rids := make([]string, 0, len(m))
	for rid := range m {
		rids = append(rids, rid)
	}
	return rids
}

// prune drops every entry whose lease ended before now.
func (o *ownedIndex) prune(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s, m := range o.m {
		for rid, exp := range m {
			if !exp.After(now) {
				delete(m, rid)
			}
		}
		if len(m) == 0 {
			delete(o.m, s)
		}
	}
}
