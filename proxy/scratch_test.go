package proxy

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// scratchInterceptor records, for each request, the Plan and Scratch it
// arrived with, then sets both as the guard does (reqplan.Of).
type scratchInterceptor struct {
	seen chan [2]any
}

type scratchRoom struct{ n int }

func (s *scratchInterceptor) Intercept(_ context.Context, req *Request) Decision {
	s.seen <- [2]any{req.Plan, req.Scratch}
	room, _ := req.Scratch.(*scratchRoom)
	if room == nil {
		room = &scratchRoom{}
		req.Scratch = room
	}
	room.n++
	req.Plan = room.n
	return Decision{Action: Forward}
}

// A connection's requests share one Scratch, and each starts without a
// Plan: the guard reads every request's plan into the connection's room,
// and a request that arrived carrying the last one's plan would be judged
// by it. Another connection gets its own room.
func TestScratchIsTheConnectionsPlanIsTheRequests(t *testing.T) {
	up := echoUpstream(t, nil)
	ic := &scratchInterceptor{seen: make(chan [2]any, 16)}
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: ic})
	ping := func(c *rawClient) [2]any {
		t.Helper()
		b, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(b)
		c.read()
		return <-ic.seen
	}
	c1 := dialRaw(t, p.addr)
	first := ping(c1)
	if first[0] != nil || first[1] != nil {
		t.Fatalf("the connection's first request arrived with plan %v, scratch %v", first[0], first[1])
	}
	var room any
	for i := 0; i < 3; i++ {
		got := ping(c1)
		if got[0] != nil {
			t.Fatalf("request %d arrived with the last request's plan %v", i+2, got[0])
		}
		if got[1] == nil || (room != nil && got[1] != room) {
			t.Fatalf("request %d arrived with scratch %v, the connection's is %v", i+2, got[1], room)
		}
		room = got[1]
	}
	if other := ping(dialRaw(t, p.addr)); other[1] != nil {
		t.Fatalf("another connection's first request arrived with scratch %v", other[1])
	}
}

// forgettingRoom is a Scratch that reports its Forget calls.
type forgettingRoom struct{ forgot chan struct{} }

func (r *forgettingRoom) Forget() { r.forgot <- struct{}{} }

// keepingInterceptor keeps each request it sees, as a careless
// interceptor could, to check what the connection left in it.
type keepingInterceptor struct {
	room *forgettingRoom
	reqs chan *Request
}

func (k *keepingInterceptor) Intercept(_ context.Context, req *Request) Decision {
	req.Scratch = k.room
	k.reqs <- req
	return Decision{Action: Forward}
}

// Once a request is handled, the connection lets go of it: the request it
// reuses holds no message (a message over the buffer pool's largest class
// must be the garbage collector's as soon as it is handled, not an idle
// connection's), and a Forgetter Scratch is told to let go too, once per
// request; the Scratch itself stays for the next.
func TestHandledRequestIsForgotten(t *testing.T) {
	up := echoUpstream(t, nil)
	k := &keepingInterceptor{room: &forgettingRoom{forgot: make(chan struct{}, 4)}, reqs: make(chan *Request, 4)}
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: k})
	c := dialRaw(t, p.addr)
	for i := 0; i < 3; i++ {
		b, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(b)
		c.read()
		req := <-k.reqs
		select {
		case <-k.room.forgot:
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d: the Scratch was not told to forget it", i+1)
		}
		// Forget came after the request was emptied, on the same
		// goroutine: reading it here is ordered after that.
		if req.Message != nil || req.Command != nil || req.Plan != nil {
			t.Fatalf("request %d: the connection still holds its message (%v) once it is handled", i+1, req.Message != nil)
		}
		if req.Scratch != k.room {
			t.Fatalf("request %d: the connection dropped its Scratch", i+1)
		}
	}
	select {
	case <-k.room.forgot:
		t.Fatal("Forget was called more than once for a request")
	default:
	}
}
