package lockstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
)

var contractSeq atomic.Int64

// testDB names a database of its own for a Store of one test (or one
// group of Stores that share a collection): FerretDB keeps each database
// in one SQLite file, which takes one writer at a time, so tests running
// at once on one database wait on each other's writes.
func testDB() string { return fmt.Sprintf("lockstore_x%d", contractSeq.Add(1)) }

// TestContract runs the lock store contract against the real Store on the
// embedded FerretDB; memstore's TestContract runs the same against the
// in-memory store the guard's fast tests use.
func TestContract(t *testing.T) {
	t.Parallel()
	lockstoretest.Run(t, func(t *testing.T, clock *lockstoretest.Clock) lockstoretest.Store {
		s, err := lockstore.Open(context.Background(), lockstore.Config{
			URI:          lockstore.EmbeddedURI(),
			Database:     testDB(),
			Collection:   fmt.Sprintf("locks_contract_%d", contractSeq.Add(1)),
			DefaultLease: lockstoretest.DefaultLease,
			MaxLease:     lockstoretest.MaxLease,
			OpTimeout:    20 * time.Second,
			CleanupAfter: 5 * time.Minute,
		}, lockstore.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	})
}
