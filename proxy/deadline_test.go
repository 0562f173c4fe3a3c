package proxy

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// lateWrite is an interceptor's state for one request: its LateReplier and
// its ReplyHook, recording the order in which the proxy calls them.
type lateWrite struct {
	mu    sync.Mutex
	calls []string
	done  chan struct{}
}

func (l *lateWrite) note(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, s)
}

func (l *lateWrite) LateReply() bsoncore.Document {
	l.note("late")
	return bsoncore.NewDocumentBuilder().AppendInt32("ok", 0).AppendString("errmsg", "too late to leave").AppendInt32("code", 2).Build()
}

func (l *lateWrite) Reply(_ context.Context, body bsoncore.Document) bsoncore.Document {
	if body == nil {
		l.note("reply:nil")
	} else {
		l.note("reply")
	}
	close(l.done)
	return nil
}

func (l *lateWrite) Abandon() { l.note("abandon"); close(l.done) }

func (l *lateWrite) order() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.calls, ",")
}

// deadlineInterceptor gives every request a deadline: already passed for
// "lateMe", an hour away for anything else.
type deadlineInterceptor struct{ writes chan *lateWrite }

func (d deadlineInterceptor) Intercept(_ context.Context, req *Request) Decision {
	if req.Command == nil || req.Command.Name == "hello" {
		return Decision{Action: Forward}
	}
	l := &lateWrite{done: make(chan struct{})}
	d.writes <- l
	deadline := time.Now().Add(time.Hour)
	if req.Command.Name == "lateMe" {
		deadline = time.Now().Add(-time.Second)
	}
	return Decision{Action: Forward, Deadline: deadline, LateReply: l, OnReply: l}
}

// TestDeadlinePassedAnswersLateReply: a request whose deadline has passed
// when it is about to leave is never forwarded; the client gets the
// LateReplier's document, asked for before the hook learns (Reply, nil
// body) that the request never left. A request within its deadline is
// forwarded, its hook gets the reply, and its LateReplier is never asked.
func TestDeadlinePassedAnswersLateReply(t *testing.T) {
	up := echoUpstream(t, nil)
	writes := make(chan *lateWrite, 2)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: deadlineInterceptor{writes}})
	c := dialRaw(t, p.addr)

	req, id := c.msg(0, bson.D{{"lateMe", 1}, {"$db", "test"}})
	c.send(req)
	r := c.read()
	if r.Header().ResponseTo != id {
		t.Fatalf("responseTo %d, want %d", r.Header().ResponseTo, id)
	}
	if msg, _ := body(t, r).Lookup("errmsg").StringValueOK(); msg != "too late to leave" {
		t.Fatalf("late request answered with %v", body(t, r))
	}
	late := <-writes
	<-late.done
	if got := late.order(); got != "late,reply:nil" {
		t.Fatalf("late request: calls %q, want the late reply, then the hook told it never left", got)
	}

	req, id = c.msg(0, bson.D{{"inTime", 1}, {"$db", "test"}})
	c.send(req)
	if r := c.read(); r.Header().ResponseTo != id {
		t.Fatalf("responseTo %d, want %d", r.Header().ResponseTo, id)
	}
	inTime := <-writes
	<-inTime.done
	if got := inTime.order(); got != "reply" {
		t.Fatalf("request within its deadline: calls %q, want only the reply", got)
	}
	if got := strings.Join(receivedCommands(t, up), ","); got != "inTime" {
		t.Fatalf("upstream received %q, want only the request within its deadline", got)
	}
}

// capInterceptor forwards every command with a deadline 10 s from its
// decision, reported on deadlines, and the maxTimeMS of the client's
// bytes as the cap to set (Decision.MaxTime).
type capInterceptor struct{ deadlines chan time.Time }

func (c capInterceptor) Intercept(_ context.Context, req *Request) Decision {
	at, ok := wire.LocateCommandNumber(req.Message.Raw(), "maxTimeMS")
	if !ok {
		return Decision{Action: Forward}
	}
	deadline := time.Now().Add(10 * time.Second)
	c.deadlines <- deadline
	return Decision{Action: Forward, Deadline: deadline, MaxTime: at}
}

// TestCapCountsFromAfterTheDial: the maxTimeMS the proxy sets is counted
// from its clock reading after the upstream connection is made: a dial
// that takes 50 ms (made for the connection's first request) may not let
// the request run past its deadline. The client's own larger value is
// lowered in place in its bytes. Read before the dial, the cap ran past
// the deadline by the dial's time.
func TestCapCountsFromAfterTheDial(t *testing.T) {
	up := echoUpstream(t, nil)
	dialing, release := make(chan struct{}), make(chan struct{})
	dial := dialFunc(func(ctx context.Context) (net.Conn, error) {
		dialing <- struct{}{}
		<-release
		var d net.Dialer
		return d.DialContext(ctx, "tcp", up.Addr())
	})
	deadlines := make(chan time.Time, 1)
	p := startProxy(t, Options{Upstream: dial, Interceptor: capInterceptor{deadlines}})
	c := dialRaw(t, p.addr)
	req, id := c.msg(0, bson.D{{"capMe", 1}, {"maxTimeMS", int64(60000)}, {"$db", "test"}})
	c.send(req)
	deadline := <-deadlines
	<-dialing
	<-time.After(50 * time.Millisecond)
	resumed := time.Now() // the bytes leave after this
	release <- struct{}{}
	if r := c.read(); r.Header().ResponseTo != id {
		t.Fatalf("responseTo %d, want %d", r.Header().ResponseTo, id)
	}
	reqs := up.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream received %d requests", len(reqs))
	}
	m, err := wire.Parse(reqs[0], wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	ms, ok := cmd.Body.Lookup("maxTimeMS").Int64OK()
	if end := resumed.Add(time.Duration(ms) * time.Millisecond); !ok || ms <= 0 || end.After(deadline) {
		t.Fatalf("after a 50 ms dial the request left with maxTimeMS %d (%v): it may run %v past its deadline", ms, ok, end.Sub(deadline))
	}
}
