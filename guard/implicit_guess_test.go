package guard

import (
	"context"
	"fmt"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// storeRoundTrips is the lock store's successful round trips of op.
func storeRoundTrips(t *testing.T, m *lockstore.Metrics, op string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "lockgate_lockstore_round_trips_total" {
			continue
		}
		for _, x := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range x.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["op"] == op && labels["outcome"] == "ok" {
				n += x.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestLegacyWriteSkipsTheHoldsRead: a session that holds no lock through
// this lockgate writes under refuseIfLocked without the lock store read
// that checks its own locks: the implicit acquire, which reads the same
// keys, is the check. Without skipHeldCheck the second write reads once.
func TestLegacyWriteSkipsTheHoldsRead(t *testing.T) {
	coll, pol := legacyPolicy(t, 2, config.UnlockedRefuseIfLocked, 0)
	m := lockstore.NewMetrics()
	st := startStackWith(t, stackOptions{policy: pol, storeMetrics: m})
	lc := connect(t, st.uri, "legacy-batch").Database("shop").Collection(coll)
	ctx := context.Background()
	inc := bson.D{{"$inc", bson.D{{"qty", 1}}}}
	// The first write reads the key's head document (nothing cached yet).
	if _, err := lc.UpdateOne(ctx, bson.D{{"_id", 1}}, inc); err != nil {
		t.Fatal(err)
	}
	before := storeRoundTrips(t, m, "find")
	if _, err := lc.UpdateOne(ctx, bson.D{{"_id", 1}}, inc); err != nil {
		t.Fatal(err)
	}
	if n := storeRoundTrips(t, m, "find") - before; n != 0 {
		t.Fatalf("a legacy write of a cached key read the lock store %v times, want 0", n)
	}
	if got := qtyOf(t, coll, 1); got != 12 {
		t.Fatalf("qty = %d, want 12", got)
	}
}

// TestGuessedLegacyWriterHoldingElsewhere: a session that took its lock
// through another lockgate looks, to this one, like a legacy writer
// (it holds nothing here), so its own-lock check is skipped and the
// implicit acquire finds the key held by the session itself. The skipped
// check must then be made as today: its write is a lock holder's and
// goes through, and a write needing one lock it holds and one it does not
// is refused as not locked, without waiting. Taking the guess for proved
// (testImplicit.trustGuess) refuses the holder its own document.
func TestGuessedLegacyWriterHoldingElsewhere(t *testing.T) {
	// Parallel: most of its time is the second lockgate's wait for the
	// newcomer horizon of memory locks (3 s per case), which needs the
	// real store's two instances (a shared memstore is one instance, where
	// the session's lock is this lockgate's own and the guess is never
	// made); it waits beside the package's other waiting tests.
	t.Parallel()
	for _, trust := range []bool{false, true} {
		t.Run(fmt.Sprintf("trustGuess=%v", trust), func(t *testing.T) {
			coll, pol := legacyPolicy(t, 3, config.UnlockedWait, 2000)
			locks := fmt.Sprintf("locks_guess_%d", seq.Add(1))
			core, logs := observer.New(zap.InfoLevel)
			here := startStackWith(t, stackOptions{policy: pol, collection: locks, logger: zap.New(core)})
			there := startStackWith(t, stackOptions{policy: pol, collection: locks})
			if trust {
				here.guard.testImplicit = &implicitTestHooks{trustGuess: true}
			}
			lsid := lsidDoc([]byte(fmt.Sprintf("guess-sess-%05d", seq.Add(1)%100000)))
			if r := dialRawConn(t, there.addr).do(bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"leaseMS", 20000}, {"lsid", lsid}, {"$db", "shop"}}); fmt.Sprint(r["ok"]) != "1" {
				t.Fatalf("acquireLock through the other lockgate: %v", r)
			}
			rc := dialRawConn(t, here.addr)
			update := func(ids ...any) bson.M {
				return rc.do(bson.D{{"update", coll}, {"updates", bson.A{bson.D{
					{"q", bson.D{{"_id", bson.D{{"$in", bson.A(ids)}}}}}, {"u", bson.D{{"$inc", bson.D{{"qty", 1}}}}}, {"multi", true}}}},
					{"lsid", lsid}, {"$db", "shop"}})
			}
			r := update(1)
			if trust {
				if fmt.Sprint(r["ok"]) == "1" && r["writeErrors"] == nil {
					t.Fatalf("with the guess taken for proved, the holder's write went through: %v", r)
				}
				t.Logf("guess taken for proved: the holder of _id 1 was refused its own write: %v", r["errmsg"])
				return
			}
			if fmt.Sprint(r["ok"]) != "1" || r["writeErrors"] != nil || fmt.Sprint(r["nModified"]) != "1" {
				t.Fatalf("the holder's write through this lockgate: %v", r)
			}
			// Decided as a lock holder's, and logged so: not implicit.
			for _, e := range logs.FilterMessage("decision").All() {
				if m, ok := e.ContextMap()["implicit"]; ok {
					t.Fatalf("the holder's write is logged as implicit (%v): %v", m, e.ContextMap())
				}
			}
			r = update(1, 2)
			if fmt.Sprint(r["code"]) != "46" || fmt.Sprint(r["lockgate"].(bson.M)["reason"]) != "not_locked" {
				t.Fatalf("a write holding 1 but not 2: %v, want LockBusy not_locked", r)
			}
			if got := qtyOf(t, coll, 1); got != 11 {
				t.Fatalf("qty of 1 = %d, want 11", got)
			}
			if got := qtyOf(t, coll, 2); got != 20 {
				t.Fatalf("qty of 2 = %d, want 20 (refused write applied)", got)
			}
		})
	}
}
