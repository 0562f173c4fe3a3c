package lockstore

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestHeldMemoMonotonicCheck: a memo's check read on the monotonic clock
// alone (one time.Since of the clock sample's midpoint) answers what the
// check on a full time.Now answers: the lease left on the server's clock
// less the estimate's uncertainty, and the cache's trust measured from
// the confirmation. A confirmation without a monotonic reading takes the
// full reading.
func TestHeldMemoMonotonicCheck(t *testing.T) {
	t.Parallel()
	const trust = 10 * time.Second
	const margin = time.Second
	s := &Store{cfg: Config{CacheTrust: trust}, cache: newHoldCache(nil), epoch: time.Now()}
	s.sclock = newServerClock(nil)
	s.clock = s.sclock
	// The server is 1h ahead; the round trip took 400 ms, so the estimate
	// is uncertain by 200 ms + 1 ms and more than the slack of the cases.
	sent := time.Now()
	s.sclock.add(clockSample{sent: sent, recv: sent.Add(400 * time.Millisecond), server: sent.Add(time.Hour + 200*time.Millisecond)})
	if s.monotonicEstimate() == nil {
		t.Fatal("the store's own clock is not read on the monotonic clock")
	}
	owner := newOwner("a")
	ns := namespace.Of("db.c")
	id := rv(t, "x")
	server := func() time.Time { n, _ := s.clock.Now(); return n }
	for _, c := range []struct {
		name      string
		expires   time.Duration // from the server's now
		confirmed time.Duration // before the local now
		held      bool
	}{
		{"held", time.Minute, trust / 2, true},
		{"confirmed too long ago", time.Minute, 2 * trust, false},
		// Within margin plus the uncertainty (201 ms) but not margin: a
		// check that forgets the uncertainty says held.
		{"lease within the uncertainty", margin + 100*time.Millisecond, trust / 2, false},
		{"lease within the margin", margin / 2, trust / 2, false},
		{"lease past the uncertainty", margin + 2*time.Second, trust / 2, true},
	} {
		for _, mono := range []bool{true, false} {
			confirmed := time.Now().Add(-c.confirmed)
			if !mono {
				confirmed = confirmed.Round(0)
			}
			expires := server().Add(c.expires).Round(0) // a server time: no monotonic reading
			var ms HeldMemos
			m, _ := ms.Find(&s.cache.gen, &owner, ns, &id)
			m.Fill(&s.cache.gen, s.cache.gen.Load(), &owner, ns, id.Key(), expires, 42, confirmed, s.epoch)
			// The caller's reading, or none (the store reads the clock).
			for _, now := range []time.Time{time.Now(), {}} {
				left, tok, ok := s.HeldTokenMemo(&ms, &owner, ns, &id, margin, now)
				if ok != c.held {
					t.Fatalf("%s (monotonic %v, caller's reading %v): held %v, want %v", c.name, mono, !now.IsZero(), ok, c.held)
				}
				if !ok {
					continue
				}
				// The lease left is the server's less the uncertainty.
				want := c.expires - 201*time.Millisecond
				if tok != 42 || left > want || left < want-time.Second {
					t.Fatalf("%s (monotonic %v): token %d, left %s, want 42 and about %s", c.name, mono, tok, left, want)
				}
			}
			if !c.held || !mono {
				continue
			}
			// The answer is for the caller's instant, not the clock's: a
			// reading past the cache's trust, or past the lease less the
			// margin, is not held (a check that read its own clock, or
			// ignored the caller's, would say held).
			for _, ahead := range []time.Duration{trust, c.expires} {
				if _, _, ok := s.HeldTokenMemo(&ms, &owner, ns, &id, margin, time.Now().Add(ahead)); ok {
					t.Fatalf("%s: held for a reading %s ahead", c.name, ahead)
				}
			}
		}
	}
}

// TestHeldMemosFindComparesEveryField: a memo is the store's answer only
// for the very lock check it recorded: another store, generation, owner
// session or binding, namespace or _id is never a hit (it would answer
// "held" for a lock the asker does not hold). Each field is left out of
// Find's compare in turn by the mutations this test was checked against.
func TestHeldMemosFindComparesEveryField(t *testing.T) {
	t.Parallel()
	// Two stores' generation counters, the one at 7.
	var s, other atomic.Uint64
	s.Store(7)
	other.Store(7)
	a := Owner{Session: []byte("session a"), Bind: "txn 1"}
	ns := namespace.Of("db.c")
	id := rv(t, "x")
	var ms HeldMemos
	m, hit := ms.Find(&s, &a, ns, &id)
	if hit {
		t.Fatal("an empty memo is a hit")
	}
	m.Fill(&s, 7, &a, ns, id.Key(), time.Now().Add(time.Minute), 42, time.Now(), time.Now())
	if got, hit := ms.Find(&s, &a, ns, &id); !hit || got != m {
		t.Fatalf("the memo's own check: hit %v, the same memo %v", hit, got == m)
	}
	sessionB := Owner{Session: []byte("session b"), Bind: a.Bind}
	sameLen := Owner{Session: []byte("session z"), Bind: a.Bind} // differs in the last byte only
	bind := Owner{Session: a.Session, Bind: "txn 2"}
	noBind := Owner{Session: a.Session}
	// A copy of the owner key: compared by value, not by address.
	copied := Owner{Session: append([]byte(nil), a.Session...), Bind: a.Bind}
	y, X := rv(t, "y"), rv(t, "X")
	for _, c := range []struct {
		name    string
		counter *atomic.Uint64
		owner   *Owner
		ns      namespace.Namespace
		id      *docid.ID
	}{
		{"another store", &other, &a, ns, &id},
		{"another session", &s, &sessionB, ns, &id},
		{"a session differing in its last byte", &s, &sameLen, ns, &id},
		{"another binding", &s, &bind, ns, &id},
		{"no binding", &s, &noBind, ns, &id},
		{"another namespace", &s, &a, namespace.Of("db.d"), &id},
		{"another database", &s, &a, namespace.Of("dc.c"), &id},
		{"another _id", &s, &a, ns, &y},
		{"an _id differing in case", &s, &a, ns, &X},
	} {
		if _, hit := ms.Find(c.counter, c.owner, c.ns, c.id); hit {
			t.Fatalf("%s: a hit", c.name)
		}
	}
	if _, hit := ms.Find(&s, &copied, ns, &id); !hit {
		t.Fatal("the same owner key at another address is not a hit")
	}
	// Another lock fills another memo; the memo of a lock whoever held it
	// is the one refilled, so that no two memos are of one lock.
	if got, _ := ms.Find(&s, &a, ns, &y); got == m {
		t.Fatal("another _id is given the memo of x to fill")
	}
	if got, _ := ms.Find(&s, &sessionB, ns, &id); got != m {
		t.Fatal("another session's check of x is not given x's memo to fill")
	}
	// Any change through the store moves its generation: the memo is
	// no longer its answer.
	s.Add(1)
	if _, hit := ms.Find(&s, &a, ns, &id); hit {
		t.Fatal("a hit after the store's generation moved")
	}
}

// TestHeldMemosKeepTheirTags: the memos are found by their ids' tags
// first (docid.ID.TagAt), so a slot's tag must stay its memo's: an id
// checked over and over without filling a memo (a lock the store's memory
// cannot vouch for) keeps the one slot it was given and does not take
// the memo of a document that is held, and an id of the same document
// made another way (a batch's copy, not New) finds the memo.
func TestHeldMemosKeepTheirTags(t *testing.T) {
	t.Parallel()
	var s atomic.Uint64
	s.Store(3)
	a := Owner{Session: []byte("session a")}
	ns := namespace.Of("db.c")
	x := rv(t, "doc-000001")
	var ms HeldMemos
	m, _ := ms.Find(&s, &a, ns, &x)
	m.Fill(&s, 3, &a, ns, x.Key(), time.Now().Add(time.Minute), 1, time.Now(), time.Now())
	for i := range 3 * heldMemoSlots {
		y := rv(t, fmt.Sprintf("doc-%06d", 2+i%2)) // two ids never held
		if _, hit := ms.Find(&s, &a, ns, &y); hit {
			t.Fatalf("%v: a hit", y)
		}
	}
	copied, err := docid.Copy([]bsoncore.Value{{Type: bson.TypeInt32, Data: bsoncore.AppendInt32(nil, 5)}, x.Core()})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []docid.ID{x, copied[1]} {
		if got, hit := ms.Find(&s, &a, ns, &id); !hit || got != m {
			t.Fatalf("x's memo after other ids' misses: hit %v, the same memo %v", hit, got == m)
		}
	}
}
