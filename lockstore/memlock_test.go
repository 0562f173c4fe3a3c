package lockstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

func implicitOwner(cmd string) Owner {
	o := newOwner("legacy")
	o.Implicit = cmd
	return o
}

// memoryReady waits until s takes memory locks in ns (it has read the
// registry and the claims), using a probe key it gives back.
func memoryReady(t *testing.T, s *Store, ns string) {
	t.Helper()
	probe := implicitOwner("probe")
	testkit.Eventually(t, 15*time.Second, "the lone store takes memory locks", func() bool {
		_, _, ok := s.AcquireInMemory(probe, namespace.Of(ns), ids(t, "probe"))
		return ok
	})
	if n, err := s.Release(bg, probe, namespace.Of(ns), ids(t, "probe"), ""); err != nil || n != 1 {
		t.Fatalf("releasing the probe memory lock: %d, %v", n, err)
	}
}

// TestNewcomerGrantsOnlyAfterMemoryLockWrites (attack a, d): a lockgate
// that holds a legacy write's implicit lock in memory while alone can die
// at any moment; a lockgate that starts beside it (its registry record
// still there) must not grant the key before that write has surely ended,
// that is, before the budget its maxTimeMS was capped at. With the
// newcomer waiting only CacheTrust (NewcomerHorizon off on the newcomer)
// it grants about a second in, inside the write's budget.
func TestNewcomerGrantsOnlyAfterMemoryLockWrites(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, s *Store) // how the holder's lockgate ends
	}{
		{"killed", func(t *testing.T, s *Store) {
			// What SIGKILL leaves: no more heartbeats, no deregistration.
			s.cancel()
			s.wg.Wait()
		}},
		{"closed", func(t *testing.T, s *Store) {
			// A clean Close while the write may still run keeps the record.
			if err := s.Close(bg); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case on a collection of its own
			cfg := testConfig(t)
			const ns = "db.c"
			s1 := openStore(t, cfg)
			memoryReady(t, s1, ns)
			_, budget, ok := s1.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 1))
			if !ok {
				t.Fatal("no memory lock while alone")
			}
			writeEnd := time.Now().Add(budget)
			tc.stop(t, s1)

			s2 := openStore(t, cfg)
			mustAcquire(t, s2, newOwner("editor"), ns, ids(t, 1), time.Minute, 5*time.Second)
			if granted := time.Now(); granted.Before(writeEnd) {
				t.Fatalf("the newcomer granted the key %s before the memory-locked write's budget ended", FormatMS(writeEnd.Sub(granted)))
			}
		})
	}
}

// TestAcquireSeesMemoryLocks (attack b): acquires through the same Store
// refuse or queue behind a memory lock, a queued acquire keeps new memory
// locks off the key (first come, first served), and no memory lock is
// taken while an acquire through this Store is in flight in the namespace
// or a lock is held there.
func TestAcquireSeesMemoryLocks(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.c"
	s := openStore(t, cfg)
	memoryReady(t, s, ns)
	legacy := implicitOwner("update")
	if _, _, ok := s.AcquireInMemory(legacy, namespace.Of(ns), ids(t, 1)); !ok {
		t.Fatal("no memory lock while alone")
	}
	_, err := s.Acquire(bg, newOwner("editor"), namespace.Of(ns), ids(t, 1), time.Minute, 0)
	var he *HeldError
	if !errors.As(err, &he) || !errors.Is(err, ErrBusy) || he.Holder.Implicit != "update" {
		t.Fatalf("acquireLock of a memory-locked key: %v, want busy naming the implicit holder", err)
	}

	editor := newOwner("editor")
	got := make(chan error, 1)
	go func() {
		_, err := s.Acquire(bg, editor, namespace.Of(ns), ids(t, 1), time.Minute, 20*time.Second)
		got <- err
	}()
	rid := recordID(namespace.Of(ns), rv(t, 1).Key())
	testkit.Eventually(t, 10*time.Second, "the editor queues for the key", func() bool { return s.wq.waiting(rid) == 1 })
	select {
	case err := <-got:
		t.Fatalf("the editor's acquire returned while the memory lock is held: %v", err)
	default:
	}
	if n, err := s.Release(bg, legacy, namespace.Of(ns), ids(t, 1), ""); err != nil || n != 1 {
		t.Fatalf("release of the memory lock: %d, %v", n, err)
	}
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 1)); ok {
		t.Fatal("a second legacy write took the key in memory ahead of the queued editor")
	}
	if err := <-got; err != nil {
		t.Fatalf("the queued editor was not granted the key at the memory lock's release: %v", err)
	}
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 2)); ok {
		t.Fatal("a memory lock was taken in a namespace where the editor holds a lock")
	}

	// An acquire in flight in another namespace keeps memory locks out of
	// it until it has landed (after that the grant itself does).
	const ns2 = "db.d"
	memoryReady(t, s, ns2)
	inTry, proceed := make(chan struct{}), make(chan struct{})
	s.testHookTry = func(string) {
		close(inTry)
		<-proceed
	}
	go func() {
		_, err := s.Acquire(bg, newOwner("editor2"), namespace.Of(ns2), ids(t, 5), time.Minute, 0)
		got <- err
	}()
	<-inTry
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns2), ids(t, 5)); ok {
		t.Fatal("a memory lock was taken on a key whose acquire is in flight")
	}
	close(proceed)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	s.testHookTry = nil
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns2), ids(t, 5)); ok {
		t.Fatal("a memory lock was taken on a key held in the store")
	}
}

// TestMemoryLocksAreShown (attack c): lockStatus, the insert check and
// /locks see a memory lock, as implicit.
func TestMemoryLocksAreShown(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.c"
	s := openStore(t, cfg)
	memoryReady(t, s, ns)
	testkit.Eventually(t, 10*time.Second, "the insert check trusts its view", func() bool { return !s.MayHoldLocks(namespace.Of(ns)) })
	legacy := implicitOwner("update")
	if _, _, ok := s.AcquireInMemory(legacy, namespace.Of(ns), ids(t, 9)); !ok {
		t.Fatal("no memory lock while alone")
	}
	if !s.MayHoldLocks(namespace.Of(ns)) {
		t.Fatal("the insert check answers that no lock may be held where a memory lock is")
	}
	for name, status := range map[string]func() ([]Status, error){
		"Status":          func() ([]Status, error) { return s.Status(bg, newOwner("x"), namespace.Of(ns), ids(t, 9)) },
		"ConfirmedStatus": func() ([]Status, error) { return s.ConfirmedStatus(bg, newOwner("x"), namespace.Of(ns), ids(t, 9)) },
	} {
		sts, err := status()
		if err != nil {
			t.Fatal(err)
		}
		if !sts[0].Held || sts[0].Holder.Implicit != "update" || sts[0].HeldByYou {
			t.Fatalf("%s of a memory-locked key: %+v", name, sts[0])
		}
	}
	sts, err := s.Status(bg, legacy, namespace.Of(ns), ids(t, 9))
	if err != nil || !sts[0].HeldByYou {
		t.Fatalf("Status for the memory lock's owner: %+v, %v", sts, err)
	}
	list, err := s.List(bg, ListOptions{NS: namespace.Of(ns)})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !list[0].ID.Equal(rv(t, 9)) || list[0].Holder.Implicit != "update" {
		t.Fatalf("List shows %+v, want the memory lock", list)
	}
	if _, err := s.Release(bg, legacy, namespace.Of(ns), ids(t, 9), ""); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(bg, ListOptions{NS: namespace.Of(ns)}); len(list) != 0 {
		t.Fatalf("List after the release: %+v", list)
	}
}

// TestNoMemoryLocksBesideAnotherStore (attack e): once a second Store has
// registered, neither takes memory locks; one taken before keeps excluding
// the first Store's acquires for as long as its write may run, and the
// second grants nothing before then (TestNewcomerGrantsOnlyAfterMemoryLockWrites).
func TestNoMemoryLocksBesideAnotherStore(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.c"
	s1 := openStore(t, cfg)
	memoryReady(t, s1, ns)
	legacy := implicitOwner("update")
	_, budget, ok := s1.AcquireInMemory(legacy, namespace.Of(ns), ids(t, 1))
	if !ok {
		t.Fatal("no memory lock while alone")
	}
	writeEnd := time.Now().Add(budget)
	opened := make(chan *Store, 1)
	go func() {
		// Open waits about NewcomerHorizon: s1 sees s2 registered meanwhile.
		s2, err := Open(bg, cfg)
		if err != nil {
			t.Error(err)
		}
		opened <- s2
	}()
	testkit.Eventually(t, 10*time.Second, "s1 sees s2 registered", func() bool { return !s1.alone(time.Now()) })
	if _, _, ok := s1.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 2)); ok {
		t.Fatal("s1 took a memory lock with s2 registered")
	}
	_, err := s1.Acquire(bg, newOwner("editor"), namespace.Of(ns), ids(t, 1), time.Minute, 0)
	switch {
	case time.Now().After(writeEnd):
		t.Log("the memory lock's budget ran out before s1 saw s2 (a loaded machine): its exclusion was not checked")
	case !errors.Is(err, ErrBusy):
		t.Fatalf("an acquire through s1 of its memory-locked key: %v, want busy", err)
	}
	if _, err := s1.Release(bg, legacy, namespace.Of(ns), ids(t, 1), ""); err != nil {
		t.Fatal(err)
	}
	s2 := <-opened
	if s2 == nil {
		return
	}
	defer s2.Close(bg)
	both := time.Now()
	testkit.Eventually(t, 10*time.Second, "both stores read the registry", func() bool {
		return lastRead(s1).After(both) && lastRead(s2).After(both)
	})
	for _, s := range []*Store{s1, s2} {
		if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 3)); ok {
			t.Fatal("a memory lock was taken with two stores live")
		}
	}
	mustAcquire(t, s2, newOwner("editor"), ns, ids(t, 1), time.Minute, 0)
}

// TestGrantViewReadsClaimsNotHeads: a lock whose head document does not
// show it (a head write that failed, or one moved back by a slower writer
// of an older generation) is still held by its claim; the view memory
// locks are decided on reads the claims, where the insert check's view of
// the heads sees nothing.
func TestGrantViewReadsClaimsNotHeads(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.lag"
	seed := openStore(t, cfg)
	held := mustAcquire(t, seed, newOwner("editor"), ns, ids(t, 3), time.Minute, 0)
	rid := recordID(namespace.Of(ns), rv(t, 3).Key())
	// The head goes back to the free generation before the grant.
	var h gen
	if err := seed.coll.FindOne(bg, bson.D{{Key: "_id", Value: rid}}).Decode(&h); err != nil {
		t.Fatal(err)
	}
	h.Owner, h.ExpiresAt, h.Seq = nil, freeExpiry, h.Seq-1
	if _, err := seed.coll.ReplaceOne(bg, bson.D{{Key: "_id", Value: rid}}, h); err != nil {
		t.Fatal(err)
	}
	if err := seed.Close(bg); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, cfg)
	memoryReady(t, s, "db.other")
	testkit.Eventually(t, 10*time.Second, "the heads view shows the namespace free", func() bool { return !s.heldNS.mayHold(namespace.Of(ns), time.Now()) })
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), []docid.ID{held[0].ID}); ok {
		t.Fatal("a memory lock was taken on a key whose claim says it is held")
	}
}

// TestGrantViewReadsHeadsToo: the janitor deletes claims CleanupAfter
// after they were written, even the newest of a key whose lease is longer;
// its head record still shows the lock, and no memory lock is taken there.
func TestGrantViewReadsHeadsToo(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.long"
	seed := openStore(t, cfg)
	mustAcquire(t, seed, newOwner("editor"), ns, ids(t, 4), 5*time.Minute, 0)
	if _, err := seed.claims.DeleteMany(bg, bson.D{}); err != nil { // as compaction would
		t.Fatal(err)
	}
	if err := seed.Close(bg); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, cfg)
	memoryReady(t, s, "db.other")
	if _, _, ok := s.AcquireInMemory(implicitOwner("update"), namespace.Of(ns), ids(t, 4)); ok {
		t.Fatal("a memory lock was taken on a key whose head record shows it held (its claim compacted)")
	}
}

// TestForceReleaseWaitsForAMemoryLock: an operator's force-release of a
// key held in memory neither reports it free nor ends it under its write
// (it has no token: the write may land until the lock ends). It waits for
// the write's release and answers with the holder it waited for; given
// less time than the lock has left, it fails with ErrHeldInMemory, saying
// when the lock ends, and the lock stays listed and held. The lock store
// is left alone: a token already there is not raised for a lock that was
// never in the store.
func TestForceReleaseWaitsForAMemoryLock(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.c"
	s := openStore(t, cfg)
	// A store lock on the key before: its head keeps token 1.
	editor := newOwner("editor")
	first := mustAcquire(t, s, editor, ns, ids(t, 2), time.Minute, 0)[0].Token
	if _, err := s.Release(bg, editor, namespace.Of(ns), ids(t, 2), ""); err != nil {
		t.Fatal(err)
	}
	memoryReady(t, s, ns)
	legacy := implicitOwner("update")
	if _, _, ok := s.AcquireInMemory(legacy, namespace.Of(ns), ids(t, 1)); !ok {
		t.Fatal("no memory lock while alone")
	}

	short, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	_, err := s.ForceRelease(short, namespace.Of(ns), rv(t, 1), "stuck")
	cancel()
	var me *MemoryHeldError
	if !errors.As(err, &me) || !errors.Is(err, ErrHeldInMemory) || me.Holder.Implicit != "update" || !strings.Contains(err.Error(), "at the latest at") {
		t.Fatalf("force-release given less time than the memory lock has: %v, want ErrHeldInMemory saying when it ends", err)
	}
	if sts, err := s.Status(bg, newOwner("x"), namespace.Of(ns), ids(t, 1)); err != nil || !sts[0].Held {
		t.Fatalf("Status after a force-release that gave up: %+v, %v, want still held", sts, err)
	}
	if n, err := s.Release(bg, legacy, namespace.Of(ns), ids(t, 1), ""); err != nil || n != 1 {
		t.Fatalf("release of the memory lock after a force-release gave up: %d, %v", n, err)
	}

	// The second force-release, of another key, waits for its lock.
	if _, _, ok := s.AcquireInMemory(legacy, namespace.Of(ns), ids(t, 2)); !ok {
		t.Fatal("no memory lock while alone")
	}
	type result struct {
		st  Status
		err error
	}
	got := make(chan result, 1)
	go func() {
		st, err := s.ForceRelease(bg, namespace.Of(ns), rv(t, 2), "stuck")
		got <- result{st, err}
	}()
	rid := recordID(namespace.Of(ns), rv(t, 2).Key())
	testkit.Eventually(t, 10*time.Second, "the force-release waits for the memory lock", func() bool {
		s.mem.mu.Lock()
		defer s.mem.mu.Unlock()
		l := s.mem.held[rid]
		return l != nil && l.gone != nil
	})
	select {
	case r := <-got:
		t.Fatalf("the force-release answered while the memory lock's write may still land: %+v, %v", r.st, r.err)
	default:
	}
	if _, err := s.Acquire(bg, newOwner("other"), namespace.Of(ns), ids(t, 2), time.Minute, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("acquire during the force-release: %v, want busy", err)
	}
	// The write is answered: the guard releases its lock.
	if n, err := s.Release(bg, legacy, namespace.Of(ns), ids(t, 2), ""); err != nil || n != 1 {
		t.Fatalf("release of the memory lock: %d, %v", n, err)
	}
	r := <-got
	if r.err != nil || !r.st.Held || r.st.Holder.Implicit != "update" || r.st.Holder.App != "legacy" {
		t.Fatalf("force-release of a memory lock: %+v, %v, want the holder it waited for", r.st, r.err)
	}
	if list, err := s.List(bg, ListOptions{NS: namespace.Of(ns)}); err != nil || len(list) != 0 {
		t.Fatalf("List after the force-release: %+v, %v", list, err)
	}
	locks := mustAcquire(t, s, newOwner("next"), ns, ids(t, 2), time.Minute, 0)
	if locks[0].Token != first+1 {
		t.Fatalf("token after the force-release of a memory lock: %d, want %d (the store was not touched)", locks[0].Token, first+1)
	}
}
