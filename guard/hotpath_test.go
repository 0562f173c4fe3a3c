package guard

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/lockstore"
)

// TestOwnerKeyCache: a remembered owner key is the keyed hash itself, one
// per (user, lsid), the memory stays bounded, and concurrent writers share
// the cache safely (run with -race).
func TestOwnerKeyCache(t *testing.T) {
	k := newOwnerKeys([]byte("0123456789abcdef0123456789abcdef"))
	lsid := func(i int) []byte { return []byte(fmt.Sprintf("%016d", i)) }
	for i := range 3 {
		for _, user := range []string{"", "alice", "bob"} {
			first := k.session(user, lsid(i))
			if again := k.session(user, lsid(i)); !bytes.Equal(first, again) || !bytes.Equal(first, k.derive(user, lsid(i))) {
				t.Fatalf("user %q lsid %d: remembered key differs from the derived one", user, i)
			}
		}
	}
	if bytes.Equal(k.session("alice", lsid(1)), k.session("bob", lsid(1))) {
		t.Fatal("two users share an owner key for one lsid")
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range maxKnownOwners/2 + 100 {
				if got := k.session("u", lsid(w*maxKnownOwners+i)); len(got) != 16 {
					t.Errorf("key of %d bytes", len(got))
					return
				}
			}
		}()
	}
	wg.Wait()
	k.mu.Lock()
	n := len(k.known)
	k.mu.Unlock()
	if n > maxKnownOwners {
		t.Fatalf("%d owner keys remembered, bound %d", n, maxKnownOwners)
	}
}

// TestFlightsOfOneSession: a session's writes in flight, launched and
// answered from many goroutines, keep releases waiting until the last is
// answered, and leave nothing behind (run with -race).
func TestFlightsOfOneSession(t *testing.T) {
	g, _ := flightGuard(t, time.Minute)
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	plan := func() *flightPlan { return &flightPlan{owner: owner, left: time.Minute} }
	held := g.launch(plan(), 0, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				g.launch(plan(), 0, nil).Reply(context.Background(), nil)
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := g.flights.waitSession(ctx, owner.Session); err == nil {
		t.Fatal("a release did not wait for the session's write still in flight")
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- g.flights.waitSession(context.Background(), owner.Session) }()
	held.Reply(context.Background(), nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end when the last write was answered")
	}
	g.flights.mu.Lock()
	defer g.flights.mu.Unlock()
	for _, sf := range g.flights.bySession {
		if len(sf.all) != 0 || sf.idle != nil {
			t.Fatalf("%d flights still tracked (idle channel %v)", len(sf.all), sf.idle != nil)
		}
	}
}

// TestIdleSessionsBounded: the sessions kept while idle (so that their next
// write allocates nothing) stay bounded, and an idle session's release does
// not wait.
func TestIdleSessionsBounded(t *testing.T) {
	g, _ := flightGuard(t, time.Minute)
	for i := range maxIdleSessions + 10 {
		owner := lockstore.Owner{Session: []byte(fmt.Sprintf("%016d", i))}
		g.launch(&flightPlan{owner: owner, left: time.Minute}, 0, nil).Reply(context.Background(), nil)
	}
	g.flights.mu.Lock()
	n := len(g.flights.bySession)
	g.flights.mu.Unlock()
	if n > maxIdleSessions {
		t.Fatalf("%d idle sessions kept, bound %d", n, maxIdleSessions)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.flights.waitSession(ctx, []byte(fmt.Sprintf("%016d", maxIdleSessions+9))); err != nil {
		t.Fatalf("a release waited for an idle session: %v", err)
	}
}
