package guard

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// stallingResolver holds every resolution of a filter on "slow" until its
// context ends, as a filter the database cannot answer quickly does, and
// counts the resolutions it is asked for.
type stallingResolver struct {
	Resolver
	calls   *atomic.Int64
	stalled chan struct{} // receives once per stalled resolution
}

func (r stallingResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	r.calls.Add(1)
	if _, err := filter.LookupErr("slow"); err == nil {
		r.stalled <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return r.Resolver.Candidates(ctx, ns, filter, collation, hint, limit)
}

// TestSlowFiltersCannotStarveOthers is issue 12's resolver flood, reduced
// to its mechanism: one resolver slot, held by a write whose filter the
// database cannot answer in time. A second slow-filter write waits for the
// slot only up to the resolve timeout and is refused saying why; a
// lock-holding client's _id write needs no resolution and goes through
// while the slot is held; an audited write does not queue for the slot.
func TestSlowFiltersCannotStarveOthers(t *testing.T) {
	coll, pol := protected(t, 3)
	var calls atomic.Int64
	stalled := make(chan struct{}, 4)
	st := startStackWith(t, stackOptions{policy: pol, maxResolves: 1, resolveTimeout: 1500 * time.Millisecond,
		resolver: func(r Resolver) Resolver { return stallingResolver{r, &calls, stalled} }})

	flood := connect(t, st.uri, "flood")
	fs := session(t, flood)
	first := make(chan error, 1)
	go func() {
		_, err := flood.Database("shop").Collection(coll).UpdateMany(inSession(fs), bson.D{{"slow", true}}, bson.D{{"$set", bson.D{{"x", 1}}}})
		first <- err
	}()
	<-stalled // the only slot is now held
	// A second flooder queues for the slot, within the same deadline.
	second := make(chan error, 1)
	flood2 := connect(t, st.uri, "flood2")
	fs2 := session(t, flood2)
	go func() {
		_, err := flood2.Database("shop").Collection(coll).DeleteMany(inSession(fs2), bson.D{{"slow", true}})
		second <- err
	}()

	// The well-behaved client: lock, write by _id, while the slot is held.
	good := connect(t, st.uri, "good")
	gs := session(t, good)
	acquire(t, good, gs, coll, 1)
	if _, err := good.Database("shop").Collection(coll).UpdateOne(inSession(gs), bson.D{{"_id", 1}}, bson.D{{"$inc", bson.D{{"qty", 1}}}}); err != nil {
		t.Fatalf("an _id write under a held lock, while the resolver is flooded: %v", err)
	}
	// An audited write with a filter that names no _id: not queued.
	if _, err := good.Database("shop").Collection(coll+"_audit").UpdateMany(context.Background(), bson.D{{"qty", bson.D{{"$gt", 0}}}}, bson.D{{"$set", bson.D{{"seen", true}}}}); err != nil {
		t.Fatalf("audited write while the resolver is flooded: %v", err)
	}
	if got := testutil.ToFloat64(st.metrics.resolves.WithLabelValues("skipped")); got < 1 {
		t.Errorf("resolves{skipped} = %v, want the audited write counted as not resolved", got)
	}

	// The first slow write runs out of time and is refused saying why.
	err := <-first
	lockBusy(t, err, "too slow to verify")
	if !strings.Contains(err.Error(), "name their _id values") {
		t.Errorf("the refusal does not say what to do instead: %v", err)
	}

	lockBusy(t, <-second, "too slow to verify")

	// The flooder's next slow-filter write, during its connection's
	// cool-down, is refused without another resolution.
	before := calls.Load()
	_, err = flood.Database("shop").Collection(coll).UpdateMany(inSession(fs), bson.D{{"slow", true}}, bson.D{{"$set", bson.D{{"x", 2}}}})
	lockBusy(t, err, "last such write was too slow to verify")
	if n := calls.Load() - before; n != 0 {
		t.Errorf("%d resolutions during the connection's cool-down", n)
	}
	// A command refused for a pinned statement spends no resolution on
	// its other statements: TestRefusedCommandSpendsNoResolution.
}

// TestRefusedCommandSpendsNoResolution: once a statement of a command is
// refused for a lock the caller does not hold, no later statement of it
// is resolved: the command is refused whatever they would find (the
// walk's stop at an enforced violation, enforce.Walk.resolveDeferred).
// The commands are sent as written, since a driver's BulkWrite sends a
// deleteOne and a deleteMany as two commands (and an ordered one stops
// at the first refusal); the caller has its budget and no cool-down, so
// that nothing else keeps the resolver from being asked.
func TestRefusedCommandSpendsNoResolution(t *testing.T) {
	coll, pol := protected(t, 3)
	var calls atomic.Int64
	st := startStackWith(t, stackOptions{policy: pol, memStore: decisionStore(),
		resolver: func(r Resolver) Resolver { return delayResolver{r, 0, &calls} }})
	c := connect(t, st.uri, "refused-first")
	s := session(t, c)
	db := c.Database("shop")
	unpinned := bson.D{{"qty", bson.D{{"$gt", 0}}}}

	// The unpinned statement alone is resolved.
	err := db.RunCommand(inSession(s), bson.D{{"delete", coll}, {"deletes", bson.A{bson.D{{"q", unpinned}, {"limit", 0}}}}}).Err()
	lockBusy(t, err, "does not hold the lock")
	if calls.Load() != 1 {
		t.Fatalf("%d resolutions for an unpinned delete, want 1", calls.Load())
	}
	for _, cmd := range []bson.D{
		{{"delete", coll}, {"deletes", bson.A{bson.D{{"q", bson.D{{"_id", 2}}}, {"limit", 1}}, bson.D{{"q", unpinned}, {"limit", 0}}}}, {"ordered", false}},
		// After it, too: the pinned statements are checked first.
		{{"update", coll}, {"updates", bson.A{
			bson.D{{"q", unpinned}, {"u", bson.D{{"$set", bson.D{{"x", 2}}}}}, {"multi", true}},
			bson.D{{"q", bson.D{{"_id", 3}}}, {"u", bson.D{{"$set", bson.D{{"x", 1}}}}}}}}, {"ordered", false}},
	} {
		before := calls.Load()
		err := db.RunCommand(inSession(s), cmd).Err()
		lockBusy(t, err, "does not hold the lock")
		if n := calls.Load() - before; n != 0 {
			t.Errorf("%s: %d resolutions for a command refused by its pinned statement", cmd[0].Key, n)
		}
	}
}
