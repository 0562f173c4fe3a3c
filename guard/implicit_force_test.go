package guard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"go.mongodb.org/mongo-driver/bson"
)

// TestForceReleaseWaitsForATakenImplicitLock: an operator's force-release
// (POST /locks/release: WaitWritesOn, then the store's ForceRelease) of a
// legacy write's implicit lock, taken but not yet forwarded (its write is
// being decided), must not free it: the write would leave afterwards and
// land inside the work of whoever took the document meanwhile. Both
// forms: a store lock (whose force-release would succeed) and a memory
// lock (which the store waits for by itself). WaitWritesOn must count the
// write as in flight from the moment its locks are taken; given 300 ms it
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
			err = st.guard.WaitWritesOn(ctx, ns, id)
			cancel()
			if err == nil {
				// What the admin API does next, and what follows.
				_, ferr := st.store.ForceRelease(context.Background(), ns, id, "stuck")
				_, aerr := run(t, alice, sa, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}})
				release()
				<-done
				t.Fatalf("WaitWritesOn let a force-release through while a legacy write's implicit lock was taken and its write not yet forwarded (force-release: %v; acquireLock by another session meanwhile: %v; the write then landed)", ferr, aerr)
			}
			release()
			if err := <-done; err != nil {
				t.Fatalf("the legacy write: %v", err)
			}
			if err := st.guard.WaitWritesOn(context.Background(), ns, id); err != nil {
				t.Fatalf("WaitWritesOn once the write was answered: %v", err)
			}
		})
	}
}
