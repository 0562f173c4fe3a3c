package lockstore

import (
	"time"

	"github.com/lockgate/lockgate/docid"
)

// Waiting reports how many Acquire calls on this Store are queued for the
// lock on (ns, id): the waiters an operator console shows next to a held
// lock. Waiters on other lockgate instances are not counted.
func (s *Store) Waiting(ns string, id docid.ID) int {
	if id.IsZero() {
		return 0
	}
	return s.wq.waiting(recordID(ns, id.Key()))
}

// ServerNow is the lock store server's time as this Store estimates it
// (docs/LOCKS.md, "Leases and clocks"), and the estimate's uncertainty:
// what a lease's time left is measured against.
func (s *Store) ServerNow() (time.Time, time.Duration) { return s.clock.Now() }
