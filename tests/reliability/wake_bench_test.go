package reliability

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
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
			for i := range uris {
				cfg := gatewayConfig(upstream.URI(), lockColl, ns)
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
				// Both must have read the other's address (heartbeat 1 s).
				time.Sleep(2500 * time.Millisecond)
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
				time.Sleep(100 * time.Millisecond) // the holder's work; the waiter is queued by then
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
