package memstore_test

import (
	"testing"

	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
)

// TestContract runs the lock store contract against the in-memory store;
// lockstore's TestContract runs the same against the real one.
func TestContract(t *testing.T) {
	lockstoretest.Run(t, func(t *testing.T, clock *lockstoretest.Clock) lockstoretest.Store {
		return memstore.New(memstore.Config{DefaultLease: lockstoretest.DefaultLease, MaxLease: lockstoretest.MaxLease, Clock: clock})
	})
}
