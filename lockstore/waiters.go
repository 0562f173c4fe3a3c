package lockstore

import (
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// Waiting reports how many Acquire calls on this Store are queued for the
// lock on (ns, id): the waiters an operator console shows next to a held
// lock. Waiters on other lockgate instances are not counted.
func (s *Store) Waiting(ns namespace.Namespace, id docid.ID) int {
	if id.IsZero() {
		return 0
	}
	return s.wq.waiting(recordID(ns, id.Key()))
}

// Waiter is one Acquire call queued on this Store, as an operator sees it:
// who waits (the same fields as a Holder) and since when, on the lock store
// server's clock as this Store estimates it.
type Waiter struct {
	App           string
	Client        string
	User          string
	SessionPrefix string // the holder tag it will hold under, not the session id
	Since         time.Time
}

func waiterOf(o Owner, c Clock) Waiter {
	now, _ := c.Now()
	return Waiter{App: o.App, Client: o.Client, User: o.User, SessionPrefix: SessionPrefix(o.Session), Since: now}
}

// Waiters lists the Acquire calls on this Store queued for the lock on
// (ns, id), in arrival order: a read-only copy for the operator console.
// Waiters on other lockgate instances are not listed.
func (s *Store) Waiters(ns namespace.Namespace, id docid.ID) []Waiter {
	if id.IsZero() {
		return nil
	}
	return s.wq.list(recordID(ns, id.Key()))
}

// ServerNow is the lock store server's time as this Store estimates it
// (docs/LOCKS.md, "Leases and clocks"), and the estimate's uncertainty:
// what a lease's time left is measured against.
func (s *Store) ServerNow() (time.Time, time.Duration) { return s.clock.Now() }
