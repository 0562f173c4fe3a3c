package lockstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// wakePair opens two Stores on one lock collection; with wake, each
// listens for wake-up datagrams on loopback.
func wakePair(t testing.TB, wake bool, minPoll, maxPoll time.Duration) (*Store, *Store) {
	t.Helper()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.MinPoll, cfg.MaxPoll = minPoll, maxPoll
	if wake {
		cfg.WakeListen = "127.0.0.1:0"
	}
	s1 := openStore(t, cfg)
	s2 := openStore(t, cfg)
	if wake {
		// Each must know the other's address before the test relies on
		// it: the heartbeat reads them every second.
		testkit.Eventually(t, 20*time.Second, "the wake-up peers to see each other", func() bool { return s1.wake.Load().peerCount() > 0 && s2.wake.Load().peerCount() > 0 })
	}
	return s1, s2
}

func (w *waker) peerCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.peers)
}

func (w *waker) interested(rid string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.interest[rid]) > 0
}

// TestWakeAcrossStores: with polling slowed down to one try per 30 s or
// more, a waiter on one Store gets a lock released through another only
// because the release's datagram woke it; without datagrams the same wait
// runs out.
func TestWakeAcrossStores(t *testing.T) {
	t.Parallel()
	for _, wake := range []bool{false, true} {
		name := "poll only"
		if wake {
			name = "datagram"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case on a pair of Stores of its own
			s1, s2 := wakePair(t, wake, time.Minute, time.Minute)
			ctx := context.Background()
			a, b := newOwner("holder"), newOwner("waiter")
			key := ids(t, "k")
			if _, err := s1.Acquire(ctx, a, namespace.Of("db.c"), key, 5*time.Minute, 0); err != nil {
				t.Fatal(err)
			}
			wait := 3 * time.Second
			if wake {
				wait = 20 * time.Second
			}
			got := make(chan error, 1)
			go func() {
				_, err := s2.Acquire(ctx, b, namespace.Of("db.c"), key, time.Minute, wait)
				got <- err
			}()
			rid := recordID(namespace.Of("db.c"), key[0].Key())
			if wake {
				testkit.Eventually(t, 20*time.Second, "the waiter to register its interest", func() bool { return s1.wake.Load().interested(rid) })
			} else {
				testkit.Eventually(t, 20*time.Second, "the waiter to find the key held", func() bool { return s2.wq.blockedWaiter(rid) })
			}
			if _, err := s1.Release(ctx, a, namespace.Of("db.c"), key, ""); err != nil {
				t.Fatal(err)
			}
			err := <-got
			switch {
			case wake && err != nil:
				t.Fatalf("waiter not woken by the release's datagram: %v", err)
			case !wake && !errors.Is(err, ErrTimeout):
				t.Fatalf("without datagrams the waiter should have waited out its %v (poll every 30 s or more): %v", wait, err)
			}
		})
	}
}

// BenchmarkWakeAcrossStores measures the time from a release through one
// Store returning to the acquire of a waiter on another Store returning,
// after a hold of 100 ms, with the default polling (5 to 50 ms) and with
// datagrams, in one run;
// it reports the p50 of each as a metric.
//
//	go test ./lockstore -run '^$' -bench WakeAcrossStores -benchtime 100x
func BenchmarkWakeAcrossStores(b *testing.B) {
	for _, wake := range []bool{false, true} {
		name := "poll"
		if wake {
			name = "datagram"
		}
		b.Run(name, func(b *testing.B) {
			s1, s2 := wakePair(b, wake, DefaultMinPoll, DefaultMaxPoll)
			ctx := context.Background()
			a, w := newOwner("holder"), newOwner("waiter")
			id := ids(b, "bench")
			rid := recordID(namespace.Of("db.c"), id[0].Key())
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				if _, err := s1.Acquire(ctx, a, namespace.Of("db.c"), id, time.Minute, 5*time.Second); err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				errs := make(chan error, 1)
				go func() {
					_, err := s2.Acquire(ctx, w, namespace.Of("db.c"), id, time.Minute, 10*time.Second)
					got <- time.Now()
					errs <- err
				}()
				// Released once the waiter has found the key held (and,
				// with datagrams, said so).
				testkit.Eventually(b, 20*time.Second, "the waiter to find the key held", func() bool {
					if wake {
						return s1.wake.Load().interested(rid)
					}
					return s2.wq.blockedWaiter(rid)
				})
				// A hold of 100 ms, so that the poll has backed off as it
				// does under a real holder's read-modify-write.
				time.Sleep(100 * time.Millisecond)
				if _, err := s1.Release(ctx, a, namespace.Of("db.c"), id, ""); err != nil {
					b.Fatal(err)
				}
				released := time.Now()
				at := <-got
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				samples = append(samples, at.Sub(released))
				if _, err := s2.Release(ctx, w, namespace.Of("db.c"), id, ""); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(samples[len(samples)*9/10].Microseconds())/1000, "p90-ms")
		})
	}
}

// blockedWaiter reports whether a waiter of rid has tried and found it held.
func (wq *waitQueues) blockedWaiter(rid string) bool {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	for _, w := range wq.q[rid] {
		if w.blockedOn == rid {
			return true
		}
	}
	return false
}
