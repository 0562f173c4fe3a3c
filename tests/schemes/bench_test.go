package schemes

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

// A leg of BenchmarkSchemeWriteCost: one way of writing a document that
// the writer has locked (or, unprotected, need not lock).
type benchLeg struct {
	name string
	db   string
	// setup locks document id for client c and returns the write.
	setup func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(ctx context.Context) error
}

func benchLegs() []benchLeg {
	inc := bson.D{{"$inc", bson.D{{"n", 1}}}}
	plain := func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
		return func(ctx context.Context) error { _, err := coll.UpdateOne(ctx, bson.D{{"_id", id}}, inc); return err }
	}
	return []benchLeg{
		{name: "lockgate", db: "benchown", setup: func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
			s, err := c.StartSession()
			if err != nil {
				t.Fatal(err)
			}
			sctx := mongo.NewSessionContext(ctx, s)
			if err := coll.Database().RunCommand(sctx, bson.D{{"acquireLock", coll.Name()}, {"ids", bson.A{id}}, {"leaseMS", 600000}}).Err(); err != nil {
				t.Fatal(err)
			}
			return func(context.Context) error { _, err := coll.UpdateOne(sctx, bson.D{{"_id", id}}, inc); return err }
		}},
		{name: "holderFields", db: "benchhf", setup: func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
			me := fmt.Sprintf("bench-%d", id)
			if err := coll.FindOneAndUpdate(ctx, bson.D{{"_id", id}, {"LockId", nil}}, bson.D{{"$set", bson.D{{"LockId", me}, {"LockTime", time.Now()}}}}).Err(); err != nil {
				t.Fatal(err)
			}
			return func(ctx context.Context) error {
				_, err := coll.UpdateOne(ctx, bson.D{{"_id", id}, {"LockId", me}}, inc)
				return err
			}
		}},
		{name: "lockDocument", db: "benchld", setup: func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
			me := fmt.Sprintf("bench-%d", id)
			r, err := coll.UpdateOne(ctx, bson.D{{"_id", id}, {"Lock", nil}}, bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", me}, {"expiresAt", time.Now().Add(5 * time.Minute)}}}}}})
			if err != nil || r.ModifiedCount != 1 {
				t.Fatal(r, err)
			}
			return func(ctx context.Context) error {
				_, err := coll.UpdateOne(ctx, bson.D{{"_id", id}, {"Lock.actor", me}}, inc)
				return err
			}
		}},
		{name: "flag", db: "benchflag", setup: func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
			r, err := coll.UpdateOne(ctx, bson.D{{"_id", id}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}}}})
			if err != nil || r.ModifiedCount != 1 {
				t.Fatal(r, err)
			}
			return plain(ctx, t, c, coll, id)
		}},
		{name: "lockCollection", db: "benchlc", setup: func(ctx context.Context, t testing.TB, c *mongo.Client, coll *mongo.Collection, id int) func(context.Context) error {
			locks := coll.Database().Collection(coll.Name() + ".lock")
			if _, err := locks.InsertOne(ctx, bson.D{{"_id", id}, {"ts", time.Now()}, {"aid", "bench"}}); err != nil {
				t.Fatal(err)
			}
			return plain(ctx, t, c, coll, id)
		}},
	}
}

// BenchmarkSchemeWriteCost measures an _id-pinned update by the holder of
// its document's lock under each scheme, and under lockgate's own
// commands, against its twin: the same setup and the same update on a
// collection no rule protects, all through the same lockgate to the
// embedded FerretDB, in interleaved rounds of one run. It reports each
// leg's throughput and p50 latency, and each scheme's throughput relative
// to its unprotected twin (docs/BENCHMARKS.md):
//
//	go test -run '^$' -bench BenchmarkSchemeWriteCost -benchtime 1x ./tests/schemes
func BenchmarkSchemeWriteCost(b *testing.B) {
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			for range b.N {
				schemeWriteCost(b, clients, 7, 300*time.Millisecond)
			}
		})
	}
}

func schemeWriteCost(b *testing.B, clients, rounds int, round time.Duration) {
	ctx := context.Background()
	direct := connect(b, directURI, "seed")
	var legs []benchLeg
	for _, l := range benchLegs() {
		open := l
		open.name, open.db = l.name+"-open", "benchopen"+l.db
		legs = append(legs, l, open)
	}
	cname := fmt.Sprintf("w%d", clients) // locks of another run stay
	writes := make([][]func(context.Context) error, len(legs))
	for li, l := range legs {
		coll := direct.Database(l.db).Collection(cname)
		coll.Drop(ctx)
		for i := range clients {
			doc := bson.D{{"_id", i}, {"n", 0}, {"locked", false}, {"LockId", nil}, {"Lock", nil}}
			if _, err := coll.InsertOne(ctx, doc); err != nil {
				b.Fatal(err)
			}
		}
		for i := range clients {
			c := connect(b, proxyURI, fmt.Sprintf("bench-%s-%d", l.name, i))
			writes[li] = append(writes[li], l.setup(ctx, b, c, c.Database(l.db).Collection(cname), i))
		}
	}
	ops := make([]int64, len(legs))
	took := make([]time.Duration, len(legs))
	lat := make([][]time.Duration, len(legs))
	for r := range rounds + 1 {
		for li := range legs {
			n, d, ls := runLeg(b, ctx, writes[li], round)
			if r == 0 {
				continue // warm-up
			}
			ops[li] += n
			took[li] += d
			lat[li] = append(lat[li], ls...)
		}
	}
	for li := 0; li < len(legs); li += 2 {
		rate := float64(ops[li]) / took[li].Seconds()
		open := float64(ops[li+1]) / took[li+1].Seconds()
		b.ReportMetric(rate, legs[li].name+"-writes/s")
		b.ReportMetric(open, legs[li+1].name+"-writes/s")
		b.ReportMetric(float64(p50(lat[li]).Microseconds()), legs[li].name+"-p50-µs")
		b.ReportMetric(float64(p50(lat[li+1]).Microseconds()), legs[li+1].name+"-p50-µs")
		b.ReportMetric(rate/open, legs[li].name+"/unprotected")
	}
}

func runLeg(b *testing.B, ctx context.Context, writes []func(context.Context) error, d time.Duration) (int64, time.Duration, []time.Duration) {
	var mu sync.Mutex
	var n int64
	var lats []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for _, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := w(ctx); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			n += int64(len(mine))
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return n, time.Since(start), lats
}

func p50(ls []time.Duration) time.Duration {
	if len(ls) == 0 {
		return 0
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	return ls[len(ls)/2]
}
