package proxy

import (
	"context"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// ReplyHook sees the upstream's reply to one forwarded request before the
// client does, and may replace it. The document fence uses it to turn a
// write that the database refused for a stale holder (it matched nothing)
// into a clear error, and to learn when an enforced write is answered.
//
// Exactly one of Reply and Abandon is called, once, from the connection's
// upstream pump (Abandon may come from whichever goroutine closes the
// connection). Reply may take a round trip of its own, but not on the
// client's connection (Request.Ask would wait for itself): replies on the
// connection queue behind it.
type ReplyHook interface {
	// Reply receives the reply body (nil when the request never left),
	// valid only during the call, and
	// returns a body to send the client instead, or nil to relay the
	// reply unchanged. A hook that also has a NeedsBody() bool method
	// returning false is only told that the reply arrived: body is nil,
	// and its answer is ignored.
	Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document
	// Abandon is called instead of Reply when the request left but will
	// not be answered: the connection closed first, or nothing is
	// expected. A request that never left (answered by the proxy, or its
	// connection closed before sending) gets Reply with a nil body.
	Abandon()
}

// replyHookTimeout bounds a hook's own work.
const replyHookTimeout = 5 * time.Second

// addHook registers h for the reply to request id.
func (c *conn) addHook(id int32, h ReplyHook) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		h.Abandon()
		return
	}
	var old ReplyHook
	switch {
	case c.hook == nil:
		// The map is empty whenever the slot is (takeHook).
		c.hook, c.hookID = h, id
	case c.hookID == id:
		old, c.hook = c.hook, h
	default:
		if c.hooks == nil {
			c.hooks = map[int32]ReplyHook{}
		}
		old = c.hooks[id]
		c.hooks[id] = h
	}
	c.nHooks.Store(c.hookCount())
	c.mu.Unlock()
	if old != nil {
		old.Abandon() // a client reusing a requestID: the first is lost
	}
}

// hookCount is how many hooks wait; c.mu is held.
func (c *conn) hookCount() int32 {
	if c.hook == nil {
		return 0
	}
	return 1 + int32(len(c.hooks))
}

// takeHook removes and returns the hook for responseTo. No defer: it
// runs on every enforced write's reply, and its returns are few.
func (c *conn) takeHook(responseTo int32) ReplyHook {
	c.mu.Lock()
	h := c.hook
	switch {
	case h == nil:
		c.mu.Unlock()
		return nil
	case c.hookID == responseTo:
		c.hook = nil
		if len(c.hooks) > 0 {
			// The slot stays taken while the map holds any: one of them
			// moves into it.
			for id, next := range c.hooks {
				c.hook, c.hookID = next, id
				delete(c.hooks, id)
				break
			}
		}
	default:
		var ok bool
		if h, ok = c.hooks[responseTo]; !ok {
			c.mu.Unlock()
			return nil
		}
		delete(c.hooks, responseTo)
	}
	c.nHooks.Store(c.hookCount())
	c.mu.Unlock()
	return h
}

// abandonHooks tells every remaining hook that no reply will come.
func (c *conn) abandonHooks() {
	c.mu.Lock()
	h, hs := c.hook, c.hooks
	c.hook, c.hooks = nil, nil
	c.nHooks.Store(0)
	c.mu.Unlock()
	if h != nil {
		h.Abandon()
	}
	for _, h := range hs {
		h.Abandon()
	}
}

// hookReply runs the hook of a reply, if any, and returns the bytes to
// relay: b itself, or a reply framed around the hook's replacement.
func (c *conn) hookReply(h wire.Header, b []byte) []byte {
	hook := c.takeHook(h.ResponseTo)
	if hook == nil {
		return b
	}
	if nb, ok := hook.(interface{ NeedsBody() bool }); ok && !nb.NeedsBody() {
		hook.Reply(c.ctx, nil)
		return b
	}
	body, ok := replyBody(b)
	if !ok {
		hook.Abandon()
		return b
	}
	ctx, cancel := context.WithTimeout(c.ctx, replyHookTimeout)
	defer cancel()
	repl := hook.Reply(ctx, body)
	if repl == nil {
		return b
	}
	c.srv.metrics.proxyReplies.Inc()
	if h.OpCode == wire.OpCodeReply {
		return wire.AppendReply(nil, h.RequestID, h.ResponseTo, 0, 0, 0, repl)
	}
	return wire.AppendMsg(nil, h.RequestID, h.ResponseTo, 0, repl)
}
