package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestSessionEndOverAMovedBackHead: as TestReleaseAllOverAMovedBackHead,
// a's renewal lands last and moves the key's head back over b's acquire,
// so the head shows a's renewed hold while the claims say the key is b's.
// When b's session ends (endSessions), the key must be freed, whichever
// store the session ends through: through the store b took it through,
// from that store's owned index; through another, by the background
// sweep of ended sessions, which found the keys from the head documents
// that name the session alone, so the key stayed b's until b's lease
// ended (here a minute; liveness, not safety).
func TestSessionEndOverAMovedBackHead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		through int // the store b's session ends through
	}{{"through the store b acquired through", 1}, {"through a store that never saw b", 2}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, b, other, key := movedBackHead(t)
			const ns = "db.c"

			if _, err := s[c.through].ReleaseSession(bg, b.Session); err != nil {
				t.Fatalf("b's session end: %v", err)
			}
			testkit.Eventually(t, time.Minute, "the sweep of b's ended session", s[c.through].sweeper.idle)
			if _, err := s[2].Acquire(bg, other, namespace.Of(ns), ids(t, "also b's"), time.Minute, 0); err != nil {
				t.Errorf("after b's session ended its other lock is still held: %v", err)
			}
			if _, err := s[2].Acquire(bg, other, namespace.Of(ns), key, time.Minute, 0); err != nil {
				t.Errorf("after b's session ended the key whose head shows a's renewal is still held: %v", err)
			}
		})
	}
}
