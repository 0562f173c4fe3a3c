package inflight

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestFlightsOfOneSession: a session's writes in flight, launched and
// answered from many goroutines, keep releases waiting until the last is
// answered, and leave nothing behind (run with -race).
func TestFlightsOfOneSession(t *testing.T) {
	tr := New(Config{})
	owner := lockstore.Owner{Session: []byte("0123456789abcdef")}
	launch := func() *Flight {
		f := &Flight{Owner: owner, Left: time.Minute}
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
		if len(sf.all) != 0 || sf.idle != nil {
			t.Fatalf("%d flights still tracked (idle channel %v)", len(sf.all), sf.idle != nil)
		}
	}
}

// TestIdleSessionsBounded: the sessions kept while idle (so that their next
// write allocates nothing) stay bounded, and an idle session's release does
// not wait.
func TestIdleSessionsBounded(t *testing.T) {
	tr := New(Config{})
	for i := range maxIdleSessions + 10 {
		f := &Flight{Owner: lockstore.Owner{Session: []byte(fmt.Sprintf("%016d", i))}, Left: time.Minute}
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
