package guard

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// TestForceReleaseWaitsForATakenImplicitLock: an operator's force-release
// (POST /locks/release: BeginForceRelease, then the store's ForceRelease) of a
// legacy write's implicit lock, taken but not yet forwarded (its write is
// being decided), must not free it: the write would leave afterwards and
// land inside the work of whoever took the document meanwhile. Both
// forms: a store lock (whose force-release would succeed) and a memory
// lock (which the store waits for by itself). BeginForceRelease must count
// the write as in flight from the moment its locks are taken; given 300 ms it
// gives up (the admin API answers 409), whatever the machine's speed, as
// the write stays paused until the test resumes it.
func TestForceReleaseWaitsForATakenImplicitLock(t *testing.T) {
	for _, storeOnly := range []bool{true, false} {
		name := "memory"
		if storeOnly {
			name = "store"
		}
		t.Run(name, func(t *testing.T) {
			coll, pol := legacyPolicy(t, 1, config.UnlockedRefuseIfLocked, 0)
			st := startStackWith(t, stackOptions{policy: pol})
			ns := "shop." + coll
			id, err := docid.Of(int32(1))
			if err != nil {
				t.Fatal(err)
			}
			legacy := connect(t, st.uri, "legacy-batch")
			alice := connect(t, st.uri, "alice")
			sa := session(t, alice)
			var once, resumed sync.Once
			paused, resume := make(chan struct{}), make(chan struct{})
			release := func() { resumed.Do(func() { close(resume) }) }
			t.Cleanup(release)
			st.guard.testImplicit = &implicitTestHooks{storeOnly: storeOnly,
				taken: func(lockstore.Owner) { once.Do(func() { close(paused); <-resume }) }}
			done := make(chan error, 1)
			go func() {
				_, err := legacy.Database("shop").Collection(coll).UpdateOne(context.Background(),
					bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "legacy"}}}})
				done <- err
			}()
			<-paused

			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			forced, err := st.guard.BeginForceRelease(ctx, namespace.Of(ns), id)
			cancel()
			if err == nil {
				// What the admin API does next, and what follows.
				_, ferr := st.store.ForceRelease(context.Background(), namespace.Of(ns), id, "stuck")
				forced()
				_, aerr := run(t, alice, sa, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}})
				release()
				werr := <-done
				var doc bson.M
				_ = alice.Database("shop").Collection(coll).FindOne(inSession(sa), bson.D{{"_id", 1}}).Decode(&doc)
				t.Fatalf("BeginForceRelease let a force-release through while a legacy write's implicit lock was taken and its write not yet forwarded (force-release: %v; acquireLock by another session meanwhile: %v; the legacy write then: %v, document %v)", ferr, aerr, werr, doc)
			}
			forced()
			release()
			if err := <-done; err != nil {
				t.Fatalf("the legacy write: %v", err)
			}
			if err := st.guard.WaitWritesOn(context.Background(), namespace.Of(ns), id); err != nil {
				t.Fatalf("WaitWritesOn once the write was answered: %v", err)
			}
		})
	}
}

// TestImplicitLockTakenDuringAForceReleaseIsRefused: the other side of
// BeginForceRelease. A legacy write that takes its implicit lock while an
// operator's force-release of that document is under way (the force-release
// found no write to wait for and is about to free the lock, which may by
// then be the write's) is refused, LockBusy and nothing written; once the
// force-release has ended, the same write goes through. Without the check
// the write is forwarded under a lock the force-release can free.
func TestImplicitLockTakenDuringAForceReleaseIsRefused(t *testing.T) {
	coll, pol := legacyPolicy(t, 1, config.UnlockedRefuseIfLocked, 0)
	st := startStackWith(t, stackOptions{policy: pol})
	ns := "shop." + coll
	id, err := docid.Of(int32(1))
	if err != nil {
		t.Fatal(err)
	}
	legacy := connect(t, st.uri, "legacy-batch").Database("shop").Collection(coll)
	forced, err := st.guard.BeginForceRelease(context.Background(), namespace.Of(ns), id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = legacy.UpdateOne(context.Background(), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "legacy"}}}})
	if err == nil || !strings.Contains(err.Error(), "an operator force-released the lock") {
		forced()
		t.Fatalf("a legacy write that took its implicit lock during a force-release of it: %v, want refused", err)
	}
	if got := qtyOf(t, coll, 1); got != 10 {
		t.Fatalf("qty = %d after the refused write, want 10", got)
	}
	var doc bson.M
	if err := legacy.FindOne(context.Background(), bson.D{{"_id", 1}}).Decode(&doc); err != nil || doc["by"] != nil {
		t.Fatalf("document after the refused write: %v, %v, want it untouched", doc, err)
	}
	forced()
	if _, err := legacy.UpdateOne(context.Background(), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "legacy"}}}}); err != nil {
		t.Fatalf("the legacy write once the force-release ended: %v", err)
	}
	if n, bound := st.guard.flights.Remembered(); n > bound {
		t.Fatalf("force-releases remembered after they ended and no write was taking locks: %d, want at most %d", n, bound)
	}
}
