package reliability

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// faultSeconds is how long each leg of TestFaultWorkload runs: short in
// the normal test run, longer with LOCKGATE_FAULT_SECONDS (the long form,
// docs/RELIABILITY.md).
func faultSeconds() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("LOCKGATE_FAULT_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 8 * time.Second
}

// faultTally is what the clients of one workload saw.
type faultTally struct {
	acked, fencedOut, refused, otherErrs atomic.Int64
}

// runFaultWorkload: 4 clients, two on each of two proxies sharing one lock
// store, each doing lock-read-increment-write-release on hot documents (3,
// or fewer for more contention) for d. Proxy 1 reaches the database through a relay that holds a marked
// write (a third of its clients' writes) for 1 s, past the 300 ms lease,
// and partitions proxy 1 from its lock store for 1.5 s from the moment
// such a write arrives, so that proxy 1 can neither renew the lock of the
// write in flight nor learn that the lock moved on. scale multiplies the
// lease, the hold, the partition and the acquire's wait, for a machine too
// loaded for the first: every step of a cycle must fit in the lease less
// the margin. It returns the tally and the sum of the counters.
func runFaultWorkload(t *testing.T, fence bool, d time.Duration, scale, hotDocs int) (*faultTally, int64) {
	t.Helper()
	times := func(ms int) time.Duration { return time.Duration(ms*scale) * time.Millisecond }
	coll := uniq("faults")
	ns := "fault." + coll
	locks := uniq("locks")
	slow := newFaultRelay(t, upstream.Addr(), slowMarker, times(1000))
	store := newFaultRelay(t, upstream.Addr(), "", 0)
	cfg1 := fencedConfig("mongodb://"+slow.Addr()+"/", ns, fence)
	cfg1.Lockstore.Collection = locks
	cfg1.Lockstore.URI = "mongodb://" + store.Addr() + "/"
	cfg1.Policy.LeaseMarginMS = 50
	cfg2 := fencedConfig(upstream.URI(), ns, fence)
	cfg2.Lockstore.Collection = locks
	cfg2.Policy.LeaseMarginMS = 50
	slow.onMarked = func() { store.StallFor(times(1500)) }
	g1, g2 := startGateway(t, cfg1), startGateway(t, cfg2)
	ctx := testCtx(t, d+time.Minute)
	direct := connect(t, upstream.URI(), "seed").Database("fault").Collection(coll)
	hot := []string{"a", "b", "c"}[:hotDocs]
	for _, id := range hot {
		if _, err := direct.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "n", Value: int64(0)}}); err != nil {
			t.Fatal(err)
		}
	}

	tally := &faultTally{}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		g, onSlow := g1, true
		if w%2 == 1 {
			g, onSlow = g2, false
		}
		c := connect(t, g.URI, fmt.Sprintf("worker-%d", w), options.Client().SetTimeout(20*time.Second))
		wg.Add(1)
		go func(w int, c *mongo.Client, onSlow bool) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			s, err := c.StartSession()
			if err != nil {
				t.Error(err)
				return
			}
			defer s.EndSession(context.Background())
			sctx := mongo.NewSessionContext(ctx, s)
			db := c.Database("fault")
			for time.Now().Before(deadline) {
				id := hot[rng.Intn(len(hot))]
				if err := db.RunCommand(sctx, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: bson.A{id}},
					{Key: "leaseMS", Value: 300 * scale}, {Key: "waitMS", Value: 2000 * scale}}).Err(); err != nil {
					continue
				}
				var doc struct {
					N int64 `bson:"n"`
				}
				if err := db.Collection(coll).FindOne(sctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc); err != nil {
					tally.otherErrs.Add(1)
					continue
				}
				opts := options.Update()
				if onSlow && rng.Intn(3) == 0 {
					opts.SetComment(slowMarker) // held 1 s by the relay
				}
				r, err := db.Collection(coll).UpdateOne(sctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: doc.N + 1}}}}, opts)
				switch {
				case err == nil && r.ModifiedCount == 1:
					tally.acked.Add(1)
				case err != nil && strings.Contains(err.Error(), "fenced out"):
					tally.fencedOut.Add(1)
				case commandCode(err) == 46:
					tally.refused.Add(1)
				default:
					tally.otherErrs.Add(1)
				}
				db.RunCommand(sctx, bson.D{{Key: "releaseLock", Value: coll}, {Key: "ids", Value: bson.A{id}}})
			}
		}(w, c, onSlow)
	}
	wg.Wait()
	// Count only once the database has answered every write the relay
	// held: none of them can land after the count.
	unknown, err := slow.WaitAnswered(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if unknown > 0 {
		t.Fatalf("%d held writes lost their connection before the database answered them: whether they landed cannot be told, so the count would prove nothing", unknown)
	}
	return tally, sumCounters(t, ctx, direct)
}

// TestFaultWorkload is issue 11's fault run in its short form. Without the
// document fence the faults lose acknowledged increments (the window that
// remains, measured and logged). With the fence, on MongoDB, where a
// conditional update is atomic, the counters would equal the acknowledged
// increments exactly. FerretDB, the upstream here, evaluates an update's
// filter and then rewrites the document by _id without atomicity
// (docs/ENFORCEMENT.md, "On FerretDB"), so a stale write whose query step
// ran just before a newer holder's stamp can still land: the fenced run
// must lose at most one increment per thousand acknowledged, or one (the 60 s run
// lost 1 in 5829; the unfenced one about 19%).
//
// A leg whose run did not reach what it shows (no increment lost without
// the fence, none acknowledged with it) runs once more with every time
// three times longer: in CI, beside the race detector's packages, a run at
// 300 ms leases had all 17 of its writes refused for want of a lock
// (their find and update came after the lease less the margin). Without
// the fence, a last run puts every client on one document: at load 14 a
// run at three times the times over three documents acknowledged 20
// increments and lost none, as no other client happened to write a held
// write's document while it was held. The loss bound holds for every run.
func TestFaultWorkload(t *testing.T) {
	t.Parallel()
	d := faultSeconds()
	type step struct{ scale, hot int }
	t.Run("without fence", func(t *testing.T) {
		t.Parallel()
		steps := []step{{1, 3}, {3, 3}, {3, 1}}
		for i, st := range steps {
			tally, sum := runFaultWorkload(t, false, d, st.scale, st.hot)
			t.Logf("without fence, %v at scale %d on %d documents: %d increments acknowledged, counters sum to %d (%d lost), %d refused by the proxy, %d other errors",
				d, st.scale, st.hot, tally.acked.Load(), sum, tally.acked.Load()-sum, tally.refused.Load(), tally.otherErrs.Load())
			if sum < tally.acked.Load() {
				return
			}
			if i == len(steps)-1 {
				t.Errorf("no acknowledged increment was lost without the fence: the faults did not reach the window the fence closes, so the other leg shows nothing")
			}
		}
	})
	t.Run("with fence", func(t *testing.T) {
		t.Parallel()
		steps := []step{{1, 3}, {3, 3}}
		for i, st := range steps {
			tally, sum := runFaultWorkload(t, true, d, st.scale, st.hot)
			acked := tally.acked.Load()
			t.Logf("with fence, %v at scale %d on %d documents: %d increments acknowledged, counters sum to %d (%d lost), %d fenced out, %d refused by the proxy, %d other errors",
				d, st.scale, st.hot, acked, sum, acked-sum, tally.fencedOut.Load(), tally.refused.Load(), tally.otherErrs.Load())
			if sum > acked {
				t.Errorf("counters sum to %d, more than the %d acknowledged increments", sum, acked)
			}
			if lost := acked - sum; lost > max(1, acked/1000) {
				t.Errorf("%d of %d acknowledged increments lost with the fence: more than FerretDB's non-atomic update explains", lost, acked)
			}
			if acked > 0 {
				return
			}
			if i == len(steps)-1 {
				t.Error("no increment was acknowledged: the workload did not run")
			}
		}
	})
}
