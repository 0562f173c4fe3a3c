package lockstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

func TestBackoffBoundsAndJitter(t *testing.T) {
	t.Parallel()
	b := newBackoff(5*time.Millisecond, 250*time.Millisecond)
	ceil := 5 * time.Millisecond
	distinct := map[time.Duration]bool{}
	for i := range 20 {
		d := b.next()
		if d < ceil/2 || d > ceil {
			t.Fatalf("step %d: %v outside [%v, %v]", i, d, ceil/2, ceil)
		}
		distinct[d] = true
		ceil = min(ceil*2, 250*time.Millisecond)
	}
	if len(distinct) < 5 {
		t.Fatalf("no jitter: %v", distinct)
	}
	b.reset()
	if d := b.next(); d > 5*time.Millisecond {
		t.Fatalf("after reset %v, want <= 5ms", d)
	}
	// Deterministic extremes.
	b = newBackoff(4*time.Millisecond, 16*time.Millisecond)
	b.rand = func(n int64) int64 { return n - 1 }
	want := []time.Duration{4, 8, 16, 16}
	for i, w := range want {
		if d := b.next(); d != w*time.Millisecond {
			t.Fatalf("max jitter step %d: %v, want %v", i, d, w*time.Millisecond)
		}
	}
	b.reset()
	b.rand = func(int64) int64 { return 0 }
	if d := b.next(); d != 2*time.Millisecond {
		t.Fatalf("min jitter: %v, want 2ms", d)
	}
}

func TestServerClockEstimate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	local := time.Unix(1000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return local }
	advance := func(d time.Duration) { mu.Lock(); local = local.Add(d); mu.Unlock() }
	c := newServerClock(now)
	if _, u := c.Now(); u < time.Minute {
		t.Fatalf("before any sample the uncertainty must be huge, got %v", u)
	}
	// The server is 1h ahead; the round trip took 10ms.
	sent := now()
	advance(10 * time.Millisecond)
	c.add(clockSample{sent: sent, recv: now(), server: sent.Add(time.Hour + 5*time.Millisecond)})
	got, u := c.Now()
	if want := now().Add(time.Hour); got.Sub(want).Abs() > time.Millisecond {
		t.Fatalf("estimate %v, want %v", got, want)
	}
	if u < 6*time.Millisecond || u > 6*time.Millisecond+10*time.Microsecond {
		t.Fatalf("uncertainty %v, want rtt/2 + 1ms = 6ms (+ drift)", u)
	}
	// A worse (slower) sample does not replace a recent better one.
	sent = now()
	advance(100 * time.Millisecond)
	c.add(clockSample{sent: sent, recv: now(), server: sent.Add(2 * time.Hour)})
	if got, _ := c.Now(); got.Sub(now().Add(time.Hour)).Abs() > time.Millisecond {
		t.Fatalf("a slow sample replaced a better one: %v", got.Sub(now()))
	}
	// Drift allowance grows with the sample's age: 200 ppm.
	advance(50 * time.Second)
	if _, u := c.Now(); u < 6*time.Millisecond+10*time.Millisecond {
		t.Fatalf("uncertainty after 50s = %v, want >= 16ms", u)
	}
	// After maxSampleAge any new sample wins (server clock steps are seen).
	advance(maxSampleAge)
	sent = now()
	advance(2 * time.Millisecond)
	c.add(clockSample{sent: sent, recv: now(), server: sent.Add(30 * time.Minute)})
	if got, u := c.Now(); got.Sub(now().Add(30*time.Minute)).Abs() > 2*time.Millisecond || u > 3*time.Millisecond {
		t.Fatalf("fresh sample not taken: %v ± %v", got.Sub(now()), u)
	}
}

func TestWaitQueueFIFO(t *testing.T) {
	t.Parallel()
	wq := newWaitQueues()
	a := newWaiter([]string{"k1", "k2"})
	b := newWaiter([]string{"k2"})
	c := newWaiter([]string{"k1"})
	kicked := func(w *waiter) bool {
		select {
		case <-w.kick:
			return true
		default:
			return false
		}
	}
	wq.join(a, 1000)
	wq.join(b, 1000)
	wq.join(c, 1000)
	if !kicked(a) || kicked(b) || kicked(c) {
		t.Fatal("only the first waiter may try at first")
	}
	if wq.isHead(b) || wq.isHead(c) {
		t.Fatal("b and c are behind a")
	}
	wq.notify("k2", "k1")
	if !kicked(a) || kicked(b) || kicked(c) {
		t.Fatal("a release must wake only the head")
	}
	wq.leave(a)
	if !kicked(b) || !kicked(c) {
		t.Fatal("when a leaves, b (k2) and c (k1) become heads and are woken")
	}
	wq.notifyExcept(b, "k2")
	if kicked(b) {
		t.Fatal("notifyExcept woke self")
	}
	wq.leave(b)
	wq.leave(c)
	if wq.waiting("k1")+wq.waiting("k2") != 0 {
		t.Fatal("queues not empty")
	}
}

func TestChangeStreamCandidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h    helloReply
		want bool
	}{
		{helloReply{}, false},
		{helloReply{SetName: "rs0"}, true},
		{helloReply{Msg: "isdbgrid"}, true},
		{helloReply{Msg: "other"}, false},
	} {
		if got := changeStreamCandidate(tc.h); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.h, got, tc.want)
		}
	}
}

// fakeStream is a change stream fed by a channel.
type fakeStream struct {
	ch  chan changeEvent
	cur changeEvent
	err error
}

func (f *fakeStream) Next(ctx context.Context) bool {
	select {
	case ev, ok := <-f.ch:
		if !ok {
			f.err = errors.New("stream closed")
			return false
		}
		f.cur = ev
		return true
	case <-ctx.Done():
		f.err = ctx.Err()
		return false
	}
}

func (f *fakeStream) Decode(v any) error {
	b, err := bson.Marshal(bson.D{{Key: "documentKey", Value: bson.D{{Key: "_id", Value: f.cur.DocumentKey.ID}}}})
	if err != nil {
		return err
	}
	return bson.Unmarshal(b, v)
}
func (f *fakeStream) Err() error                  { return f.err }
func (f *fakeStream) Close(context.Context) error { return nil }
func (f *fakeStream) ResumeToken() bson.Raw       { return nil }

// TestWaitModeSelection: on the embedded upstream (standalone) no stream is
// opened and waiters poll; a failing stream leaves polling on; a working
// (fake) stream is used and its events wake the head waiter.
func TestWaitModeSelection(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	if s.streamActive.Load() {
		t.Fatal("FerretDB has no change streams; the store must poll")
	}

	s.openStream = func(context.Context) (changeStream, error) { return nil, errors.New("not a replica set") }
	s.startWatcher()
	if s.streamActive.Load() {
		t.Fatal("a stream that failed to open must leave polling on")
	}

	fs := &fakeStream{ch: make(chan changeEvent, 1)}
	s.openStream = func(context.Context) (changeStream, error) { return fs, nil }
	s.startWatcher()
	if !s.streamActive.Load() {
		t.Fatal("an open stream must be used")
	}
	w := newWaiter([]string{"x/01"})
	s.wq.join(w, 1000)
	<-w.kick // first try
	var ev changeEvent
	ev.DocumentKey.ID = genID("x/01", 7)
	fs.ch <- ev
	select {
	case <-w.kick:
	case <-time.After(5 * time.Second):
		t.Fatal("a change event did not wake the waiter")
	}
	s.wq.leave(w)
}

func TestErrorsAndMessages(t *testing.T) {
	t.Parallel()
	he := &HeldError{NS: namespace.Of("shop.orders"), ID: rv(t, int32(7)), Holder: Holder{
		App: "billing", SessionPrefix: "1a2b3c4d", ExpiresAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}}
	if !errors.Is(he, ErrBusy) || errors.Is(he, ErrTimeout) {
		t.Fatal("busy error must match ErrBusy only")
	}
	msg := he.Error()
	for _, want := range []string{"shop.orders _id 7 ", "billing", "1a2b3c4d", "2026-01-02T03:04:05Z"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	he.Timeout = true
	if !errors.Is(he, ErrTimeout) || errors.Is(he, ErrBusy) {
		t.Fatal("timeout error must match ErrTimeout only")
	}
	if SessionPrefix([]byte{0x1a, 0x2b, 0x3c, 0x4d, 0x5e}) != "1a2b3c4d" {
		t.Fatal("session prefix")
	}
	if err := (Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "lockstore.uri") {
		t.Fatalf("empty config: %v", err)
	}
	if err := (Config{URI: "x", DefaultLease: time.Hour}).Validate(); err == nil || !strings.Contains(err.Error(), "defaultLeaseMS") {
		t.Fatalf("lease over max: %v", err)
	}
}
