package lockstore

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// holdEntry is what this instance knows about a lock key: the head
// generation it last wrote or read.
type holdEntry struct {
	g        *gen      // immutable
	verified time.Time // local time of that write or read
	// confirmed is a local time before which no newer generation's head
	// document was written (zero: never shown): taken before the write of
	// g was sent, or before a read of the head document that found g.
	confirmed time.Time
	own       bool // held through this Store (acquired or renewed here)
}

// holdCache remembers locks written or verified through this Store so that
// Holds can answer without a round trip. It may only err on the side of
// "not known": entries are dropped on every release, force-release and
// session release through this Store, and Holds trusts one only for a
// generation this Store wrote itself, while its lease (minus margin and
// clock uncertainty) lasts, and for Config.CacheTrust after it was last
// confirmed. A change through another Store either comes after that or
// waits for it (Store.quiesce). Safe for concurrent use.
type holdCache struct {
	mu sync.Mutex
	// gen counts the changes to m (under mu), so that a caller's memo of
	// an entry (HeldMemo) is trusted only while none was made.
	gen  atomic.Uint64
	m    map[string]holdEntry
	own  int
	held prometheus.Gauge
}

func newHoldCache(held prometheus.Gauge) *holdCache {
	return &holdCache{m: make(map[string]holdEntry), held: held}
}

func (c *holdCache) put(rid string, e holdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(rid, e)
}

// putUnlessNewer is put, unless the entry of rid is a later generation
// of the key verified after since: the writer of e sent it at since, and
// a change made after that through this Store, whose head write finished
// first, must not be undone in the cache by e's.
func (c *holdCache) putUnlessNewer(rid string, e holdEntry, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[rid]; ok && old.g.Seq > e.g.Seq && old.verified.After(since) {
		return
	}
	c.putLocked(rid, e)
}

func (c *holdCache) putLocked(rid string, e holdEntry) {
	if old, ok := c.m[rid]; ok && old.own {
		c.own--
	}
	if old, ok := c.m[rid]; ok && old.own && e.g.Owner != nil && old.g.Owner != nil &&
		string(old.g.Owner.Data) == string(e.g.Owner.Data) && old.g.Token == e.g.Token {
		e.own = true // a DB verification of our own lock stays ours
	}
	if e.g.Owner == nil {
		e.own = false
	}
	c.gen.Add(1)
	c.m[rid] = e
	if e.own {
		c.own++
	}
	c.held.Set(float64(c.own))
}

func (c *holdCache) get(rid string) (holdEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[rid]
	return e, ok
}

func (c *holdCache) removeLocked(rid string) {
	if old, ok := c.m[rid]; ok {
		if old.own {
			c.own--
		}
		c.gen.Add(1)
		delete(c.m, rid)
	}
}

// remove drops the entries of rids.
func (c *holdCache) remove(rids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rid := range rids {
		c.removeLocked(rid)
	}
	c.held.Set(float64(c.own))
}

// removeSession drops every entry of a session and returns their keys.
func (c *holdCache) removeSession(session []byte) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rids []string
	for rid, e := range c.m {
		if e.g.Owner != nil && string(e.g.Owner.Data) == string(session) {
			rids = append(rids, rid)
			c.removeLocked(rid)
		}
	}
	c.held.Set(float64(c.own))
	return rids
}

// prune drops entries whose lease ended before serverNow, and entries not
// held through this Store that are older than maxAge (local time); it
// returns the dropped entries held through this Store whose lease ended
// (the expiry scan's).
func (c *holdCache) prune(serverNow time.Time, maxAge time.Duration) (ended []holdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	local := time.Now()
	for rid, e := range c.m {
		expired := e.g.Owner != nil && !e.g.ExpiresAt.After(serverNow)
		if expired && e.own {
			ended = append(ended, e)
		}
		if expired || (!e.own && local.Sub(e.verified) > maxAge) {
			c.removeLocked(rid)
		}
	}
	c.held.Set(float64(c.own))
	return ended
}

// ownGens are the generations of entries written by the Store via.
func ownGens(es []holdEntry, via string) []*gen {
	var out []*gen
	for _, e := range es {
		if e.g.Via == via {
			out = append(out, e.g)
		}
	}
	return out
}

// staleAll makes every entry need a database read before it is trusted.
func (c *holdCache) staleAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.Add(1)
	for rid, e := range c.m {
		e.verified, e.confirmed = time.Time{}, time.Time{}
		c.m[rid] = e
	}
}

// ownHeld returns the generation of every entry that names a holder, was
// written by the Store via and was verified after since, for the
// background confirmation.
func (c *holdCache) ownHeld(via string, since time.Time) map[string]*gen {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]*gen, len(c.m))
	for rid, e := range c.m {
		if e.g.Owner != nil && e.g.Via == via && e.verified.After(since) {
			out[rid] = e.g
		}
	}
	return out
}

// confirm records that seen, still the entry of rid, was the key's newest
// generation at local time at.
func (c *holdCache) confirm(rid string, seen *gen, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.m[rid]; ok && cur.g == seen && at.After(cur.confirmed) {
		cur.confirmed, cur.verified = at, at
		c.gen.Add(1)
		c.m[rid] = cur
	}
}

// refresh replaces the entry of rid with fresh, read from the database at
// verified, but only if the entry is still the generation seen before the
// read: a release or acquire through this Store in between wins, so a
// refresh can never resurrect a lock released meanwhile. fresh nil drops
// the entry.
func (c *holdCache) refresh(rid string, seen, fresh *gen, verified time.Time) {
	c.mu.Lock()
	cur, ok := c.m[rid]
	if !ok || cur.g != seen {
		c.mu.Unlock()
		return
	}
	if fresh == nil {
		c.removeLocked(rid)
		c.held.Set(float64(c.own))
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.put(rid, holdEntry{g: fresh, verified: verified})
}
