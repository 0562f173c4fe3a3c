package guard

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestRefusedBudget: resolver time on refused writes is taken from a
// bucket of refusedBurst refilled at refusedRate, with a bounded debt;
// time that bought an allowed write is given back.
func TestRefusedBudget(t *testing.T) {
	c := &stepClock{t: time.Unix(1000, 0)}
	b := newRefusedBudget(c.now)
	if d := b.wait("a"); d != 0 {
		t.Fatalf("a new caller waits %v", d)
	}
	for range 9 {
		b.charge("a", 200*time.Millisecond)
	}
	if d := b.wait("a"); d != 0 {
		t.Fatalf("after 1.8 s of the 2 s burst: waits %v", d)
	}
	b.charge("a", 200*time.Millisecond)
	if d := b.wait("a"); d <= 0 {
		t.Fatalf("the burst is spent and the caller does not wait")
	}
	if d := b.wait("b"); d != 0 {
		t.Fatalf("another caller waits %v", d)
	}
	// Several connections of one caller overspend: the debt is bounded.
	for range 100 {
		b.charge("a", 2*time.Second)
	}
	if d := b.wait("a"); d > 20*time.Second+time.Millisecond || d < 20*time.Second {
		t.Fatalf("a caller deep in debt waits %v, want the bound of 20 s", d)
	}
	c.t = c.t.Add(20 * time.Second)
	if d := b.wait("a"); d != time.Millisecond {
		t.Fatalf("after paying the debt back: waits %v, want 1ms (an empty bucket)", d)
	}
	c.t = c.t.Add(time.Second) // 100 ms of budget back
	if d := b.wait("a"); d != 0 {
		t.Fatalf("with budget back: waits %v", d)
	}
	// A refusal, then the same write allowed: nothing spent in the end.
	b.charge("a", 300*time.Millisecond)
	if d := b.wait("a"); d <= 0 {
		t.Fatalf("overspent, not waiting")
	}
	b.credit("a", 300*time.Millisecond)
	if d := b.wait("a"); d != 0 {
		t.Fatalf("after the allowed retry: waits %v", d)
	}
	c.t = c.t.Add(time.Hour)
	b.credit("a", time.Hour)
	for range 10 {
		b.charge("a", 200*time.Millisecond)
	}
	if d := b.wait("a"); d <= 0 {
		t.Fatalf("credits went beyond the burst")
	}
}

// delayResolver makes every resolution take at least d, as a collection
// scan does, and counts them.
type delayResolver struct {
	Resolver
	d     time.Duration
	calls *atomic.Int64
}

func (r delayResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	r.calls.Add(1)
	select {
	case <-time.After(r.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r.Resolver.Candidates(ctx, ns, filter, collation, hint, limit)
}

// connectFrom connects from the loopback address ip, another client
// address for the proxy.
func connectFrom(t *testing.T, uri, app, ip string) *mongo.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(uri).SetAppName(app).SetDialer(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c
}

// TestRefusedResolutionsAreBudgeted: a client that keeps sending writes
// whose filter is resolved in time and then refused (it holds no lock),
// from several connections, gets at most its budget of resolutions; the
// rest are refused at once, saying why. A client at another address is
// not affected, nor is the flooder's own _id write under its lock. Without
// the budget every one of the writes costs a resolution (issue 12's load
// test: one such flooder took 68% of the well-behaved clients'
// throughput).
func TestRefusedResolutionsAreBudgeted(t *testing.T) {
	coll, pol := protected(t, 5)
	var calls atomic.Int64
	const d = 100 * time.Millisecond
	// The lock store in memory: the budget is the subject, and a loaded
	// machine's FerretDB timed lock store calls out (once, under -race at
	// load 8); the resolutions still query the embedded upstream.
	st := startStackWith(t, stackOptions{policy: pol, memStore: decisionStore(),
		resolver: func(r Resolver) Resolver { return delayResolver{r, d, &calls} }})
	// 5 resolutions, and so slow a refill that the budget cannot come
	// back within the test.
	st.guard.refused.burst, st.guard.refused.rate = 500*time.Millisecond, 0.01

	const flooders, writes = 4, 8
	var throttled atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range flooders {
		f := connect(t, st.uri, fmt.Sprintf("flooder-%d", i))
		wg.Go(func() {
			c := f.Database("shop").Collection(coll)
			for range writes {
				_, err := c.UpdateMany(context.Background(), bson.D{{"qty", bson.D{{"$gt", 0}}}}, bson.D{{"$set", bson.D{{"hit", true}}}})
				switch {
				case err == nil:
					t.Errorf("an unlocked updateMany was allowed")
				case strings.Contains(err.Error(), "used up its share"):
					throttled.Add(1)
				case !strings.Contains(err.Error(), "does not hold the lock"):
					t.Errorf("unexpected refusal: %v", err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The burst, what came back meanwhile, and one resolution per
	// connection that started while the budget was not yet spent.
	bound := int64(st.guard.refused.burst/d) + int64(elapsed.Seconds()*st.guard.refused.rate/d.Seconds()) + flooders
	t.Logf("%d slow-filter writes in %v: %d resolutions (bound %d), %d refused at once", flooders*writes, elapsed.Round(time.Millisecond), calls.Load(), bound, throttled.Load())
	if calls.Load() > bound {
		t.Errorf("%d resolutions for writes that were all refused, want at most %d", calls.Load(), bound)
	}
	if throttled.Load() == 0 {
		t.Errorf("no write was refused for the spent budget")
	}

	// Another client address has its own budget: its write is resolved
	// (and refused for the lock it does not hold, not for the budget).
	before := calls.Load()
	other := connectFrom(t, st.uri, "neighbour", "127.0.0.2")
	_, err := other.Database("shop").Collection(coll).UpdateMany(context.Background(), bson.D{{"qty", bson.D{{"$gt", 0}}}}, bson.D{{"$set", bson.D{{"hit", true}}}})
	lockBusy(t, err, "does not hold the lock")
	if calls.Load() != before+1 {
		t.Errorf("the neighbour's write was not resolved")
	}
	// The flooder's address: an unpinned write is refused at once, even
	// with the lock; a write by _id under the lock goes through.
	f := connect(t, st.uri, "flooder-locks")
	fs := session(t, f)
	acquire(t, f, fs, coll, 1)
	before = calls.Load()
	_, err = f.Database("shop").Collection(coll).UpdateMany(inSession(fs), bson.D{{"qty", 10}}, bson.D{{"$set", bson.D{{"x", 1}}}})
	lockBusy(t, err, "lock the documents and name their _id values")
	if calls.Load() != before {
		t.Errorf("a write was resolved while its caller's budget was spent")
	}
	if r, err := f.Database("shop").Collection(coll).UpdateOne(inSession(fs), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"x", 1}}}}); err != nil || r.ModifiedCount != 1 {
		t.Fatalf("an _id write under the lock: %v %v", r, err)
	}
}

// retryEchoResolver is delayResolver for a refuse-lock-retry cycle: every
// resolution takes at least d, and each even one (the retry under the lock)
// at least as long as the odd one before it (the refusal). The budget is
// charged and credited the resolutions' wall time; on a loaded machine two
// runs of the same query differ by hundreds of milliseconds, and which of
// the pair is slower is the machine's doing, not the guard's.
type retryEchoResolver struct {
	Resolver
	d       time.Duration
	calls   *atomic.Int64
	refusal *atomic.Int64 // the last odd resolution's time, in nanoseconds
}

func (r retryEchoResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	start := time.Now()
	n := r.calls.Add(1)
	ids, err := delayResolver{r.Resolver, r.d, new(atomic.Int64)}.Candidates(ctx, ns, filter, collation, hint, limit)
	if n%2 == 1 {
		r.refusal.Store(int64(time.Since(start)))
		return ids, err
	}
	if rest := time.Duration(r.refusal.Load()) - time.Since(start); rest > 0 {
		select {
		case <-time.After(rest):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return ids, err
}

// TestRefuseLockRetryKeepsItsBudget: an application whose slow-filter
// write is refused, which then takes the lock and sends it again, can go
// round that cycle forever: the allowed retry gives back what the refusal
// cost. (Charging refusals alone ran this out of budget after about seven
// cycles; a cool-down after three refusals in a row broke
// TestEnforcedWritesNeedTheLock.)
//
// The budget's clock stands still, so nothing comes back by refilling:
// without the credit the 20 refusals, each at least 100 ms, spend more
// than the 1.9 s burst whatever the machine's speed, and with it a
// cycle's refusal is given back by its retry, so that only a single
// refusal slower than the burst could run it out. (At a 500 ms burst on
// the real clock, one refusal slower than the burst plus its refill at
// load 15 did.)
func TestRefuseLockRetryKeepsItsBudget(t *testing.T) {
	coll, pol := protected(t, 5)
	var calls, refusal atomic.Int64
	const d = 100 * time.Millisecond
	const cycles = 20
	st := startStackWith(t, stackOptions{policy: pol, resolveTimeout: time.Minute,
		resolver: func(r Resolver) Resolver { return retryEchoResolver{r, d, &calls, &refusal} }})
	still := &stepClock{t: time.Unix(1000, 0)}
	st.guard.refused.now = still.now
	st.guard.refused.burst = cycles*d - d
	c := connect(t, st.uri, "app")
	s := session(t, c)
	orders := c.Database("shop").Collection(coll)
	for i := range cycles {
		k := i%5 + 1
		filter := bson.D{{"qty", 10 * k}}
		_, err := orders.UpdateMany(inSession(s), filter, bson.D{{"$set", bson.D{{"round", i}}}})
		lockBusy(t, err, "does not hold the lock on 1 document its filter matches")
		acquire(t, c, s, coll, k)
		r, err := orders.UpdateMany(inSession(s), filter, bson.D{{"$set", bson.D{{"round", i}}}})
		if err != nil || r.ModifiedCount != 1 {
			t.Fatalf("cycle %d: the retry under the lock: %v %v", i, r, err)
		}
		if err := c.Database("shop").RunCommand(inSession(s), bson.D{{"releaseLock", coll}, {"ids", bson.A{k}}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 2*cycles {
		t.Errorf("%d resolutions, want %d", n, 2*cycles)
	}
}
