package lockstore

import (
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// Waiting reports how many Acquire calls on this Store are queued for the
// lock on (ns, id): the waiters an operator console shows next to a held
// lock. Waiters on other lockgate instances are not counted. An _id that
// cannot be a lock key has none.
func (s *Store) Waiting(ns string, id bson.RawValue) int {
	ck, err := canonicalID(id)
	if err != nil {
		return 0
	}
	return s.wq.waiting(recordID(ns, ck))
}

// ServerNow is the lock store server's time as this Store estimates it
// (docs/LOCKS.md, "Leases and clocks"), and the estimate's uncertainty:
// what a lease's time left is measured against.
func (s *Store) ServerNow() (time.Time, time.Duration) { return s.clock.Now() }
