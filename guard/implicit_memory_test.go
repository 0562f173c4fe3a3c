package guard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
)

// memoryLocksTaken reads lockgate_implicit_memory_locks_total{where="memory"}.
func memoryLocksTaken(t *testing.T, m *lockstore.Metrics) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockgate_implicit_memory_locks_total" {
			continue
		}
		for _, x := range mf.GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "where" && l.GetValue() == "memory" {
					return x.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestMemoryImplicitLockIsALock: a lockgate alone on its lock store holds
// an uncontended legacy write's implicit lock in memory (no lock store
// round trip), and that lock is a lock like any other for everyone who
// asks this lockgate: lockStatus shows it as implicit, an acquireLock that
// waits queues behind it, and a second legacy write that arrives after the
// acquireLock is served after it (first come, first served across explicit
// and implicit waiters). The editor's read-modify-write is never
// interleaved: every increment is in the document.
func TestMemoryImplicitLockIsALock(t *testing.T) {
	coll, pol := legacyPolicy(t, 1, config.UnlockedWait, 20000)
	storeMetrics := lockstore.NewMetrics()
	st := startStackWith(t, stackOptions{policy: pol, storeMetrics: storeMetrics})
	ns := "shop." + coll
	id, err := docid.Of(int32(1))
	if err != nil {
		t.Fatal(err)
	}
	legacy := connect(t, st.uri, "legacy-batch")
	alice := connect(t, st.uri, "alice")
	ac := alice.Database("shop").Collection(coll)
	sa := session(t, alice)

	testkit.Eventually(t, 10*time.Second, "the lone lockgate knows no lock is held in the namespace", func() bool { return !st.store.MayHoldLocks(namespace.Of(ns)) })
	var once sync.Once
	paused, resume := make(chan struct{}), make(chan struct{})
	var resumed sync.Once
	release := func() { resumed.Do(func() { close(resume) }) }
	t.Cleanup(release) // a failed check must not leave the write paused
	waiting := make(chan string, 4)
	st.guard.testImplicit = &implicitTestHooks{
		taken:   func(lockstore.Owner) { once.Do(func() { close(paused); <-resume }) },
		waiting: func(ns namespace.Namespace) { waiting <- ns.String() },
	}
	inc := func(done chan<- error) {
		_, err := legacy.Database("shop").Collection(coll).UpdateOne(context.Background(),
			bson.D{{"_id", 1}}, bson.D{{"$inc", bson.D{{"qty", 1}}}})
		done <- err
	}
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go inc(done1)
	<-paused // the first legacy write holds its implicit lock, not yet forwarded
	if n := memoryLocksTaken(t, storeMetrics); n != 1 {
		t.Fatalf("implicit locks held in memory: %v, want 1 (a lone lockgate's uncontended write)", n)
	}
	s := statusOf(t, alice, coll, 1)
	owner, _ := s["holder"].(bson.M)
	if s["held"] != true || owner["implicit"] != true || owner["command"] != "update" || owner["app"] != "legacy-batch" {
		t.Fatalf("lockStatus during the write: %v, want held implicitly by legacy-batch's update", s)
	}

	acquired := make(chan error, 1)
	go func() {
		_, err := run(t, alice, sa, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"waitMS", 20000}, {"leaseMS", 20000}})
		acquired <- err
	}()
	testkit.Eventually(t, 10*time.Second, "acquireLock queues behind the implicit lock", func() bool { return st.store.Waiting(namespace.Of(ns), id) == 1 })
	select {
	case err := <-acquired:
		t.Fatalf("acquireLock returned while the legacy write held the key: %v", err)
	default:
	}
	go inc(done2)
	<-waiting
	testkit.Eventually(t, 10*time.Second, "the second legacy write queues after acquireLock", func() bool { return st.store.Waiting(namespace.Of(ns), id) == 2 })
	select {
	case err := <-acquired:
		t.Fatalf("acquireLock returned while the legacy write held the key: %v", err)
	default:
	}

	release()
	if err := <-done1; err != nil {
		t.Fatalf("first legacy write: %v", err)
	}
	if err := <-acquired; err != nil {
		t.Fatalf("acquireLock after the legacy write: %v", err)
	}
	var doc bson.M
	if err := ac.FindOne(inSession(sa), bson.D{{"_id", 1}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done2:
		t.Fatalf("the second legacy write, queued after acquireLock, ran before the editor's work: %v", err)
	default:
	}
	if _, err := ac.UpdateOne(inSession(sa), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"qty", doc["qty"].(int32) + 5}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, alice, sa, bson.D{{"releaseLock", coll}, {"ids", bson.A{1}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done2; err != nil {
		t.Fatalf("second legacy write: %v", err)
	}
	if got := qtyOf(t, coll, 1); got != 17 {
		t.Fatalf("qty = %d, want 10 + 1 + 5 + 1", got)
	}
}

// TestTwoLockgatesTakeNoMemoryLocks: with a second lockgate on the same
// lock store, legacy writes through either take their implicit locks in
// the lock store, where the other lockgate sees them. The second one's
// start (it waits newcomerHorizon before it may grant) outlasts the first
// one's trust in its last "alone" read, so from then on neither holds a
// memory lock.
func TestTwoLockgatesTakeNoMemoryLocks(t *testing.T) {
	coll, pol := legacyPolicy(t, 2, config.UnlockedRefuseIfLocked, 0)
	lockColl := "locks_" + coll
	ma, mb := lockstore.NewMetrics(), lockstore.NewMetrics()
	a := startStackWith(t, stackOptions{policy: pol, storeMetrics: ma, collection: lockColl})
	inc := func(st *stack, id int) {
		t.Helper()
		c := connect(t, st.uri, "legacy-batch")
		if _, err := c.Database("shop").Collection(coll).UpdateOne(context.Background(),
			bson.D{{"_id", id}}, bson.D{{"$inc", bson.D{{"qty", 1}}}}); err != nil {
			t.Fatalf("legacy write of %d: %v", id, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the lone lockgate knows no lock is held in the namespace", func() bool { return !a.store.MayHoldLocks(namespace.Of("shop." + coll)) })
	before := qtyOf(t, coll, 1) + qtyOf(t, coll, 2)
	inc(a, 1)
	if n := memoryLocksTaken(t, ma); n != 1 {
		t.Fatalf("a lone lockgate held %v implicit locks in memory, want 1", n)
	}
	b := startStackWith(t, stackOptions{policy: pol, storeMetrics: mb, collection: lockColl})
	inc(a, 1)
	inc(b, 2)
	inc(a, 2)
	if na, nb := memoryLocksTaken(t, ma), memoryLocksTaken(t, mb); na != 1 || nb != 0 {
		t.Fatalf("implicit locks held in memory with two lockgates: %v and %v, want none after the second started", na-1, nb)
	}
	if got := qtyOf(t, coll, 1) + qtyOf(t, coll, 2); got != before+4 {
		t.Fatalf("qty sum %d, want %d", got, before+4)
	}
}

// TestLargeLeaseMarginTakesStoreLocks: a memory lock's write budget (about
// 1.7 s or more at the defaults) less a rule's lease margin can leave the
// write no time at all; such a write takes store locks, with their lease,
// instead of being refused for a lease that runs out.
func TestLargeLeaseMarginTakesStoreLocks(t *testing.T) {
	coll, pol := legacyPolicy(t, 1, config.UnlockedRefuseIfLocked, 0)
	pol.LeaseMarginMS = 5000
	st := startStackWith(t, stackOptions{policy: pol})
	c := connect(t, st.uri, "legacy-batch")
	if _, err := c.Database("shop").Collection(coll).UpdateOne(context.Background(),
		bson.D{{"_id", 1}}, bson.D{{"$inc", bson.D{{"qty", 1}}}}); err != nil {
		t.Fatalf("a legacy write under a rule with a 5 s lease margin: %v", err)
	}
}
