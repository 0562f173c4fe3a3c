package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// A head record that lags behind its claims reads as "not held" in Status;
// ConfirmedStatus, which the insert check uses, reads the claims too and
// sees the holder. Both ways a head lags are simulated on the stored
// records: a first acquire whose head was not written yet, and the head of
// a newer holder moved back by a delayed writer of an older change.
func TestConfirmedStatusSeesPastALaggingHead(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	a, b, other := newOwner("a"), newOwner("b"), newOwner("other")
	ns := "db.c"

	// A first acquire whose head document is not there yet.
	first := ids(t, "first")
	mustAcquire(t, s, a, ns, first, time.Minute, 0)
	k, err := keys(namespace.Of(ns), first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coll.DeleteOne(bg, bson.D{{Key: "_id", Value: k[0].rid}}); err != nil {
		t.Fatal(err)
	}
	s.cache.remove(k[0].rid)
	lagging(t, s, other, ns, first, "a")

	// a releases (generation 2), b acquires (3), then a delayed writer of
	// generation 2 puts its head back.
	moved := ids(t, "moved")
	mustAcquire(t, s, a, ns, moved, time.Minute, 0)
	if n, err := s.Release(bg, a, namespace.Of(ns), moved, ""); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	mustAcquire(t, s, b, ns, moved, time.Minute, 0)
	k, err = keys(namespace.Of(ns), moved)
	if err != nil {
		t.Fatal(err)
	}
	released, err := s.claim(bg, k[0].rid, 2)
	if err != nil || released == nil || released.Owner != nil {
		t.Fatalf("generation 2 should be the release: %+v %v", released, err)
	}
	if _, err := s.coll.ReplaceOne(bg, bson.D{{Key: "_id", Value: k[0].rid}}, released.asHead(), options.Replace()); err != nil {
		t.Fatal(err)
	}
	s.cache.remove(k[0].rid)
	lagging(t, s, other, ns, moved, "b")

	// A key that is free in both reads stays free, and a caller's own lock
	// is its own.
	free := ids(t, "never-locked")
	if sts, err := s.ConfirmedStatus(bg, other, namespace.Of(ns), free); err != nil || sts[0].Held {
		t.Fatalf("a never-locked key: %+v %v", sts, err)
	}
	if sts, err := s.ConfirmedStatus(bg, b, namespace.Of(ns), moved); err != nil || !sts[0].HeldByYou {
		t.Fatalf("b's own lock: %+v %v", sts, err)
	}
}

// lagging checks that Status shows id free (the lag) and ConfirmedStatus
// shows it held by app.
func lagging(t *testing.T, s *Store, o Owner, ns string, id []docid.ID, app string) {
	t.Helper()
	st, err := s.Status(bg, o, namespace.Of(ns), id)
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Held {
		t.Fatalf("the simulated lag did not take: Status already sees the holder %+v", st[0])
	}
	sts, err := s.ConfirmedStatus(bg, o, namespace.Of(ns), id)
	if err != nil {
		t.Fatal(err)
	}
	if !sts[0].Held || sts[0].HeldByYou || sts[0].Holder.App != app {
		t.Fatalf("ConfirmedStatus behind a lagging head: %+v, want held by %s", sts[0], app)
	}
}
