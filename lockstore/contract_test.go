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

// TestContract runs the lock store contract against the real Store on the
// embedded FerretDB; memstore's TestContract runs the same against the
// in-memory store the guard's fast tests use.
func TestContract(t *testing.T) {
	lockstoretest.Run(t, func(t *testing.T, clock *lockstoretest.Clock) lockstoretest.Store {
		s, err := lockstore.Open(context.Background(), lockstore.Config{
			URI:          lockstore.EmbeddedURI(),
			Database:     "lockgate_test",
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
