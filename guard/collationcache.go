package guard

import (
	"sync"
	"sync/atomic"
)

// collationCache is the resolver's collation answers by namespace, read on
// every enforced write of a string _id and written once per namespace
// every collationTTL. A reader takes no lock and writes no memory: an LRU
// took a mutex and rewrote its list on every read, lines that the two
// cores then passed back and forth (5 L1d misses and about 140
// instructions a write through the proxy, docs/BENCHMARKS.md, h16-proxy).
// Its bound is a count, not an order: past maxCollations namespaces the
// cache starts empty again, which costs each namespace one read.
type collationCache struct {
	// m is replaced whole, under mu, when a namespace is added; an
	// entry's answer is replaced in place.
	m  atomic.Pointer[map[string]*atomic.Pointer[collationEntry]]
	mu sync.Mutex
}

// maxCollations bounds the namespaces whose collation is kept.
const maxCollations = 4096

func (c *collationCache) get(ns string) (collationEntry, bool) {
	if m := c.m.Load(); m != nil {
		if p := (*m)[ns]; p != nil {
			return *p.Load(), true
		}
	}
	return collationEntry{}, false
}

func (c *collationCache) put(ns string, e collationEntry) {
	if m := c.m.Load(); m != nil {
		if p := (*m)[ns]; p != nil {
			p.Store(&e)
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if p := (*old)[ns]; p != nil {
			p.Store(&e)
			return
		}
	}
	n := 0
	if old != nil && len(*old) < maxCollations {
		n = len(*old)
	}
	m := make(map[string]*atomic.Pointer[collationEntry], n+1)
	if n > 0 {
		for k, v := range *old {
			m[k] = v
		}
	}
	p := new(atomic.Pointer[collationEntry])
	p.Store(&e)
	m[ns] = p
	c.m.Store(&m)
}
