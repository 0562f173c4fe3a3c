package lockstore

import (
	"errors"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// The tests in this file are about a writer (renew, release,
// force-release) that decides from a head document or cached head that
// is behind the key's claims. Readers find the newest claim (newest);
// before these tests a writer that declined on a stale head did not look,
// so the holder's own renewal or release was refused while the claims
// said it held the key, and a writer that met a head many generations
// behind walked them one insert at a time until it gave up.

// TestRenewAfterCachedReleaseElsewhere: a session releases a key through
// lockgate A, takes it again through lockgate B and renews through A. A's
// cache still shows its own release; the head document shows the new
// hold. Before, the renewal's step kept its first refusal ("it was
// released") when it was run again on the fresher head, and the holder's
// renewal was refused.
func TestRenewAfterCachedReleaseElsewhere(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	a, b := openStore(t, cfg), openStore(t, cfg)
	o := newOwner("app")
	const ns = "db.c"
	key := ids(t, "k")
	mustAcquire(t, a, o, ns, key, holdLease, 0)
	if n, err := a.Release(bg, o, namespace.Of(ns), key, ""); n != 1 || err != nil {
		t.Fatalf("release through A: %d %v", n, err)
	}
	mustAcquire(t, b, o, ns, key, holdLease, 0)
	locks, err := a.Renew(bg, o, namespace.Of(ns), key, holdLease)
	if err != nil || len(locks) != 1 {
		t.Fatalf("the holder's renewal through A: %v %v", locks, err)
	}
	if n, err := a.Release(bg, o, namespace.Of(ns), key, ""); n != 1 || err != nil {
		t.Fatalf("the holder's release through A: %d %v", n, err)
	}
}

// TestAcquireOverAHeadBehindARelease: a's release has landed as a claim
// but its head write is late, so the head document still shows a's hold.
// b's acquire must not be refused by a hold the claims say has ended.
// Before, it was refused (held by a) until a's lease ran out.
func TestAcquireOverAHeadBehindARelease(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s := []*Store{openStore(t, cfg), openStore(t, cfg)}
	a, b := newOwner("a"), newOwner("b")
	key := ids(t, "k")
	mustAcquire(t, s[0], a, "db.c", key, holdLease, 0)
	land := holdHeadWrite(s[0], kindRelease, func() error {
		_, err := s[0].Release(bg, a, namespace.Of("db.c"), key, "")
		return err
	})
	defer func() { _ = land() }()
	if _, err := s[1].Acquire(bg, b, namespace.Of("db.c"), key, holdLease, 0); err != nil {
		t.Fatalf("b's acquire after a's release: %v", err)
	}
}

// movedBackFree leaves key held by b with the head document moved back to
// a's release before it: a holds; a's release has its head write held;
// a's lease runs out (a fake clock) and b takes the key over through
// another store; then the release's head write lands. s[2] has never
// seen the key, so it starts from the head document.
func movedBackFree(t *testing.T) (s []*Store, b Owner) {
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.TakeoverGrace = time.Second
	clock := newFakeClock()
	s = []*Store{openStore(t, cfg, WithClock(clock)), openStore(t, cfg, WithClock(clock)), openStore(t, cfg, WithClock(clock))}
	a := newOwner("a")
	b = newOwner("b")
	key := ids(t, "k")
	mustAcquire(t, s[0], a, "db.c", key, 5*time.Second, 0)
	land := holdHeadWrite(s[0], kindRelease, func() error {
		n, err := s[0].Release(bg, a, namespace.Of("db.c"), key, "")
		if err == nil && n != 1 {
			t.Errorf("a's release freed %d", n)
		}
		return err
	})
	clock.Advance(10 * time.Second)
	mustAcquire(t, s[1], b, "db.c", key, holdLease, 0)
	if err := land(); err != nil {
		t.Fatalf("a's release: %v", err)
	}
	s[0].testHookHead = nil
	g, err := s[2].head(bg, ks(t, "db.c", key))
	if err != nil || g == nil || g.Owner != nil {
		t.Fatalf("set-up: the head document should show a's release, shows %+v (%v)", g, err)
	}
	return s, b
}

// TestHolderRenewsOverAMovedBackFreeHead: the head document shows a
// release that b's acquire followed; b renews through a lockgate that
// reads the head. Before, the renewal was refused ("it was released")
// although b held the key.
func TestHolderRenewsOverAMovedBackFreeHead(t *testing.T) {
	t.Parallel()
	s, b := movedBackFree(t)
	locks, err := s[2].Renew(bg, b, namespace.Of("db.c"), ids(t, "k"), holdLease)
	if err != nil || len(locks) != 1 {
		t.Fatalf("b's renewal: %v %v", locks, err)
	}
}

// TestHolderReleasesOverAMovedBackFreeHead: the same, with b's release,
// which freed nothing before and left the key held until its lease ran
// out.
func TestHolderReleasesOverAMovedBackFreeHead(t *testing.T) {
	t.Parallel()
	s, b := movedBackFree(t)
	if n, err := s[2].Release(bg, b, namespace.Of("db.c"), ids(t, "k"), ""); n != 1 || err != nil {
		t.Fatalf("b's release: %d %v", n, err)
	}
	if _, err := s[1].Acquire(bg, newOwner("c"), namespace.Of("db.c"), ids(t, "k"), holdLease, 0); err != nil {
		t.Fatalf("acquire after b's release: %v", err)
	}
}

// TestForceReleaseOverAHeadFarBehind: the head document is moved back 20
// generations behind the key's claims (a renewal's head write landing
// after 20 more renewals). A force-release through a lockgate that reads
// the head must still free the key. Before, it inserted claims one
// generation at a time, met a duplicate each time and gave up after
// maxRaces with "lock key changed too often during the call".
func TestForceReleaseOverAHeadFarBehind(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.NewcomerHorizon = noMemoryLocks
	s := []*Store{openStore(t, cfg), openStore(t, cfg), openStore(t, cfg)}
	a := newOwner("a")
	key := ids(t, "k")
	mustAcquire(t, s[0], a, "db.c", key, holdLease, 0)
	land := holdHeadWrite(s[0], kindRenew, func() error {
		_, err := s[0].Renew(bg, a, namespace.Of("db.c"), key, holdLease)
		return err
	})
	const ahead = 20
	for range ahead {
		if _, err := s[1].Renew(bg, a, namespace.Of("db.c"), key, holdLease); err != nil {
			t.Fatalf("renewal through s2: %v", err)
		}
	}
	if err := land(); err != nil {
		t.Fatalf("the late renewal: %v", err)
	}
	s[0].testHookHead = nil
	rid := ks(t, "db.c", key)
	h, err := s[2].head(bg, rid)
	if err != nil || h == nil {
		t.Fatalf("head: %+v %v", h, err)
	}
	n, err := s[2].newestClaim(bg, rid, h)
	if err != nil || n.Seq-h.Seq != ahead {
		t.Fatalf("set-up: head at %d, newest claim %+v (%v); want %d behind", h.Seq, n, err, ahead)
	}

	res, err := s[2].ForceRelease(bg, namespace.Of("db.c"), key[0], "test")
	if err != nil {
		t.Fatalf("force-release over a head %d behind: %v (%+v)", ahead, err, res)
	}
	if _, err := s[1].Acquire(bg, newOwner("c"), namespace.Of("db.c"), key, holdLease, 0); err != nil {
		var held *HeldError
		if errors.As(err, &held) {
			t.Fatalf("the key is still held after the force-release: %v", err)
		}
		t.Fatalf("acquire after the force-release: %v", err)
	}
}
