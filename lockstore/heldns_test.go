package lockstore

import (
	"slices"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// TestHeldNamespacesKeepMarksARefreshMissed: a refresh is a query sent at
// one time and applied when its answer arrives. A lock granted through
// this Store in between may have landed after the query ran, so the
// answer does not list its namespace; applying it must not erase the
// grant's mark, or inserts into that namespace skip their check until the
// next refresh. A mark older than the refresh's sending is the refresh's
// to confirm or drop.
func TestHeldNamespacesKeepMarksARefreshMissed(t *testing.T) {
	t.Parallel()
	h := heldNamespaces{trust: time.Hour}
	t0 := time.Now()
	h.set(map[string]bool{}, t0)
	if h.mayHold(namespace.Of("shop.orders"), t0) {
		t.Fatal("an empty fresh view says a lock may be held")
	}
	sent := t0.Add(time.Millisecond)                  // the refresh's query leaves
	h.mark("shop.orders", sent.Add(time.Millisecond)) // a grant lands meanwhile
	h.set(map[string]bool{}, sent)                    // the answer: it ran before the grant
	if !h.mayHold(namespace.Of("shop.orders"), sent.Add(2*time.Millisecond)) {
		t.Fatal("a refresh sent before a grant landed erased the grant's mark: an insert into the locked namespace skips its check")
	}
	// A refresh sent after the mark decides: the lock was released.
	h.set(map[string]bool{}, sent.Add(3*time.Millisecond))
	if h.mayHold(namespace.Of("shop.orders"), sent.Add(4*time.Millisecond)) {
		t.Fatal("a mark outlived a refresh sent after it")
	}
	if len(h.marked) != 0 {
		t.Fatalf("marks kept after a later refresh: %v", h.marked)
	}
}

// TestInsertCheckSurvivesAHeadMovedBack: head documents are replaced by _id
// alone, so a slower writer of an older generation can move a key's head
// back to "free" after a newer grant's head landed (acquire.go,
// writeHead); a head write can also fail after its claim landed. The view
// of the namespaces with held locks is read from head documents, so a
// refresh then misses a lock that is held, and a lone lockgate's insert
// check skipped the per-_id check: an insert of the locked _id went
// through. What this Store granted it knows from the generations it
// wrote, whatever the head documents say.
func TestInsertCheckSurvivesAHeadMovedBack(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	const ns = "db.headback"
	s := openStore(t, cfg)
	testkit.Eventually(t, 10*time.Second, "a lone store trusts its view of the held namespaces", func() bool { return !s.MayHoldLocks(namespace.Of(ns)) })

	id := ids(t, 7)
	ks, err := keys(namespace.Of(ns), id)
	if err != nil {
		t.Fatal(err)
	}
	rid := ks[0].rid
	a := newOwner("a")
	mustAcquire(t, s, a, ns, id, time.Minute, 0)
	if _, err := s.Release(bg, a, namespace.Of(ns), id, ""); err != nil {
		t.Fatal(err)
	}
	// The head as the release wrote it: what a slow writer of that
	// generation would write again later.
	freed, err := s.coll.FindOne(bg, bson.D{{Key: "_id", Value: rid}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, newOwner("b"), ns, id, time.Minute, 0)
	if _, err := s.coll.ReplaceOne(bg, bson.D{{Key: "_id", Value: rid}}, freed); err != nil {
		t.Fatal(err)
	}
	s.refreshHeldNamespaces(bg)
	if !s.MayHoldLocks(namespace.Of(ns)) {
		t.Fatal("with the key's head moved back to free, the insert check answers that no lock may be held where b holds one")
	}
}

// TestGrantViewKeepsOnlyWhatMayBeHeld: the generations this Store wrote
// are remembered per key for the insert check and the memory locks; a key
// whose last generation freed it, or whose lease prune saw end, is
// forgotten, so a long-running lockgate's view does not grow with every
// key it ever locked (whether or not memory locks are in use).
func TestGrantViewKeepsOnlyWhatMayBeHeld(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	const ns = "db.viewsize"
	size := func() (int, int) {
		s.gview.mu.Lock()
		defer s.gview.mu.Unlock()
		return len(s.gview.keys), s.gview.live[ns]
	}
	o := newOwner("a")
	id := ids(t, 1, 2, 3, 4, 5)
	mustAcquire(t, s, o, ns, id, time.Minute, 0)
	if n, live := size(); n != 5 || live != 5 || !s.gview.ownMayHold(namespace.Of(ns)) {
		t.Fatalf("after granting 5 keys the view holds %d keys, %d live in %s", n, live, ns)
	}
	if _, err := s.Release(bg, o, namespace.Of(ns), id[:3], ""); err != nil {
		t.Fatal(err)
	}
	if n, live := size(); n != 2 || live != 2 {
		t.Fatalf("after releasing 3 of 5 keys the view holds %d keys, %d live", n, live)
	}
	now, _ := s.clock.Now()
	s.gview.prune(now.Add(2 * time.Minute)) // as if both leases had ended
	if n, live := size(); n != 0 || live != 0 || s.gview.ownMayHold(namespace.Of(ns)) {
		t.Fatalf("after the leases ended the view holds %d keys, %d live", n, live)
	}
}

// TestMayBeHeldInListsWhatMayBeHeld: the insert check under a collation
// that is not simple reads every _id that may be locked in the namespace
// (it cannot name the keys it must check). A key whose head was moved
// back to free by a slow writer (acquire.go, writeHead) is still held by
// its newest claim, so it must be listed all the same; past the bound the
// list says it is incomplete.
func TestMayBeHeldInListsWhatMayBeHeld(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	const ns = "db.collated"
	a, b := newOwner("a"), newOwner("b")
	mustAcquire(t, s, a, ns, ids(t, 7), time.Minute, 0)
	mustAcquire(t, s, b, "db.other", ids(t, "z"), time.Minute, 0)
	c := ids(t, "c")
	ks, err := keys(namespace.Of(ns), c)
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, a, ns, c, time.Minute, 0)
	if _, err := s.Release(bg, a, namespace.Of(ns), c, ""); err != nil {
		t.Fatal(err)
	}
	freed, err := s.coll.FindOne(bg, bson.D{{Key: "_id", Value: ks[0].rid}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, b, ns, c, time.Minute, 0)
	if _, err := s.coll.ReplaceOne(bg, bson.D{{Key: "_id", Value: ks[0].rid}}, freed); err != nil {
		t.Fatal(err)
	}
	got, complete, err := s.MayBeHeldIn(bg, namespace.Of(ns), 10)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, id := range got {
		listed = append(listed, id.String())
	}
	slices.Sort(listed)
	if !complete || !slices.Equal(listed, []string{`"c"`, "7"}) {
		t.Fatalf("listed %v (complete %v), want \"c\" (held by b, its head moved back to free) and 7, complete", listed, complete)
	}
	if got, complete, err := s.MayBeHeldIn(bg, namespace.Of(ns), 1); err != nil || complete || len(got) != 1 {
		t.Fatalf("with a bound of 1: %v, complete %v, %v; want one _id, incomplete", got, complete, err)
	}
}
