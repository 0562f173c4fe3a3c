package lockstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMaxLocksPerSession: one session cannot take unbounded locks (issue
// 12, case 4: thousands of ids per session made endSessions cost minutes).
// Beyond Config.MaxLocksPerSession an acquire takes nothing; re-entrant
// acquires of held ids do not count again; a release makes room; other
// sessions are not affected.
func TestMaxLocksPerSession(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MaxLocksPerSession = 5
	s := openStore(t, cfg)
	ctx := context.Background()
	o, other := newOwner("greedy"), newOwner("other")
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 1, 2, 3), 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, o, namespace.Of("db.d"), ids(t, 4, 5), 0, 0); err != nil {
		t.Fatalf("up to the limit, across namespaces: %v", err)
	}
	_, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 6), 0, 0)
	if !errors.Is(err, ErrTooManyLocks) {
		t.Fatalf("sixth lock: %v, want ErrTooManyLocks", err)
	}
	if st, _ := s.Status(ctx, o, namespace.Of("db.c"), ids(t, 6)); st[0].Held {
		t.Error("the refused acquire took the lock")
	}
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 1, 2), 0, 0); err != nil {
		t.Errorf("re-entrant acquire of held ids at the limit: %v", err)
	}
	if _, err := s.Acquire(ctx, other, namespace.Of("db.c"), ids(t, 6, 7, 8, 9, 10), 0, 0); err != nil {
		t.Errorf("another session: %v", err)
	}
	if n, err := s.Release(ctx, o, namespace.Of("db.c"), ids(t, 1, 2), ""); err != nil || n != 2 {
		t.Fatalf("release = %d, %v", n, err)
	}
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 11, 12), 0, 0); err != nil {
		t.Errorf("after releasing two: %v", err)
	}
	if n, err := s.ReleaseSession(ctx, o.Session); err != nil || n != 5 {
		t.Fatalf("ReleaseSession = %d, %v, want 5", n, err)
	}
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 1, 2, 3, 4, 5), 0, 0); err != nil {
		t.Errorf("after the session ended: %v", err)
	}
}

// TestReleaseSessionCostsTheSessionsLocks: issue 12, case 4 ("endSessions
// and release-all scan the lock collection: 87 s with 3,900 junk
// records"). Ending a session used to query the lock collection by owner,
// once per session, on the caller's path; FerretDB answers such a query by
// scanning every record, and drivers end up to 10,000 sessions in one
// endSessions. Now the locks a session took through this instance are
// released from the owned index (the same round trips whatever the store
// holds), and one background query by owner serves every session ended
// meanwhile.
func TestReleaseSessionCostsTheSessionsLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sessions = 20
	cost := func(junk int) (releases, finds float64, took time.Duration) {
		m := NewMetrics()
		cfg := testConfig(t)
		cfg.CacheTrust = -1 // no background re-reads among the counted queries
		s := openStore(t, cfg, WithMetrics(m))
		if junk > 0 {
			now, _ := s.clock.Now()
			docs := make([]any, 0, junk)
			for i := range junk {
				o := newOwner("junk")
				g := &gen{Key: recordID(namespace.Of("db.junk"), fmt.Sprint(i)), Seq: 1, NS: "db.junk", Kind: kindAcquire,
					Owner: sessionBinary(o.Session), Token: 1, AcquiredAt: now, ExpiresAt: now.Add(time.Hour), At: now}
				if i%2 == 0 {
					g.Owner, g.ExpiresAt = nil, freeExpiry // released ones too
				}
				docs = append(docs, g.asHead())
			}
			if _, err := s.coll.InsertMany(ctx, docs); err != nil {
				t.Fatal(err)
			}
		}
		rts := func(op string) float64 { return testutil.ToFloat64(m.roundTrips.WithLabelValues(op, "ok")) }
		// Each session takes its lock just before it ends: a release
		// builds on the head it cached when it took the lock for 30 s
		// (guess), so on a machine slow enough to spend longer between
		// taking all 20 and releasing them, a release read the head first
		// and the count measured the machine, not the store's size.
		for i := range sessions {
			o := newOwner("victim")
			if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, i), 0, 0); err != nil {
				t.Fatal(err)
			}
			rel0, find0 := rts(opRelease), rts(opFind)
			start := time.Now()
			if n, err := s.ReleaseSession(ctx, o.Session); err != nil || n != 1 {
				t.Fatalf("ReleaseSession = %d, %v, want 1", n, err)
			}
			took += time.Since(start)
			releases += rts(opRelease) - rel0
			finds += rts(opFind) - find0
		}
		// The background sweep of the ended sessions is off the callers'
		// path; what it releases counts too.
		rel0 := rts(opRelease)
		testkit.Eventually(t, 60*time.Second, "the sweep of the ended sessions", s.sweeper.idle)
		return releases + rts(opRelease) - rel0, finds, took
	}
	// The race detector instruments the embedded FerretDB too, whose
	// every scan of the junk cost a minute of the race step with 1,000;
	// the count compared is the same with fewer.
	junk := 1000
	if raceEnabled {
		junk = 200
	}
	rq, fq, tq := cost(0)
	rj, fj, tj := cost(junk)
	t.Logf("ending %d sessions of 1 lock each: %v release round trips, %v queries on the caller's path, %v in an empty store; %v, %v, %v beside %d other records",
		sessions, rq, fq, tq, rj, fj, tj, junk)
	if rj != rq {
		t.Errorf("release round trips %v beside %d records, %v in an empty store: the cost depends on the store's size", rj, junk, rq)
	}
	if fq != 0 || fj != 0 {
		t.Errorf("ending %d sessions ran %v and %v queries on the caller's path: each session scans the lock collection", sessions, fq, fj)
	}
}

// TestReleaseSessionFindsLocksOfOtherInstances: a session that took a lock
// through another proxy is still released by endSessions here, by the
// background sweep.
func TestReleaseSessionFindsLocksOfOtherInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	a, b := openStore(t, cfg), openStore(t, cfg)
	o := newOwner("roamer")
	if _, err := a.Acquire(ctx, o, namespace.Of("db.c"), ids(t, 1, 2), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReleaseSession(ctx, o.Session); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the locks taken through the other instance to be released", func() bool {
		st, err := b.Status(ctx, newOwner("x"), namespace.Of("db.c"), ids(t, 1, 2))
		if err != nil {
			t.Fatal(err)
		}
		return !st[0].Held && !st[1].Held
	})
}
