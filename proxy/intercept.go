package proxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Interceptor is the seam where lock commands and enforcement plug in. It
// sees every client request after decoding and before anything reaches the
// upstream.
//
// Intercept is called from the connection's client pump, one request at a
// time per connection and concurrently across connections. The request and
// everything it points into are valid only until Intercept returns: copy
// what must outlive the call. ctx is cancelled when the connection closes.
type Interceptor interface {
	Intercept(ctx context.Context, req *Request) Decision
}

// Request is one decoded client message.
type Request struct {
	// Message is the decoded message; Message.Raw() are the bytes the
	// client sent.
	Message wire.Message
	// Command is the command it carries, nil for legacy opcodes such as
	// OP_INSERT or OP_GET_MORE that are not commands.
	Command *wire.Command
	// Client describes the connection.
	Client *ClientInfo
	// Plan is the interceptor's own reading of the request, made by the
	// first stage that needs it and read by the later ones (the guard
	// keeps its policy.Plan here). The proxy neither reads nor sets it;
	// each request starts without one.
	Plan any
	// Scratch is the interceptor's room for reading requests, kept by the
	// connection from one request to the next (the guard reads each
	// request's plan into the same policy.Plan), so that reading one
	// allocates nothing. The proxy neither reads nor sets it. Requests on
	// a connection are decided one at a time and the last one is done
	// with when the next is intercepted, so what is in it may be
	// overwritten then; it must never decide anything by itself. When
	// the connection is done with a request, it calls Forget if Scratch
	// is a Forgetter. A request not made by a connection (tests) starts
	// without one.
	Scratch any

	// conn is the connection the request arrived on; nil where none backs
	// it (tests). A pointer, not method values: those would cost two
	// allocations per request.
	conn *conn
}

// Forgetter is a Request.Scratch that holds views into its request: the
// connection calls Forget once it is done with the request (answered,
// forwarded or refused), so that an idle connection does not keep its
// last message reachable. A message larger than the buffer pool's largest
// class is the garbage collector's to free as soon as it is handled.
type Forgetter interface {
	Forget()
}

// forget lets go of the request once the connection is done with it,
// keeping only the Scratch, which forgets it too.
func (r *Request) forget() {
	s := r.Scratch
	*r = Request{Scratch: s}
	if f, ok := s.(Forgetter); ok {
		f.Forget()
	}
}

// ErrNoUpstream: Ask has no upstream connection to send on.
var ErrNoUpstream = errors.New("proxy: no upstream connection for this request")

// Ask sends body, a command of the interceptor's own, to the upstream on
// this client's own upstream connection, and returns the upstream's reply
// body; the client never sees either. The upstream decides it with the
// client's authentication, so the answer says what the client itself may
// do. Earlier requests on the connection are answered first
// (WaitAnswered). The reply document is a copy.
func (r *Request) Ask(ctx context.Context, body bsoncore.Document) (bsoncore.Document, error) {
	if r.conn == nil {
		return nil, ErrNoUpstream
	}
	return r.conn.ask(ctx, body)
}

// WaitAnswered blocks until the upstream has answered every request this
// connection forwarded before this one, ctx ends, or the connection
// closes. While an interceptor waits, the connection reads nothing more,
// so nothing new is forwarded meanwhile: a lock command that waits here
// takes effect after the writes sent before it, in the connection's own
// order, as the server would execute them. Fire-and-forget requests have
// no answer and are not waited for.
func (r *Request) WaitAnswered(ctx context.Context) error {
	if r.conn == nil {
		return nil
	}
	return r.conn.waitAnswered(ctx)
}

// Action says what the proxy does with a request.
type Action int

const (
	// Forward sends the client's bytes to the upstream unchanged.
	Forward Action = iota
	// Rewrite sends Decision.Message to the upstream instead.
	Rewrite
	// Reply answers the client with Decision.Reply and sends nothing
	// upstream.
	Reply
	// Close ends the client's connection without an answer.
	Close
)

// Decision is an Interceptor's verdict on one request.
type Decision struct {
	Action Action
	// Message is the full wire message to forward for Rewrite. It must
	// keep the request's requestID so that the upstream's reply still
	// matches what the client waits for.
	Message []byte
	// Reply is the body the proxy answers with for Reply, framed in the
	// request's own opcode family. When the client asked for no reply
	// (moreToCome), a body with ok:0 closes the connection instead, as
	// mongod does, and any other body is dropped.
	Reply bsoncore.Document
	// Reason is logged when the decision closes the connection.
	Reason string
	// OnReply, if set, sees the upstream's reply to a forwarded or
	// rewritten request before the client does (ReplyHook). A request that
	// expects no reply abandons it at once; any other action gets Reply
	// with a nil body.
	OnReply ReplyHook
	// Deadline, if set, is when a forwarded or rewritten request may no
	// longer leave: the proxy checks it immediately before writing the
	// bytes upstream and answers LateReply's document instead; OnReply
	// then gets Reply with a nil body, as for any request that never left.
	Deadline  time.Time
	LateReply LateReplier
	// MaxTime, if located, is where the bytes to send (Message for
	// Rewrite, the request's own for Forward) carry the command's
	// maxTimeMS. At the Deadline check the proxy lowers it, in place, to
	// the whole milliseconds left until Deadline by that same clock
	// reading, so that the write's running time is counted from the
	// moment the bytes leave, not from the decision; with under a
	// millisecond left it answers LateReply instead (Leave).
	MaxTime wire.NumberAt
	// MessageDone, if set, gets Message back once the proxy no longer
	// reads it: after the bytes were written upstream (or the write
	// failed), on the client pump. Message may then be a buffer the
	// interceptor reuses for the connection's next request. A Message not
	// sent at all (the deadline passed, another action) is not handed
	// back.
	MessageDone MessageReleaser
}

// Leave is the check the proxy makes on d immediately before it writes b,
// the bytes it forwards, upstream, with now its clock reading then: false
// when the request may no longer leave (its Deadline has passed, or, when
// it carries a maxTimeMS to bound, less than a millisecond is left: the
// least maxTimeMS a server takes is 1); otherwise the maxTimeMS in b
// is lowered to what is left, if it is greater. A decision without a
// Deadline always leaves. Exported for the tests of an interceptor, which
// play the proxy.
func (d *Decision) Leave(b []byte, now time.Time) bool {
	if d.Deadline.IsZero() {
		return true
	}
	left := d.Deadline.Sub(now)
	if !d.MaxTime.Located() {
		return left >= 0
	}
	if left < time.Millisecond {
		return false
	}
	ms := left.Milliseconds()
	if cur, ok := d.MaxTime.Get(b); ok && cur > 0 && cur <= ms {
		return true // the client's own, smaller
	}
	// A value that cannot be written (out of place) cannot be bounded:
	// refused rather than sent as it is.
	return d.MaxTime.Set(b, ms)
}

// MessageReleaser takes back a rewritten message (Decision.MessageDone).
type MessageReleaser interface {
	ReleaseMessage(b []byte)
}

// LateReplier makes the answer to a request whose Decision.Deadline passed
// before it could leave. The answer is almost never needed, and building
// it for every write would cost more than the rest of the decision; an
// interface rather than a function, so that what the interceptor keeps for
// the request anyway (an enforced write's flight) can be it, with no
// closure made per request. LateReply is called at most once, on the
// connection's client pump, before OnReply learns that the request never
// left; its document must not depend on anything OnReply then releases.
type LateReplier interface {
	LateReply() bsoncore.Document
}

// ClientInfo describes a client connection. The proxy fills it in from the
// connection and from the client's handshake.
type ClientInfo struct {
	// ID is unique per connection for the lifetime of the process.
	ID         uint64
	RemoteAddr net.Addr
	// Addr is RemoteAddr as a string, formatted once.
	Addr string

	mu sync.Mutex
	// id is the connection's identity, replaced whole under mu and read
	// without it: every decision reads it several times.
	id atomic.Pointer[clientID]
	// verdicts remembers what the upstream allowed this connection's
	// user, keyed by the asker's choice; dropped when the user changes.
	verdicts map[string]bool

	// local is the interceptor's own per-connection value (Local).
	local atomic.Value
}

// Local returns the value the interceptor last stored with SetLocal for
// this connection, nil before. It lets an interceptor keep per-connection
// scratch (pre-encoded log fields, memos) that ends with the connection,
// without a map of its own; the value must always have the same type.
func (c *ClientInfo) Local() any { return c.local.Load() }

// SetLocal stores the interceptor's per-connection value.
func (c *ClientInfo) SetLocal(v any) { c.local.Store(v) }

// ConnCloser is a per-connection value (SetLocal) that must learn when its
// connection ends: what it shares with other connections, such as a memo
// of a session that a client which opens a connection per session never
// ends, can then be let go with it instead of filling a table.
type ConnCloser interface {
	// ConnClosed is called once, after the connection's last decision.
	ConnClosed()
}

// Verdict returns a remembered verdict for key under the current user.
func (c *ClientInfo) Verdict(key string) (allowed, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	allowed, known = c.verdicts[key]
	return allowed, known
}

// SetVerdict remembers a verdict for key until the user changes. At most
// a few hundred are kept per connection.
func (c *ClientInfo) SetVerdict(key string, allowed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.verdicts == nil || len(c.verdicts) >= 256 {
		c.verdicts = map[string]bool{}
	}
	c.verdicts[key] = allowed
}

// AppName is the application name the driver sent in its handshake.
func (c *ClientInfo) AppName() string {
	if id := c.id.Load(); id != nil {
		return id.appName
	}
	return ""
}

// clientID is what the handshake and authentication told of a client.
type clientID struct{ appName, driver, user string }

// identity is the current identity to edit; c.mu is held.
func (c *ClientInfo) identity() clientID {
	if id := c.id.Load(); id != nil {
		return *id
	}
	return clientID{}
}

// Driver is the driver name and version from the handshake.
func (c *ClientInfo) Driver() string {
	if id := c.id.Load(); id != nil {
		return id.driver
	}
	return ""
}

// User is "user@db" as the upstream accepted it in this connection's
// latest successful authentication conversation; "" before one, after
// logout, and for mechanisms that name no user. A user only claimed in a
// conversation the upstream refused is never recorded.
func (c *ClientInfo) User() string {
	if id := c.id.Load(); id != nil {
		return id.user
	}
	return ""
}

func (c *ClientInfo) setUser(user string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.identity()
	id.user = user
	c.id.Store(&id)
	c.verdicts = nil // re-authentication or logout: earlier answers no longer hold
}

func (c *ClientInfo) setHandshake(app, driver string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.identity()
	if id.appName == "" {
		id.appName = app
	}
	if id.driver == "" {
		id.driver = driver
	}
	c.id.Store(&id)
}
