package upstream

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/mongo/address"
	"go.mongodb.org/mongo-driver/mongo/description"
	drivertopology "go.mongodb.org/mongo-driver/x/mongo/driver/topology"
	"go.uber.org/zap"
)

// server is a loopback listener standing for one deployment member; it
// accepts and holds connections, which is all Dial needs.
func server(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}

// unmonitored is an Upstream whose topology the test feeds by hand.
func unmonitored() *Upstream {
	return &Upstream{log: zap.NewNop(), dialTimeout: 2 * time.Second, changed: make(chan struct{})}
}

type member struct {
	addr string
	kind description.ServerKind
}

func topology(ms ...member) description.Topology {
	var t description.Topology
	for _, m := range ms {
		t.Servers = append(t.Servers, description.Server{Addr: address.Address(m.addr), Kind: m.kind})
	}
	return t
}

func dial(t *testing.T, u *Upstream) *Conn {
	t.Helper()
	c, err := u.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Conn)
}

func retired(c *Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	return c.WaitRetired(ctx)
}

// Among routers, the proxy stays on the one it uses while that one is
// usable: a blip of another router, or of its own followed by recovery of
// the first, never drains healthy connections.
func TestRouterTargetIsKeptWhileUsable(t *testing.T) {
	a, b := server(t), server(t)
	u := unmonitored()
	u.follow(topology(member{a, description.Mongos}, member{b, description.Mongos}))
	if got := u.Target(); got != a {
		t.Fatalf("first target %q, want %q", got, a)
	}
	onA := dial(t, u)

	// a stops answering: move to b, and retire connections to a.
	u.follow(topology(member{a, description.Unknown}, member{b, description.Mongos}))
	if got := u.Target(); got != b {
		t.Fatalf("after a's blip the target is %q, want %q", got, b)
	}
	if !retired(onA) {
		t.Fatal("a connection to the unreachable router was not retired")
	}
	onB := dial(t, u)
	if onB.Addr() != b {
		t.Fatalf("dialed %s, want %s", onB.Addr(), b)
	}

	// a is back, first in the list: b stays the target, its connection too.
	u.follow(topology(member{a, description.Mongos}, member{b, description.Mongos}))
	if got := u.Target(); got != b {
		t.Fatalf("after a recovered the target flipped to %q, want to keep %q", got, b)
	}
	if retired(onB) {
		t.Fatal("a healthy connection to b was retired when a came back")
	}

	// b goes away for good: a again.
	u.follow(topology(member{a, description.Mongos}))
	if got := u.Target(); got != a {
		t.Fatalf("with b gone the target is %q, want %q", got, a)
	}
	if !retired(onB) {
		t.Fatal("the connection to the removed router was not retired")
	}
}

// With no writable server known for a moment, the last one is taken back
// when it answers again, and its connections were never retired.
func TestTargetSurvivesAnUnknownMoment(t *testing.T) {
	a, b := server(t), server(t)
	u := unmonitored()
	u.follow(topology(member{a, description.Mongos}, member{b, description.Mongos}))
	u.follow(topology(member{a, description.Unknown}, member{b, description.Mongos}))
	onB := dial(t, u)

	u.follow(topology(member{a, description.Unknown}, member{b, description.Unknown}))
	if got := u.Target(); got != "" {
		t.Fatalf("no usable server, but the target is %q", got)
	}
	if retired(onB) {
		t.Fatal("a connection was retired although no other server took over")
	}
	u.follow(topology(member{a, description.Mongos}, member{b, description.Mongos}))
	if got := u.Target(); got != b {
		t.Fatalf("after the unknown moment the target is %q, want %q", got, b)
	}
	if retired(onB) {
		t.Fatal("the connection to b was retired when b came back")
	}
}

// A replica set's target is its primary, whatever was used before: an
// election retires connections to the old primary, and Dial waits while
// there is none.
func TestReplicaSetFollowsThePrimary(t *testing.T) {
	a, b := server(t), server(t)
	u := unmonitored()
	u.follow(topology(member{a, description.RSPrimary}, member{b, description.RSSecondary}))
	onA := dial(t, u)
	if onA.Addr() != a {
		t.Fatalf("dialed %s, want the primary %s", onA.Addr(), a)
	}

	// Election in progress: no primary. Dial waits for one.
	u.follow(topology(member{a, description.RSSecondary}, member{b, description.RSSecondary}))
	waiting := make(chan struct{}, 1)
	u.testHookWaiting = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	dialed := make(chan *Conn, 1)
	go func() {
		c, err := u.Dial(context.Background())
		if err != nil {
			t.Error(err)
			dialed <- nil
			return
		}
		dialed <- c.(*Conn)
	}()
	select {
	case c := <-dialed:
		t.Fatalf("Dial returned a connection to %v while no primary was known", c)
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("Dial neither returned nor waited for a primary")
	}

	u.follow(topology(member{a, description.RSSecondary}, member{b, description.RSPrimary}))
	c := <-dialed
	if c == nil {
		t.FailNow()
	}
	defer c.Close()
	if c.Addr() != b {
		t.Fatalf("after the election Dial went to %s, want the new primary %s", c.Addr(), b)
	}
	if !retired(onA) {
		t.Fatal("the connection to the old primary was not retired")
	}

	// The old primary wins again: the target moves back (a primary is
	// never kept for stickiness' sake), and b's connection is retired.
	u.follow(topology(member{a, description.RSPrimary}, member{b, description.RSSecondary}))
	if got := u.Target(); got != a {
		t.Fatalf("target %q, want the re-elected primary %q", got, a)
	}
	if !retired(c) {
		t.Fatal("the connection to the stepped-down primary was not retired")
	}
}

// Dial gives up with ErrNoPrimary after its timeout when nothing is known.
func TestDialWithoutPrimaryTimesOut(t *testing.T) {
	u := unmonitored()
	u.dialTimeout = 30 * time.Millisecond
	if _, err := u.Dial(context.Background()); err == nil {
		t.Fatal("Dial succeeded with no server known")
	}
}

// TestURISelectionTimeoutWins: the operator's serverSelectionTimeoutMS in
// the URI bounds server selection, not the default the gateway passes
// (5 s, lockstore.DefaultOpTimeout), which applies only when the URI
// names none. Against an address nothing answers on, a ping whose
// context outlives the selection timeout fails with the driver's own
// selection timeout; one whose context ends first fails with the
// context's deadline instead.
func TestURISelectionTimeoutWins(t *testing.T) {
	for _, tc := range []struct {
		name, uri string
		option    time.Duration
	}{
		{"the URI's", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=150&connectTimeoutMS=100", time.Hour},
		{"the default, when the URI names none", "mongodb://127.0.0.1:1/?connectTimeoutMS=100", 150 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := New(context.Background(), Options{URI: tc.uri, Logger: zap.NewNop(), ServerSelectionTimeout: tc.option})
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = u.Ping(ctx)
			if !errors.Is(err, drivertopology.ErrServerSelectionTimeout) {
				t.Fatalf("ping of an absent server: %v; want the driver's server selection timeout (150 ms), not the context's", err)
			}
		})
	}
}
