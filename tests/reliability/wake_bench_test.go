package reliability

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
)

// BenchmarkWakeAcrossLockgates measures, through two real lockgates
// sharing one lock store on the embedded FerretDB, the time from a
// holder's releaseLock answered by lockgate A to the acquireLock (waitMS)
// of a waiter on lockgate B answered, after a 100 ms hold: with polling
// only, and with wake-up datagrams (lockstore.wakeListen), in one run. It
// reports p50 and p90 (docs/LOCKS.md).
//
//	go test ./tests/reliability -run '^$' -bench WakeAcrossLockgates -benchtime 100x
func BenchmarkWakeAcrossLockgates(b *testing.B) {
	for _, wake := range []bool{false, true} {
		name := "poll"
		if wake {
			name = "datagram"
		}
		b.Run(name, func(b *testing.B) {
			lockColl, coll := uniq("locks"), uniq("wake")
			ns := relDB + "." + coll
			var uris [2]string
			var storeDB string
			for i := range uris {
				cfg := gatewayConfig(upstream.URI(), lockColl, ns)
				storeDB = cfg.Lockstore.Database
				if wake {
					cfg.Lockstore.WakeListen = "127.0.0.1:0"
				}
				uris[i] = startGateway(b, cfg).URI
			}
			ctx := context.Background()
			sessionOn := func(uri, app string) (*mongo.Database, context.Context) {
				c := connect(b, uri, app)
				s, err := c.StartSession()
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.EndSession(context.Background()) })
				return c.Database(relDB), mongo.NewSessionContext(ctx, s)
			}
			hdb, hctx := sessionOn(uris[0], "holder")
			wdb, wctx := sessionOn(uris[1], "waiter")
			if wake {
				awaitWakePeers(b, connect(b, upstream.URI(), "wake-peers").Database(storeDB).Collection(lockColl+lockstore.WakeSuffix))
			}
			cmd := func(db *mongo.Database, c context.Context, d bson.D) {
				if err := db.RunCommand(c, d).Err(); err != nil {
					b.Fatal(err)
				}
			}
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				cmd(hdb, hctx, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}})
				got := make(chan time.Time, 1)
				go func() {
					if err := wdb.RunCommand(wctx, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"waitMS", 10000}}).Err(); err != nil {
						b.Error(err)
					}
					got <- time.Now()
				}()
				// The holder's work, the time the benchmark's holder holds
				// the lock: a workload's pacing, not an order of events
				// (a waiter not yet queued at the release would only
				// make that sample shorter).
				time.Sleep(100 * time.Millisecond)
				cmd(hdb, hctx, bson.D{{"releaseLock", coll}})
				released := time.Now()
				samples = append(samples, (<-got).Sub(released))
				cmd(wdb, wctx, bson.D{{"releaseLock", coll}})
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(samples[len(samples)*9/10].Microseconds())/1000, "p90-ms")
		})
	}
}

// awaitWakePeers waits until the two lockgates of the benchmark have each
// read the other's wake-up address: each advertises itself in wake (the
// lock store's _wake collection) on every heartbeat, stamped with the time
// it wrote it, and reads the others' right after. Once both are there, a
// heartbeat stamped later by each has read the other.
func awaitWakePeers(b *testing.B, wake *mongo.Collection) {
	b.Helper()
	ctx := testCtx(b, 30*time.Second)
	stamps := func() []time.Time {
		cur, err := wake.Find(ctx, bson.D{})
		if err != nil {
			b.Fatal(err)
		}
		var docs []struct {
			At time.Time `bson:"at"`
		}
		if err := cur.All(ctx, &docs); err != nil {
			b.Fatal(err)
		}
		var at []time.Time
		for _, d := range docs {
			at = append(at, d.At)
		}
		return at
	}
	testkit.Eventually(b, 20*time.Second, "both lockgates to advertise their wake-up address", func() bool { return len(stamps()) == 2 })
	both := time.Now()
	testkit.Eventually(b, 20*time.Second, "both lockgates to read the other's address", func() bool {
		at := stamps()
		return len(at) == 2 && at[0].After(both) && at[1].After(both)
	})
}
