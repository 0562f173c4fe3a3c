package guard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"go.uber.org/zap"
)

// BenchmarkEnforcedInsert measures an insert on an enforced namespace
// through the proxy on the embedded upstream, for issue 16's default
// (inserts: requireUnlocked) against the old one (inserts: allow):
//
//   - allow: no lock check (the previous default);
//   - requireUnlocked/noLocks: no lock held in the namespace, so no lock
//     store round trip;
//   - requireUnlocked/lockHeld: another session holds a lock there, so each
//     insert command reads the lock store once;
//   - requireUnlocked/twoLockgates: no lock held, but a second lockgate
//     runs on the same lock store, so each insert command reads it
//     (a lock taken through the other would not be in this one's view).
//
// Compare the ns/op of the legs of one run:
//
//	go test ./guard -run '^$' -bench EnforcedInsert -benchtime 1000x -count 3
func BenchmarkEnforcedInsert(b *testing.B) {
	for _, leg := range []struct {
		name     string
		inserts  config.InsertMode
		lockHeld bool
		second   bool
	}{
		{"allow", config.InsertsAllow, false, false},
		{"requireUnlocked/noLocks", config.InsertsRequireUnlocked, false, false},
		{"requireUnlocked/lockHeld", config.InsertsRequireUnlocked, true, false},
		{"requireUnlocked/twoLockgates", config.InsertsRequireUnlocked, false, true},
	} {
		b.Run(leg.name, func(b *testing.B) {
			coll := fmt.Sprintf("ins_%d", collSeq.Add(1))
			pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50,
				Namespaces: []config.NamespaceRule{{Match: "shop." + coll, Mode: config.ModeEnforce, Inserts: leg.inserts}}}
			locks := fmt.Sprintf("locks_%d", seq.Add(1))
			st := startStackWith(b, stackOptions{policy: pol, logger: zap.NewNop(), collection: locks})
			if leg.second {
				startStackWith(b, stackOptions{policy: pol, logger: zap.NewNop(), collection: locks})
			}
			c := connect(b, st.uri, "bench")
			s := session(b, c)
			ctx := mongo.NewSessionContext(context.Background(), s)
			col := c.Database("shop").Collection(coll)
			if _, err := col.InsertOne(ctx, bson.D{{Key: "_id", Value: -1}}); err != nil {
				b.Fatal(err)
			}
			if leg.lockHeld {
				other := connect(b, st.uri, "holder")
				os := session(b, other)
				if err := other.Database("shop").RunCommand(mongo.NewSessionContext(context.Background(), os),
					bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: bson.A{-2}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
					b.Fatal(err)
				}
			} else if !leg.second {
				testkit.Eventually(b, 10*time.Second, "the store to see that nothing is locked here", func() bool { return !st.store.MayHoldLocks(namespace.Of("shop." + coll)) })
			}
			before := testutil.ToFloat64(st.metrics.insertChecks.WithLabelValues("checked"))
			opts := options.InsertOne()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := col.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}, opts); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			checked := testutil.ToFloat64(st.metrics.insertChecks.WithLabelValues("checked")) - before
			b.ReportMetric(checked/float64(b.N), "lockstore-reads/op")
		})
	}
}
