package lockstore

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// holdEntry is what this instance knows about a lock record.
type holdEntry struct {
	session   string // owner session bytes
	bind      string
	token     int64
	expiresAt time.Time // server time
	verified  time.Time // local time of the last write or read of the record
	own       bool      // acquired through this Store
}

// holdCache remembers locks written or verified through this Store so that
// Holds can answer without a round trip. It may only err on the side of
// "not known": entries are dropped on every release, force-release and
// session release through this Store, are trusted only while their lease
// (minus margin and clock uncertainty) lasts, and only for
// Config.CacheTrust after they were last verified. Safe for concurrent use.
type holdCache struct {
	mu   sync.Mutex
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
	if old, ok := c.m[rid]; ok && old.own {
		c.own--
	}
	if old, ok := c.m[rid]; ok && old.own && old.session == e.session && old.bind == e.bind && old.token == e.token {
		e.own = true // a DB verification of our own lock stays ours
	}
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
		if e.session == string(session) {
			rids = append(rids, rid)
			c.removeLocked(rid)
		}
	}
	c.held.Set(float64(c.own))
	return rids
}

// prune drops entries whose lease ended before serverNow.
func (c *holdCache) prune(serverNow time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for rid, e := range c.m {
		if !e.expiresAt.After(serverNow) {
			c.removeLocked(rid)
		}
	}
	c.held.Set(float64(c.own))
}

// staleAll makes every entry need a database read before it is trusted.
func (c *holdCache) staleAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for rid, e := range c.m {
		e.verified = time.Time{}
		c.m[rid] = e
	}
}
