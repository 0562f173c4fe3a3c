package lockstore

import (
	"errors"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestFirstTokensOfTwoStoresOverAStamp: a new key's first fencing token is
// the server clock in nanoseconds as its lock store estimates it. Two lock
// stores that share no collection (two lockgates with lock stores of their
// own in front of one fenced collection: a partition, as tests/reliability
// TestFenceOnAPoisonedField makes one) only share the document's fence
// stamp. When the store whose estimate is behind grants the later lock,
// its token is below the stamp the earlier holder's acquire wrote, and the
// later holder's stamp is refused: fail closed, but the legitimate holder
// is refused until its token passes the stamp (by one per retry: millions
// of retries for a millisecond of estimate error). WithTokenFloors gives the
// acquire the stamp the caller read as a floor: a grant to a new holder gets a token
// above it. The clocks are injected, 5 ms apart; nothing sleeps.
func TestFirstTokensOfTwoStoresOverAStamp(t *testing.T) {
	t.Parallel()
	behind := newFakeClock()
	ahead := &fakeClock{t: behind.t.Add(5 * time.Millisecond)}
	sa := openStore(t, testConfig(t), WithClock(ahead))
	sb := openStore(t, testConfig(t), WithClock(behind))
	const ns = "db.c"
	key := ids(t, 7, "other")

	first, err := sa.Acquire(bg, newOwner("a"), namespace.Of(ns), key, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	stamp := first[0].Token // what a's acquire stamps into the document
	behind.Advance(time.Millisecond)
	ahead.Advance(time.Millisecond)

	// Without a floor the later grant comes out below the stamp.
	b := newOwner("b")
	plain, err := sb.Acquire(bg, b, namespace.Of(ns), key[:1], time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if plain[0].Token > stamp {
		t.Fatalf("the later plain grant has token %d above the stamp %d: the clocks no longer make the case", plain[0].Token, stamp)
	}
	if _, err := sb.Release(bg, b, namespace.Of(ns), key[:1], ""); err != nil {
		t.Fatal(err)
	}

	c := newOwner("c")
	// A first life on the other key, a next generation on the first.
	got, err := sb.Acquire(WithTokenFloors(bg, []int64{stamp, first[1].Token}), c, namespace.Of(ns), key, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range got {
		want := []int64{stamp, first[1].Token}[i]
		if l.Token <= want {
			t.Errorf("%v: the grant over a stamp of %d has token %d", l.ID, want, l.Token)
		}
	}
	// Re-entrant: the holder's token stays.
	again, err := sb.Acquire(WithTokenFloors(bg, []int64{got[0].Token + 10}), c, namespace.Of(ns), key[:1], time.Minute, 0)
	if err != nil || again[0].Token != got[0].Token {
		t.Errorf("re-entrant acquire over a higher stamp: %+v %v, want the token %d kept", again, err, got[0].Token)
	}
	// The next grant goes on from the raised token.
	if _, err := sb.Release(bg, c, namespace.Of(ns), key, ""); err != nil {
		t.Fatal(err)
	}
	next, err := sb.Acquire(bg, newOwner("d"), namespace.Of(ns), key[:1], time.Minute, 0)
	if err != nil || next[0].Token <= got[0].Token {
		t.Errorf("the next grant: %+v %v, want a token above %d", next, err, got[0].Token)
	}
	// A stamp no store's clock could have made (far above the server's
	// time: written by hand) is no floor: the grant stays as it was and
	// the caller's stamp fails, as before.
	e := newOwner("e")
	far := ids(t, "far")
	l, err := sb.Acquire(WithTokenFloors(bg, []int64{1 << 62}), e, namespace.Of(ns), far, time.Minute, 0)
	if err != nil || l[0].Token >= 1<<62 {
		t.Errorf("a grant over an implausible stamp: %+v %v, want the clock's token", l, err)
	}
	if _, err := sb.Acquire(WithTokenFloors(bg, []int64{1, 2}), e, namespace.Of(ns), far, time.Minute, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("floors that do not match the ids: %v", err)
	}
}
