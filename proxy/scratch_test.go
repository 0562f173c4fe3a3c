package proxy

import (
	"context"
	"testing"

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
