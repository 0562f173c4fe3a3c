package audittrail

import (
	"runtime"
	"sync"
	"testing"
)

// Every item put by concurrent producers comes out once, each producer's
// in its order, while the consumer takes and frees slots lap after lap;
// a put into a full ring fails at once and loses nothing else.
func TestRingConcurrentProducers(t *testing.T) {
	const producers, each = 4, 5000
	r := newRing(64)
	var wg sync.WaitGroup
	var refused [producers]int
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				ev := Event{Count: uint64(p*each + i)}
				if r.put(&ev, nil) {
					i++
				} else {
					refused[p]++
					runtime.Gosched()
				}
			}
		}()
	}
	next := make([]int, producers)
	got := 0
	stop := make(chan struct{})
	go func() { wg.Wait(); close(stop) }()
	var batch []item
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		batch = r.take(batch[:0], 16)
		if done {
			for r.len() > 0 { // every producer has published
				batch = r.take(batch, len(batch)+16)
			}
		}
		for _, it := range batch {
			n := int(it.ev.Count)
			p, i := n/each, n%each
			if i != next[p] {
				t.Fatalf("producer %d: item %d came when %d was due", p, i, next[p])
			}
			next[p]++
			got++
		}
	}
	if got != producers*each || r.len() != 0 {
		t.Fatalf("took %d of %d, %d left", got, producers*each, r.len())
	}
	t.Logf("puts refused on a full ring: %v", refused)
}
