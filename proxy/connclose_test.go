package proxy

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// closeWatch is a per-connection value that records its ConnClosed.
type closeWatch struct{ closed chan struct{} }

// ConnClosed closes w.closed: a second call panics.
func (w *closeWatch) ConnClosed() { close(w.closed) }

// closeWatcher gives each connection a closeWatch and sends it on
// watches.
type closeWatcher struct{ watches chan *closeWatch }

func (c closeWatcher) Intercept(ctx context.Context, req *Request) Decision {
	if w, _ := req.Client.Local().(*closeWatch); w == nil {
		w = &closeWatch{closed: make(chan struct{})}
		req.Client.SetLocal(w)
		c.watches <- w
	}
	return Decision{Action: Forward}
}

// TestConnClosedWhenTheClientLeaves: the interceptor's per-connection
// value learns, once, that its connection ended. The guard lets the memo
// of the connection's session go there (guard
// TestSessionMemosLeaveWithTheirConnection).
func TestConnClosedWhenTheClientLeaves(t *testing.T) {
	up := echoUpstream(t, nil)
	watches := make(chan *closeWatch, 2)
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: closeWatcher{watches}})
	for range 2 {
		c := dialRaw(t, p.addr)
		b, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(b)
		c.read()
		c.send(b)
		c.read()
		w := <-watches
		c.conn.Close()
		select {
		case <-w.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("ConnClosed was not called after the client closed its connection")
		}
	}
}
