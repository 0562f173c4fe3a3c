package lockstore

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestIdleHeadsAreCollected: issue 12, case 4 ("head records are never
// deleted"). The janitor deletes the head of a key nobody has held or
// changed for CleanupAfter, keeps held and recently changed ones, and a
// key locked again afterwards starts above every token it handed out
// before; a new life of the key steps over the janitor's tombstone.
func TestIdleHeadsAreCollected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newFakeClock()
	cfg := testConfig(t)
	cfg.CleanupInterval = -1 // the test runs the janitor
	s := openStore(t, cfg, WithClock(clk))
	o := newOwner("gc")
	tick := func() { clk.Advance(time.Millisecond) }

	// Key "idle": acquired, released, then left alone.
	first, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, "idle"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	tick()
	if _, err := s.Release(ctx, o, namespace.Of("db.c"), ids(t, "idle"), ""); err != nil {
		t.Fatal(err)
	}
	tick()
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, "held"), 10*time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	clk.Advance(cfg.CleanupAfter + time.Minute)
	if _, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, "young"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	tick()
	if _, err := s.Release(ctx, o, namespace.Of("db.c"), ids(t, "young"), ""); err != nil {
		t.Fatal(err)
	}

	n, err := s.CollectHeads(ctx)
	if err != nil || n != 1 {
		t.Fatalf("CollectHeads = %d, %v, want 1 (the idle key only)", n, err)
	}
	ks, _ := keys(namespace.Of("db.c"), ids(t, "idle", "held", "young"))
	for i, want := range []bool{false, true, true} {
		h, err := s.head(ctx, ks[i].rid)
		if err != nil {
			t.Fatal(err)
		}
		if (h != nil) != want {
			t.Errorf("key %d: head present %v, want %v", i, h != nil, want)
		}
	}
	if n, _ := s.CollectHeads(ctx); n != 0 {
		t.Errorf("a second pass collected %d", n)
	}

	// The key's new life: tokens above the old ones, and its generations
	// step over the tombstone the janitor left at the old head's next one.
	tick()
	o2 := newOwner("next")
	var last int64
	for i := range 4 {
		tick()
		l, err := s.Acquire(ctx, o2, namespace.Of("db.c"), ids(t, "idle"), time.Minute, 0)
		if err != nil {
			t.Fatalf("cycle %d: acquire after collection: %v", i, err)
		}
		if l[0].Token <= first[0].Token || l[0].Token <= last {
			t.Fatalf("cycle %d: token %d, earlier %d and %d: tokens went back", i, l[0].Token, first[0].Token, last)
		}
		last = l[0].Token
		tick()
		if n, err := s.Release(ctx, o2, namespace.Of("db.c"), ids(t, "idle"), ""); err != nil || n != 1 {
			t.Fatalf("cycle %d: release = %d, %v", i, n, err)
		}
	}
	h, err := s.head(ctx, ks[0].rid)
	if err != nil || h == nil || h.Seq < 4 {
		t.Fatalf("head after the new life: %+v, %v", h, err)
	}
}

// TestWriterOnABuriedHeadStartsAfresh: a writer that read a head just
// before the janitor buried it (its next generation is the tombstone)
// takes the key as new instead of going on from the buried state.
func TestWriterOnABuriedHeadStartsAfresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newFakeClock()
	cfg := testConfig(t)
	cfg.CleanupInterval = -1
	s := openStore(t, cfg, WithClock(clk))
	o := newOwner("stale")
	first, err := s.Acquire(ctx, o, namespace.Of("db.c"), ids(t, "k"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	if _, err := s.Release(ctx, o, namespace.Of("db.c"), ids(t, "k"), ""); err != nil {
		t.Fatal(err)
	}
	ks, _ := keys(namespace.Of("db.c"), ids(t, "k"))
	stale, err := s.head(ctx, ks[0].rid)
	if err != nil || stale == nil {
		t.Fatal(stale, err)
	}
	clk.Advance(cfg.CleanupAfter + time.Minute)
	if n, err := s.CollectHeads(ctx); err != nil || n != 1 {
		t.Fatalf("CollectHeads = %d, %v", n, err)
	}
	// The writer's view is the buried head, as if read just before.
	s.cache.put(ks[0].rid, holdEntry{g: stale, verified: time.Now()})
	clk.Advance(time.Millisecond)
	o2 := newOwner("late")
	l, err := s.Acquire(ctx, o2, namespace.Of("db.c"), ids(t, "k"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l[0].Token <= first[0].Token {
		t.Fatalf("token %d after the burial, %d before", l[0].Token, first[0].Token)
	}
	h, err := s.head(ctx, ks[0].rid)
	if err != nil || h == nil || h.Seq != 1 || !h.ownedBy(o2) {
		t.Fatalf("head %+v, %v: want the key's first generation of its new life, held by the writer", h, err)
	}
}
