package lockstore

import (
	"testing"
	"time"
)

// TestHeldNamespacesKeepMarksARefreshMissed: a refresh is a query sent at
// one time and applied when its answer arrives. A lock granted through
// this Store in between may have landed after the query ran, so the
// answer does not list its namespace; applying it must not erase the
// grant's mark, or inserts into that namespace skip their check until the
// next refresh. A mark older than the refresh's sending is the refresh's
// to confirm or drop.
func TestHeldNamespacesKeepMarksARefreshMissed(t *testing.T) {
	h := heldNamespaces{trust: time.Hour}
	t0 := time.Now()
	h.set(map[string]bool{}, t0)
	if h.mayHold("shop.orders", t0) {
		t.Fatal("an empty fresh view says a lock may be held")
	}
	sent := t0.Add(time.Millisecond)                  // the refresh's query leaves
	h.mark("shop.orders", sent.Add(time.Millisecond)) // a grant lands meanwhile
	h.set(map[string]bool{}, sent)                    // the answer: it ran before the grant
	if !h.mayHold("shop.orders", sent.Add(2*time.Millisecond)) {
		t.Fatal("a refresh sent before a grant landed erased the grant's mark: an insert into the locked namespace skips its check")
	}
	// A refresh sent after the mark decides: the lock was released.
	h.set(map[string]bool{}, sent.Add(3*time.Millisecond))
	if h.mayHold("shop.orders", sent.Add(4*time.Millisecond)) {
		t.Fatal("a mark outlived a refresh sent after it")
	}
	if len(h.marked) != 0 {
		t.Fatalf("marks kept after a later refresh: %v", h.marked)
	}
}
