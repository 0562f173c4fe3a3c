package guard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

// TestCollationReadsCoalesce: the writers of one collection that find its
// cached collation missing or run out at the same moment share one
// listCollections. The upstream's answer is held back until all of them
// are waiting, so that without the shared read each would have sent its
// own by then.
func TestCollationReadsCoalesce(t *testing.T) {
	const writers = 16
	release := make(chan struct{})
	var sent atomic.Int32
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "listCollections" {
			sent.Add(1)
			<-release
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)).SetMonitor(monitor).SetMaxPoolSize(writers+2))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	coll := fmt.Sprintf("coalesce%d", time.Now().UnixNano())
	ns := namespace.Of("guardtest." + coll)
	if _, err := client.Database("guardtest").Collection(coll).InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	r := NewResolver(client)
	var arrived atomic.Int32
	r.testHookRead = func() { arrived.Add(1) }
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			simple, err := r.SimpleCollation(ctx, ns)
			if err == nil && !simple {
				t.Errorf("a collection created without a collation read as not simple")
			}
			errs <- err
		}()
	}
	testkit.Eventually(t, 30*time.Second, "every writer to wait for the collation", func() bool { return arrived.Load() == writers })
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d writers needing one collection's collation at once sent %d listCollections, want 1", writers, n)
	}
	// Cached now: no read at all.
	if _, err := r.SimpleCollation(ctx, ns); err != nil || sent.Load() != 1 {
		t.Errorf("a cached collation was read again (%d reads, %v)", sent.Load(), err)
	}
}

// TestCollationReadOutlivesItsFirstCaller: the deadline of the writer whose
// read the others joined passes; they still get the answer, not its
// deadline's error.
func TestCollationReadOutlivesItsFirstCaller(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "listCollections" {
			started <- struct{}{}
			<-release
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI(upstreamURI(t)).SetMonitor(monitor))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	r := NewResolver(client)
	ns := namespace.Of(fmt.Sprintf("guardtest.outlives%d", time.Now().UnixNano()))
	var arrived atomic.Int32
	r.testHookRead = func() { arrived.Add(1) }
	// The first writer's request carries a short deadline of its own,
	// which passes while the read is held back: the shared read must not
	// inherit it.
	firstCtx, cancelFirst := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelFirst()
	first := make(chan error, 1)
	go func() { _, err := r.SimpleCollation(firstCtx, ns); first <- err }()
	<-started
	second := make(chan error, 1)
	go func() { _, err := r.SimpleCollation(ctx, ns); second <- err }()
	testkit.Eventually(t, 30*time.Second, "the second writer to wait for the read", func() bool { return arrived.Load() == 2 })
	select {
	case err := <-first:
		if err == nil {
			t.Errorf("the first writer got an answer after its deadline")
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the first writer still waited for the read past its deadline")
	}
	close(release)
	if err := <-second; err != nil {
		t.Errorf("the first writer's deadline failed the second's read: %v", err)
	}
}
