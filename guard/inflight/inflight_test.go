package inflight

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/namespace"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestFlightsOfOneSession: a session's writes in flight, launched and
// answered from many goroutines, keep releases waiting until the last is
// answered, and leave nothing behind (run with -race).
func TestFlightsOfOneSession(t *testing.T) {
	tr := New(Config{})
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	launch := func() *Flight {
		f := &Flight{Owner: &owner, Left: time.Minute}
		tr.Launch(f, nil, false, 0, time.Now(), 0, nil)
		return f
	}
	held := launch()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				launch().Reply(context.Background(), nil)
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := tr.WaitSession(ctx, owner.Session); err == nil {
		t.Fatal("a release did not wait for the session's write still in flight")
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- tr.WaitSession(context.Background(), owner.Session) }()
	held.Reply(context.Background(), nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end when the last write was answered")
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, sf := range tr.bySession {
		sf.mu.Lock()
		n, idle := len(sf.all), sf.idle != nil
		sf.mu.Unlock()
		if n != 0 || idle {
			t.Fatalf("%d flights still tracked (idle channel %v)", n, idle)
		}
	}
}

// TestIdleSessionsBounded: the sessions kept while idle (so that their next
// write allocates nothing) stay bounded, and an idle session's release does
// not wait.
func TestIdleSessionsBounded(t *testing.T) {
	tr := New(Config{})
	for i := range maxIdleSessions + 10 {
		f := &Flight{Owner: &lockstore.Owner{Session: []byte(fmt.Sprintf("%016d", i))}, Left: time.Minute}
		tr.Launch(f, nil, false, 0, time.Now(), 0, nil)
		f.Reply(context.Background(), nil)
	}
	tr.mu.Lock()
	n := len(tr.bySession)
	tr.mu.Unlock()
	if n > maxIdleSessions {
		t.Fatalf("%d idle sessions kept, bound %d", n, maxIdleSessions)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tr.WaitSession(ctx, []byte(fmt.Sprintf("%016d", maxIdleSessions+9))); err != nil {
		t.Fatalf("a release waited for an idle session: %v", err)
	}
}

// TestKeptSessionEntry: a write launched with its session's entry kept
// from an earlier one (Flight.Session, no look-up under the tracker's
// mutex) is in flight for releases and force-releases like any other,
// and an entry the tracker dropped while idle is not used: a flight put
// there would be invisible to them.
func TestKeptSessionEntry(t *testing.T) {
	tr := New(Config{})
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	id := lockstoretest.ID(int32(7))
	launch := func(kept *Session) *Flight {
		f := &Flight{Owner: &owner, Left: time.Minute, Session: kept, Locks: Locks{{NS: namespace.Of("db.c"), IDs: []docid.ID{id}}}}
		if !tr.Launch(f, nil, true, tr.ForceSeq(), time.Now(), 0, nil) {
			t.Fatal("launch refused")
		}
		if f.Session == nil {
			t.Fatal("the launch left no session entry to keep")
		}
		return f
	}
	waits := func() (session, key bool) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // asks, does not wait
		return tr.WaitSession(ctx, owner.Session) != nil, tr.WaitKey(ctx, namespace.Of("db.c"), id) != nil
	}
	first := launch(nil)
	kept := first.Session
	first.Reply(context.Background(), nil)
	if s, k := waits(); s || k {
		t.Fatalf("waits for a landed write: session %v, key %v", s, k)
	}
	second := launch(kept)
	if second.Session != kept {
		t.Fatal("the kept entry was not used")
	}
	if s, k := waits(); !s || !k {
		t.Fatalf("a write launched with the kept entry is not waited for: session %v, key %v", s, k)
	}
	second.Reply(context.Background(), nil)
	// Enough other sessions that the next new one drops every idle
	// entry, the kept one included.
	for i := range maxIdleSessions + 1 {
		f := &Flight{Owner: &lockstore.Owner{Session: []byte(fmt.Sprintf("%016d", i))}, Left: time.Minute}
		tr.Launch(f, nil, false, 0, time.Now(), 0, nil)
		f.Reply(context.Background(), nil)
	}
	kept.mu.Lock()
	dropped := kept.dropped
	kept.mu.Unlock()
	if !dropped {
		t.Fatal("the kept entry was not dropped; the test needs it dropped")
	}
	third := launch(kept)
	if s, k := waits(); !s || !k {
		t.Fatalf("a write launched with a dropped entry is not waited for: session %v, key %v", s, k)
	}
	third.Reply(context.Background(), nil)
}

// TestLaunchMeetsForceReleaseUnderWay: a lock holder's write checked while
// a force-release of its lock was already under way (its sequence number
// read after the force-release began) is refused at its launch, though no
// force-release began since.
func TestLaunchMeetsForceReleaseUnderWay(t *testing.T) {
	tr := New(Config{})
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	id := lockstoretest.ID(int32(7))
	done := tr.Forcing(namespace.Of("db.c"), id)
	seq := tr.ForceSeq()
	f := &Flight{Owner: &owner, Left: time.Minute, Locks: Locks{{NS: namespace.Of("db.c"), IDs: []docid.ID{id}}}}
	if tr.Launch(f, nil, true, seq, time.Now(), 0, nil) {
		t.Fatal("a write launched under a lock whose force-release is under way")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tr.WaitKey(ctx, namespace.Of("db.c"), id); err != nil {
		t.Fatal("the refused write is still in flight")
	}
	done()
	g := &Flight{Owner: &owner, Left: time.Minute, Locks: Locks{{NS: namespace.Of("db.c"), IDs: []docid.ID{id}}}}
	if !tr.Launch(g, nil, true, tr.ForceSeq(), time.Now(), 0, nil) {
		t.Fatal("a write checked after the force-release ended was refused")
	}
	g.Reply(context.Background(), nil)
}

// landings records what a flight's lander heard.
type landings struct {
	mu  sync.Mutex
	got []string
}

func (l *landings) Landed(answered, reusable bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf("answered %v reusable %v", answered, reusable))
}

func (l *landings) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.got)
}

// renewSignal is a lock store whose renewals are signalled.
type renewSignal struct{ renewed chan struct{} }

func (r *renewSignal) Renew(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) ([]lockstore.Lock, error) {
	select {
	case r.renewed <- struct{}{}:
	default:
	}
	return nil, nil
}

// TestLandedReusableOnlyUnrenewed: a flight answered before any renewal
// of its locks started tells its lander that what it lent may be taken
// back (reusable), once, however often it is answered; a flight whose
// renewal started does not, as the renewal may still read its locks and
// owner; an abandoned flight's landing is not an answer.
func TestLandedReusableOnlyUnrenewed(t *testing.T) {
	store := &renewSignal{renewed: make(chan struct{}, 1)}
	tr := New(Config{Store: store, MaxInFlight: time.Minute})
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	locks := Locks{{NS: namespace.Of("shop.orders"), IDs: lockstoretest.IDs(int32(1))}}
	launch := func(left time.Duration) (*Flight, *landings) {
		l := &landings{}
		f := &Flight{Owner: &owner, Left: left, Locks: locks}
		if !tr.Launch(f, l, false, 0, time.Now(), 0, nil) {
			t.Fatal("not launched")
		}
		return f, l
	}

	quick, ql := launch(time.Hour)
	quick.Reply(context.Background(), nil)
	quick.Reply(context.Background(), nil)
	quick.land()
	if got, want := ql.String(), "[answered true reusable true]"; got != want {
		t.Errorf("answered before its renewal: lander heard %s, want %s", got, want)
	}

	slow, sl := launch(20 * time.Millisecond) // its first renewal is due in 10 ms
	select {
	case <-store.renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("the flight's locks were never renewed")
	}
	slow.Reply(context.Background(), nil)
	if got, want := sl.String(), "[answered true reusable false]"; got != want {
		t.Errorf("answered after its renewal started: lander heard %s, want %s", got, want)
	}

	abandoned, al := launch(time.Hour)
	abandoned.land()
	if got, want := al.String(), "[answered false reusable true]"; got != want {
		t.Errorf("abandoned: lander heard %s, want %s", got, want)
	}

	// Abandoned, its timer armed, then answered after all: the timer
	// outlives the landing, so the flight's room is not reusable.
	late, ll := launch(time.Hour)
	late.Abandon()
	late.Reply(context.Background(), nil)
	if got, want := ll.String(), "[answered true reusable false]"; got != want {
		t.Errorf("answered after it was abandoned: lander heard %s, want %s", got, want)
	}
}
