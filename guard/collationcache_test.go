package guard

import (
	"fmt"
	"sync"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// TestCollationCacheBoundAndAnswers: an answer put is the one got, a
// refresh replaces it, and past maxCollations namespaces the cache starts
// again rather than growing with every namespace a client names.
func TestCollationCacheBoundAndAnswers(t *testing.T) {
	if raceEnabled {
		// One goroutine filling the cache past its bound: nothing for the
		// detector to check (TestCollationCacheConcurrent is its test),
		// and it ran about three times the CPU under it (docs/TESTING.md,
		// thirteenth round). go test ./... runs it.
		t.Skip("no concurrency to check; runs without the race detector")
	}
	var c collationCache
	if _, ok := c.get("db.c"); ok {
		t.Fatal("an empty cache had an answer")
	}
	at := time.Unix(100, 0)
	c.put("db.c", collationEntry{simple: true, exists: true, at: at})
	c.put("db.c", collationEntry{simple: false, exists: true, capped: true, at: at.Add(time.Second)})
	if e, ok := c.get("db.c"); !ok || e.simple || !e.capped || !e.at.Equal(at.Add(time.Second)) {
		t.Fatalf("after a refresh got %+v %v, want the refreshed answer", e, ok)
	}
	for i := range maxCollations + 10 {
		c.put(fmt.Sprintf("db.c%d", i), collationEntry{exists: true})
		if n := len(*c.m.Load()); n > maxCollations {
			t.Fatalf("%d namespaces kept, bound %d", n, maxCollations)
		}
	}
	if e, ok := c.get(fmt.Sprintf("db.c%d", maxCollations+9)); !ok || !e.exists {
		t.Fatal("the latest namespace's answer is not kept")
	}
}

// TestCollationCacheConcurrent: readers and writers of the same and of new
// namespaces at once (run under -race by scripts/test.sh).
func TestCollationCacheConcurrent(t *testing.T) {
	var c collationCache
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				c.put(fmt.Sprintf("db.c%d", i%50), collationEntry{simple: true, exists: true, at: time.Unix(int64(w), 0)})
			}
		}()
		go func() {
			defer wg.Done()
			for i := range 2000 {
				if e, ok := c.get(fmt.Sprintf("db.c%d", i%50)); ok && (!e.simple || !e.exists) {
					t.Errorf("a torn answer: %+v", e)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkCollationCacheGet: a cached answer read by every enforced
// write, from both cores at once, against the LRU it replaced (whose Get
// takes a mutex and moves the entry to its list's front).
func BenchmarkCollationCacheGet(b *testing.B) {
	const ns = "shop.orders"
	e := collationEntry{simple: true, exists: true, at: time.Now()}
	b.Run("lru", func(b *testing.B) {
		l, _ := lru.New[string, collationEntry](maxCollations)
		for i := range 100 {
			l.Add(fmt.Sprintf("shop.c%d", i), e)
		}
		l.Add(ns, e)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, ok := l.Get(ns); !ok {
					b.Fatal("no answer")
				}
			}
		})
	})
	b.Run("cache", func(b *testing.B) {
		var c collationCache
		for i := range 100 {
			c.put(fmt.Sprintf("shop.c%d", i), e)
		}
		c.put(ns, e)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, ok := c.get(ns); !ok {
					b.Fatal("no answer")
				}
			}
		})
	})
}
