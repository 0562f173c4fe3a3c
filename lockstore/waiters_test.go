package lockstore

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// Waiters lists who waits for a lock on this Store, in arrival order, with
// the same identity fields a holder shows and since when (issue 26, item
// 10: the console shows waiters, not only their count); none once they
// are gone.
func TestWaitersListsQueuedAcquires(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := rv(t, 42)
	holder, first, second := newOwner("holder"), newOwner("first"), newOwner("second")
	if _, err := s.Acquire(ctx, holder, namespace.Of("shop.orders"), ids(t, 42), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	wait := func(o Owner, n int) {
		go func() {
			_, err := s.Acquire(ctx, o, namespace.Of("shop.orders"), ids(t, 42), time.Minute, time.Minute)
			done <- err
		}()
		testkit.Eventually(t, 20*time.Second, o.App+" to queue", func() bool { return s.Waiting(namespace.Of("shop.orders"), id) == n })
	}
	wait(first, 1)
	wait(second, 2)
	ws := s.Waiters(namespace.Of("shop.orders"), id)
	if len(ws) != 2 || ws[0].App != "first" || ws[1].App != "second" || ws[0].Client != "127.0.0.1:1" ||
		ws[0].SessionPrefix != SessionPrefix(first.Session) || ws[0].Since.IsZero() || ws[1].Since.Before(ws[0].Since) {
		t.Fatalf("Waiters = %+v, want first then second, with client, holder tag and since", ws)
	}
	if got := s.Waiters(namespace.Of("shop.orders"), rv(t, 43)); len(got) != 0 {
		t.Errorf("Waiters of a lock nobody waits for = %+v", got)
	}
	if _, err := s.Release(ctx, holder, namespace.Of("shop.orders"), ids(t, 42), ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := s.Waiters(namespace.Of("shop.orders"), id); len(got) != 1 || got[0].App != "second" {
		t.Errorf("after the first waiter got the lock: Waiters = %+v, want second alone", got)
	}
	cancel()
	<-done
}
