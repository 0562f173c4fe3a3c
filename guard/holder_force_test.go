package guard

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// pausingTrail takes every record at once, except that, once armed, the
// first required record (Commit) waits for resume once paused is closed:
// a write held between its lock check and its launch, for as long as the
// test likes.
type pausingTrail struct {
	armed          atomic.Bool
	paused, resume chan struct{}
	mu             sync.Mutex
	got            []audittrail.Event // every record, in order
}

func (p *pausingTrail) Append(ev audittrail.Event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, ev)
	return true
}

func (p *pausingTrail) Commit(_ context.Context, ev audittrail.Event) error {
	if p.armed.CompareAndSwap(true, false) {
		close(p.paused)
		<-p.resume
	}
	p.Append(ev)
	return nil
}

// verdicts are the records' verdicts and reasons on ns, in order.
func (p *pausingTrail) verdicts(ns string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, ev := range p.got {
		if ev.Kind == audittrail.KindDecision && ev.NS == ns {
			out = append(out, ev.Verdict+" "+ev.Reason)
		}
	}
	return out
}

// TestForceReleaseDuringAHoldersCheckedWriteRefusesIt: a lock holder's
// write has passed its lock check and waits for its required audit record
// (not yet launched, so no force-release can see it in flight); an
// operator force-releases the lock through the path of the admin API
// (BeginForceRelease, the store's ForceRelease), another session takes
// the document and writes. The first write, let go, must be refused
// (LockBusy, not_locked, nothing written): forwarded, it would land
// inside the new holder's work, under a lock it no longer has.
func TestForceReleaseDuringAHoldersCheckedWriteRefusesIt(t *testing.T) {
	coll, pol := protected(t, 1)
	pol.Namespaces[0].AuditRequired = true
	tr := &pausingTrail{paused: make(chan struct{}), resume: make(chan struct{})}
	var resumed sync.Once
	release := func() { resumed.Do(func() { close(tr.resume) }) }
	t.Cleanup(release)
	st := startStackWith(t, stackOptions{policy: pol, trail: tr})
	ns := "shop." + coll
	id, err := docid.Of(int32(1))
	if err != nil {
		t.Fatal(err)
	}
	alice := connect(t, st.uri, "alice")
	sa := session(t, alice)
	bob := connect(t, st.uri, "bob")
	sb := session(t, bob)
	acquire(t, alice, sa, coll, 1)

	tr.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := alice.Database("shop").Collection(coll).UpdateOne(inSession(sa),
			bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "alice"}}}})
		done <- err
	}()
	<-tr.paused // alice's write passed its check; its record is not durable yet

	forced, err := st.guard.BeginForceRelease(context.Background(), namespace.Of(ns), id)
	if err != nil {
		forced()
		t.Fatalf("BeginForceRelease: %v (no write of the lock is in flight yet)", err)
	}
	if _, err := st.store.ForceRelease(context.Background(), namespace.Of(ns), id, "stuck"); err != nil {
		forced()
		t.Fatalf("the store's ForceRelease: %v", err)
	}
	forced()
	acquire(t, bob, sb, coll, 1)
	if _, err := bob.Database("shop").Collection(coll).UpdateOne(inSession(sb),
		bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "bob"}}}}); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}

	release()
	aerr := <-done
	var doc bson.M
	if err := bob.Database("shop").Collection(coll).FindOne(inSession(sb), bson.D{{"_id", 1}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if aerr == nil || doc["by"] != "bob" {
		t.Fatalf("the former holder's write, checked before the force-release and let go after another session took the lock: %v, document %v; want it refused and the new holder's write standing", aerr, doc)
	}
	refusedFor(t, aerr, enforce.ReasonNotLocked)
	if !strings.Contains(aerr.Error(), "an operator force-released the lock") {
		t.Fatalf("refusal %q, want it to say that an operator force-released the lock while the write was being checked", aerr)
	}
	// The trail holds alice's allow record, made durable before the
	// force-release, and then her write's refusal: evidence must not say
	// that a write which never reached the database was allowed and
	// leave it at that.
	if got := tr.verdicts(ns); len(got) < 2 || got[len(got)-1] != audittrail.VerdictReject+" "+enforce.ReasonNotLocked {
		t.Fatalf("the trail's records on %s: %q; want the refusal at launch last", ns, got)
	}
	if n, bound := st.guard.flights.Remembered(); n > bound {
		t.Fatalf("%d force-releases remembered, want at most %d", n, bound)
	}
}
