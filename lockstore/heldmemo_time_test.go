package lockstore

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/lockgate/lockgate/namespace"
)

// stepWall is t, a reading of time.Now, as if the wall clock had been
// stepped by d (whole seconds) since: the same monotonic reading, the
// wall time moved. No clock can be stepped in a test, so the reading is
// edited in place; the edit is checked against time.Time's own methods.
func stepWall(t *testing.T, r time.Time, d time.Duration) time.Time {
	t.Helper()
	if !hasMonotonic(r) || d%time.Second != 0 {
		t.Fatal("stepWall takes a monotonic reading and whole seconds")
	}
	// time.Time's layout with a monotonic reading: wall holds the flag,
	// 33 bits of seconds since 1885 from bit 30, then nanoseconds.
	type rep struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	s := r
	p := (*rep)(unsafe.Pointer(&s))
	p.wall += uint64(int64(d/time.Second)) << 30
	if s.Sub(r) != 0 || !s.Round(0).Equal(r.Round(0).Add(d)) || !hasMonotonic(s) {
		t.Fatalf("stepWall: the edit is not a wall step (time.Time's layout changed?)")
	}
	return s
}

// TestHeldMemoTimesAnswerAsTimeDoes: a memo keeps its two times in eight
// bytes each, and answers what the time.Times it was filled with would:
// the lease left and "outlasts the margin" (time.Time's Sub and After:
// on the monotonic clock where both readings carry one, else on the
// wall clock), for a lease end that is a wall time (a store's clock) or
// a monotonic reading (memstore's local clock), read at a wall time, a
// monotonic reading, or one whose wall clock was stepped back or
// forward. A lease end kept as a wall time alone would outlast its end
// when the wall clock steps back; the one answer the memo may differ in
// is "not held" (ask the store), for a monotonic end read at a wall
// time.
func TestHeldMemoTimesAnswerAsTimeDoes(t *testing.T) {
	t.Parallel()
	var gen atomic.Uint64
	owner := newOwner("a")
	ns := namespace.Of("db.c")
	epoch := time.Now()
	const unc = 3 * time.Millisecond
	const margin = time.Second
	// Readings well after the store's epoch, and the same with the wall
	// clock stepped back since the epoch: a monotonic reading's offset
	// from the epoch is not its wall time's.
	for _, t0 := range []time.Time{epoch.Add(time.Hour), stepWall(t, epoch.Add(time.Hour), -2*time.Hour)} {
		for _, lease := range []time.Duration{-time.Minute, 0, margin + unc - 1, margin + unc, margin + unc + 1, time.Minute} {
			for _, eMono := range []bool{true, false} {
				expires := t0.Add(lease)
				if !eMono {
					expires = expires.Round(0)
				}
				var m HeldMemo
				m.Fill(&gen, 0, &owner, ns, "k", expires, 42, t0, epoch)
				if m.counter == nil || m.Token() != 42 {
					t.Fatalf("lease %s (monotonic %v): not filled", lease, eMono)
				}
				for _, at := range []struct {
					name string
					t    time.Time
				}{
					{"monotonic", t0},
					{"wall", t0.Round(0)},
					{"wall stepped back", stepWall(t, t0, -2*time.Hour)},
					{"wall stepped forward", stepWall(t, t0, 2*time.Hour)},
				} {
					name := fmt.Sprintf("lease %s (monotonic %v) read at %s, %s", lease, eMono, at.name, t0.Round(0).Sub(epoch.Round(0)))
					want := expires.After(at.t.Add(unc + margin))
					left, ok := m.LeaseLeft(epoch, at.t, unc, margin)
					if ok && !want {
						t.Fatalf("%s: held, time.Time says not", name)
					}
					if eMono && !hasMonotonic(at.t) {
						continue // may ask the store
					}
					if ok != want {
						t.Fatalf("%s: held %v, time.Time says %v", name, ok, want)
					}
					if w := expires.Add(-unc).Sub(at.t); ok && left != w {
						t.Fatalf("%s: %s left, time.Time says %s", name, left, w)
					}
				}
			}
		}
	}
	// Wall times centuries apart: their difference overflows int64
	// nanoseconds, and a lease that ended long ago must not wrap around
	// to a long one.
	var old HeldMemo
	old.Fill(&gen, 0, &owner, ns, "k", time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC), 42, epoch, epoch)
	if _, ok := old.LeaseLeft(epoch, time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC), unc, margin); ok || old.counter == nil {
		t.Fatalf("a lease that ended in 1700 is held in 2250 (filled %v)", old.counter != nil)
	}
	// The lease end a memo cannot keep leaves it empty (never a hit).
	var m HeldMemo
	m.Fill(&gen, 0, &owner, ns, "k", time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), 42, epoch, epoch)
	if m.counter != nil {
		t.Fatal("a lease end past 2262 fills a memo")
	}
}

// TestHeldMemoTrustAnswersAsTimeDoes: a memo's confirmation is trusted
// exactly while local.Sub(confirmed) <= trust, at the bound's edge, for
// a confirmation with a monotonic reading and one without, and when the
// wall clock was stepped since (a monotonic confirmation is measured on
// the monotonic clock: a step back must not stretch the trust). A
// confirmation the memo cannot keep (the zero Time: none kept) is never
// trusted.
func TestHeldMemoTrustAnswersAsTimeDoes(t *testing.T) {
	t.Parallel()
	var gen atomic.Uint64
	owner := newOwner("a")
	ns := namespace.Of("db.c")
	epoch := time.Now()
	t0 := epoch.Add(time.Hour)
	const trust = 10 * time.Second
	for _, cMono := range []bool{true, false} {
		confirmed := t0
		if !cMono {
			confirmed = confirmed.Round(0)
		}
		var m HeldMemo
		m.Fill(&gen, 0, &owner, ns, "k", t0.Add(time.Hour), 1, confirmed, epoch)
		for _, since := range []time.Duration{-time.Second, 0, trust - 1, trust, trust + 1, time.Minute} {
			for _, step := range []time.Duration{0, -time.Hour, time.Hour} {
				local := t0.Add(since)
				if step != 0 {
					local = stepWall(t, local, step)
				}
				want := local.Sub(confirmed) <= trust
				if got := m.Trusted(epoch, local, trust); got != want {
					t.Fatalf("confirmed (monotonic %v) %s before a reading stepped %s: trusted %v, time.Time says %v", cMono, since, step, got, want)
				}
			}
		}
	}
	var m HeldMemo
	m.Fill(&gen, 0, &owner, ns, "k", t0.Add(time.Hour), 1, time.Time{}, epoch)
	for _, trust := range []time.Duration{trust, 1<<63 - 1} {
		if m.Trusted(epoch, time.Now(), trust) {
			t.Fatalf("no confirmation kept, trusted for %s", trust)
		}
	}
}

// TestHeldMemoCacheTrustEdge: through the store's memo check on its own
// clock (the monotonic path), a memo confirmed exactly CacheTrust before
// the caller's reading is held, and one nanosecond more is not.
func TestHeldMemoCacheTrustEdge(t *testing.T) {
	t.Parallel()
	const trust = 10 * time.Second
	s := &Store{cfg: Config{CacheTrust: trust}, cache: newHoldCache(nil), epoch: time.Now()}
	s.sclock = newServerClock(nil)
	s.clock = s.sclock
	sent := time.Now()
	s.sclock.add(clockSample{sent: sent, recv: sent.Add(time.Millisecond), server: sent})
	if s.monotonicEstimate() == nil {
		t.Fatal("the store's own clock is not read on the monotonic clock")
	}
	owner := newOwner("a")
	ns := namespace.Of("db.c")
	id := rv(t, "x")
	confirmed := time.Now()
	var ms HeldMemos
	m, _ := ms.Find(&s.cache.gen, &owner, ns, &id)
	m.Fill(&s.cache.gen, s.cache.gen.Load(), &owner, ns, id.Key(), time.Now().Add(time.Hour).Round(0), 42, confirmed, s.epoch)
	for _, c := range []struct {
		after time.Duration
		held  bool
	}{{0, true}, {trust, true}, {trust + 1, false}} {
		if _, _, ok := s.HeldTokenMemo(&ms, &owner, ns, &id, time.Second, confirmed.Add(c.after)); ok != c.held {
			t.Fatalf("%s after the confirmation: held %v, want %v", c.after, ok, c.held)
		}
	}
}
