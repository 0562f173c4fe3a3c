package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
)

// readBufferSize is the buffered reader in front of each socket: most
// requests and replies fit in one read, and it bounds what an idle
// connection holds.
const readBufferSize = 4 << 10

// maxPendingHellos bounds the handshake requests one connection may have
// outstanding. Drivers send one at a time; more is abuse.
const maxPendingHellos = 16

// conn is one proxied client connection and its upstream connection.
//
// Two goroutines move bytes: clientPump reads requests and writes them
// upstream (or answers them itself), upstreamPump reads replies and writes
// them to the client. Both write to the client under wmu, so that replies
// the proxy makes never interleave with forwarded ones.
type conn struct {
	// The fields every request reads or writes come first, in the
	// struct's first four cache lines (TestConnHotFieldsFirst): between
	// two requests of a connection the other connections' work evicts
	// them, and each line is a miss when the next request comes.
	srv      *Server
	info     *ClientInfo
	client   net.Conn
	upstream net.Conn
	// ctx ends with the connection (cancel), which unblocks everything
	// the connection waits on.
	ctx context.Context

	inflight atomic.Int32 // requests forwarded and not yet answered
	draining atomic.Bool  // stop reading requests; close once inflight is 0
	// How many of the rarely used lists below there are, read without
	// the lock on every request: nHellos (hellos), nUnacked (unacked),
	// nAuth (auth), nQuiet (quiet), nAsks (asks), nHooks (hook and
	// hooks).
	nHellos, nUnacked, nAuth, nQuiet, nAsks, nHooks atomic.Int32
	// The latest request's id and forward time, for the round-trip
	// histogram. Drivers do not pipeline, so one slot times nearly every
	// request; a mismatch is simply not measured.
	rttID atomic.Int32
	// hookID is the request hook answers (under mu).
	hookID int32
	rttAt  atomic.Int64
	// Unix nanoseconds since a client message began arriving, or a write
	// to the client began; 0 when idle. The server's watchdog closes
	// connections stuck in either for too long, so that the hot path
	// never touches socket deadlines.
	readSince  atomic.Int64
	writeSince atomic.Int64

	// hooks see the replies to some forwarded requests first, by
	// requestID (under mu; nHooks, how many there are, for the hot path).
	// A client waits for each reply before its next request, so the
	// usual hook is alone: it is kept in hook (for request hookID) and
	// the map holds the others, only ever used while hook is set.
	hook ReplyHook
	wmu  sync.Mutex // serialises writes to client
	// Handshakes are rare: their bookkeeping may take a lock. Everything
	// touched on every request is atomic.
	mu sync.Mutex
	// pumpDone is closed when the upstream pump ends; nil until the
	// upstream is dialed. Set and read by the client pump's goroutine.
	pumpDone chan struct{}
	// spoke and acceptedAt: a client that sends nothing within the
	// handshake timeout of connecting is closed by the watchdog.
	spoke atomic.Bool

	// req is the request being decided, one for the connection: the
	// client pump decides its requests one at a time (handleRequest), and
	// nothing keeps a request past its handling (Interceptor), so its
	// Scratch carries over and it is never allocated per message. It is
	// emptied once handled (Request.forget).
	req Request

	// The rest is read when a connection starts or ends, or on the
	// rare requests (handshakes, authentication, fire-and-forget,
	// the proxy's own).
	log        *zap.Logger
	cancel     context.CancelFunc
	acceptedAt int64 // see spoke
	// nextID numbers the replies the proxy makes itself. They are only
	// matched by responseTo, so any sequence unique per connection works.
	nextID atomic.Int32
	hellos []int32 // requestIDs whose replies are handshakes to rewrite
	// Recent fire-and-forget requestIDs: a reply to one of them is a
	// protocol violation by the upstream (FerretDB v1.24 commits it) that
	// the client would take for the answer to its next request, so it is
	// dropped. Bounded: only the latest few are remembered.
	unacked []int32
	// Authentication steps awaiting the upstream's verdict and the SASL
	// conversation open upstream (under mu).
	auth []authStep
	conv conversation
	// quiet are closed when inflight drops to 0: the waiters of
	// Request.WaitAnswered (under mu).
	quiet []chan struct{}
	// asks are the proxy's own requests awaiting replies, by requestID
	// (under mu).
	asks  map[int32]chan []byte
	hooks map[int32]ReplyHook

	closeOnce sync.Once
	closed    bool // under mu: set by close, read by setUpstream
}

func (s *Server) newConn(ctx context.Context, client net.Conn, id uint64) *conn {
	ctx, cancel := context.WithCancel(ctx)
	info := &ClientInfo{ID: id, RemoteAddr: client.RemoteAddr(), Addr: client.RemoteAddr().String()}
	c := &conn{
		srv:    s,
		info:   info,
		log:    s.log.With(zap.Uint64("conn", id), zap.String("client", info.Addr)),
		client: client,
		ctx:    ctx,
		cancel: cancel,
	}
	c.nextID.Store(1 << 30)
	c.acceptedAt = time.Now().UnixNano()
	return c
}

// serve runs the connection to its end. It recovers from its own panics so
// that one bad connection never takes the proxy down.
func (c *conn) serve() {
	defer func() {
		if r := recover(); r != nil {
			c.srv.metrics.error(errPanic)
			c.log.Error("connection handler panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
		c.close()
		// The client pump, which runs the decisions, has returned.
		if l, ok := c.info.Local().(ConnCloser); ok {
			l.ConnClosed()
		}
	}()

	if tc, ok := c.client.(*tls.Conn); ok {
		// Finish the handshake before spending an upstream connection on
		// a client that may never complete it.
		hctx, cancel := context.WithTimeout(c.ctx, c.srv.opts.MessageTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			c.srv.metrics.error(errClientIO)
			c.log.Info("closing client connection: TLS handshake failed", zap.Error(err))
			return
		}
	}
	// The upstream connection is dialed when the first request must be
	// forwarded, not at accept: an idle or silent client costs no
	// upstream connection, and one that only sends lock commands none at
	// all.
	c.clientPump()
	if c.pumpDone != nil {
		<-c.pumpDone
	}
}

// connectUpstream dials the upstream and starts relaying its replies; on
// failure it answers req with an error the driver shows to its user (the
// client would otherwise see only a reset connection) and returns false.
func (c *conn) connectUpstream(req wire.Message) bool {
	up, err := c.srv.opts.Upstream.Dial(c.ctx)
	if err != nil {
		c.srv.metrics.error(errUpstreamDial)
		c.log.Warn("closing client connection: no upstream connection", zap.Error(err))
		if req != nil && expectsReply(req) {
			// HostUnreachable, which drivers may retry: nothing was
			// sent, so a retry elsewhere is exactly right.
			if b, ok := wire.ErrorReplyTo(req, c.nextID.Add(1), mongoerr.New(mongoerr.HostUnreachable,
				"lockgate: cannot reach the upstream database: %v; nothing was sent. Check that it is running and that upstream.uri names it", err)); ok {
				c.writeClient(b)
			}
		}
		return false
	}
	if !c.setUpstream(up) {
		return false // closed while dialing
	}
	if r, ok := up.(interface{ WaitRetired(context.Context) bool }); ok {
		go func() {
			if r.WaitRetired(c.ctx) {
				c.srv.metrics.retiredConns.Inc()
				c.log.Info("upstream server is no longer primary: closing the connection once idle")
				c.drain()
			}
		}()
	}
	c.pumpDone = make(chan struct{})
	go func() {
		defer close(c.pumpDone)
		c.upstreamPump()
	}()
	return true
}

// setUpstream installs the upstream connection, unless the connection was
// closed while it was being dialed: then it is closed too, and false
// returned, so that no upstream connection outlives its client.
func (c *conn) setUpstream(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		up.Close()
		return false
	}
	c.upstream = up
	return true
}

// close tears down both sockets once; safe from any goroutine.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		c.client.Close()
		c.mu.Lock()
		c.closed = true
		up := c.upstream
		c.mu.Unlock()
		if up != nil {
			up.Close()
		}
		c.abandonHooks()
	})
}

// finishGrace bounds how long a connection that must close still waits
// for the replies to requests it had already forwarded.
const finishGrace = 5 * time.Second

// finish stops reading and closes the connection once the requests already
// forwarded are answered, within finishGrace: a good request followed by
// garbage still gets its reply, as it would from mongod, which answers in
// order before it reads the garbage.
func (c *conn) finish() {
	c.draining.Store(true)
	if c.inflight.Load() == 0 {
		c.close()
		return
	}
	time.AfterFunc(finishGrace, c.close)
}

// drain stops reading new requests and closes the connection as soon as
// every forwarded request has been answered.
func (c *conn) drain() {
	c.draining.Store(true)
	// Unblock a read waiting for the next request. A request that is half
	// read is abandoned: the client sees a closed connection and retries.
	c.client.SetReadDeadline(time.Now())
	if c.inflight.Load() == 0 {
		c.close()
	}
}

// clientPump reads client requests until the client goes away, a message
// is malformed, or the connection drains. When it returns because of the
// client, the whole connection closes; when it returns because of
// draining, the upstream pump finishes the in-flight replies.
func (c *conn) clientPump() {
	r := bufio.NewReaderSize(watchedReader{c}, readBufferSize)
	lim := wire.Limits{MaxMessageSize: c.srv.opts.MaxMessageSize}
	for {
		raw, err := wire.ReadMessage(r, c.srv.pool, lim)
		if err != nil {
			c.readFailed(err)
			return
		}
		keep := c.handleRequest(raw)
		c.req.forget()
		raw.Release()
		if !keep {
			c.finish()
			return
		}
		// The next message's clock starts with its first byte, which may
		// already be buffered.
		if r.Buffered() > 0 {
			c.readSince.Store(time.Now().UnixNano())
		} else {
			c.readSince.Store(0)
		}
		if c.draining.Load() {
			return
		}
	}
}

func (c *conn) readFailed(err error) {
	switch {
	case errors.Is(err, io.EOF):
		c.log.Debug("client closed the connection")
	case c.draining.Load() && errors.Is(err, os.ErrDeadlineExceeded):
		return // drain() interrupted the read on purpose
	case errors.Is(err, wire.ErrTooLarge):
		c.srv.metrics.error(errTooLarge)
		c.log.Warn("closing client connection: message too large", zap.Error(err))
		c.finish()
		return
	case errors.Is(err, wire.ErrMalformed):
		c.srv.metrics.error(errMalformed)
		c.log.Warn("closing client connection: malformed message", zap.Error(err))
		c.finish()
		return
	case c.ctx.Err() != nil:
		c.log.Debug("connection closed", zap.Error(err))
	default:
		c.srv.metrics.error(errClientIO)
		c.log.Info("closing client connection: read failed", zap.Error(err))
	}
	c.close()
}

// handleRequest decodes one request, lets the interceptor decide, and acts.
// It returns false when the connection must close.
func (c *conn) handleRequest(raw *wire.RawMessage) bool {
	m := c.srv.metrics
	m.message(toUpstream, len(raw.Bytes))
	msg, err := wire.Parse(raw.Bytes, wire.Limits{MaxMessageSize: c.srv.opts.MaxMessageSize})
	if err != nil {
		return c.rejectMalformed(err)
	}
	// The opcode rules apply to what the server will execute: the inner
	// message of OP_COMPRESSED exactly as a bare one (nested compression
	// is refused by the codec).
	inner := msg
	if oc, ok := msg.(*wire.OpCompressed); ok {
		inner = oc.Inner
	}
	switch inner.(type) {
	case *wire.OpUnknown, *wire.OpReply:
		// Nothing a client may send; a server refuses it too. Forwarding
		// what cannot be inspected would let it past the policy.
		return c.rejectMalformed(fmt.Errorf("%w: opcode %v is not a client request", wire.ErrMalformed, inner.Header().OpCode))
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		return c.rejectMalformed(err)
	}
	hello := false
	var auth authStep
	var isAuth bool
	if cmd != nil {
		m.command(cmd)
		if cmd.Role() == wire.RoleHandshake {
			hello = true
			app, driver := helloClient(cmd.Body)
			c.info.setHandshake(app, driver)
		}
		auth, isAuth = c.authRequest(cmd)
	} else {
		m.legacyOps.WithLabelValues(raw.Header.OpCode.String()).Inc()
	}

	// Read once: the hook, the authentication step and forward all need
	// it.
	reply := expectsReply(msg)
	d := Decision{Action: Forward}
	if ic := c.srv.opts.Interceptor; ic != nil {
		c.req = Request{Message: msg, Command: cmd, Client: c.info, Scratch: c.req.Scratch, conn: c}
		d = ic.Intercept(c.ctx, &c.req)
	}
	if isAuth && (d.Action == Forward || d.Action == Rewrite) && reply {
		auth.id = msg.Header().RequestID
		if !c.trackAuth(auth) {
			c.srv.metrics.error(errMalformed)
			c.log.Warn("closing client connection: too many authentication requests in flight")
			return false
		}
	}
	var now time.Time
	if !d.Deadline.IsZero() && (d.Action == Forward || d.Action == Rewrite) {
		// The upstream connection is made first: a dial can take any
		// time, and the write's maxTimeMS counts from after it.
		if c.pumpDone == nil && !c.connectUpstream(msg) {
			if d.OnReply != nil {
				d.OnReply.Reply(c.ctx, nil) // it never left
			}
			return false
		}
		b := raw.Bytes
		if d.Action == Rewrite {
			b = d.Message
		}
		// The last clock reading before the bytes leave: it sets their
		// maxTimeMS, and it is the round trip's start (forward).
		if now = time.Now(); !d.Leave(b, now) {
			var late bsoncore.Document
			if d.LateReply != nil {
				late = d.LateReply.LateReply()
			}
			d = Decision{Action: Reply, Reply: late, OnReply: d.OnReply}
		}
	}
	if d.OnReply != nil {
		sent := d.Action == Forward || d.Action == Rewrite
		switch {
		case sent && reply:
			c.addHook(msg.Header().RequestID, d.OnReply)
		case sent:
			d.OnReply.Abandon()
		default:
			d.OnReply.Reply(c.ctx, nil) // it never left: nothing is in flight
		}
	}
	switch d.Action {
	case Forward:
		return c.forward(msg, raw.Bytes, hello, reply, now)
	case Rewrite:
		ok := c.forward(msg, d.Message, hello, reply, now)
		if d.MessageDone != nil {
			// Written (net.Conn.Write keeps none of it), or never
			// will be.
			d.MessageDone.ReleaseMessage(d.Message)
		}
		return ok
	case Reply:
		return c.reply(msg, cmd, d)
	default:
		c.log.Warn("closing client connection", zap.String("reason", d.Reason))
		return false
	}
}

func (c *conn) rejectMalformed(err error) bool {
	if errors.Is(err, wire.ErrTooLarge) {
		c.srv.metrics.error(errTooLarge)
	} else {
		c.srv.metrics.error(errMalformed)
	}
	c.log.Warn("closing client connection: malformed message", zap.Error(err))
	return false
}

// expectsReply reports whether the upstream answers a request: everything
// but fire-and-forget OP_MSG and the legacy write and killCursors opcodes.
func expectsReply(msg wire.Message) bool {
	switch m := msg.(type) {
	case *wire.OpMsg:
		return m.Flags&wire.MoreToCome == 0
	case *wire.OpCompressed:
		return expectsReply(m.Inner)
	case *wire.OpInsert, *wire.OpUpdate, *wire.OpDelete, *wire.OpKillCursors:
		return false
	}
	return true
}

// forward writes b, the request or its rewrite, to the upstream and
// records what its reply needs (reply: expectsReply(msg)); now, if not
// zero, is the clock read just before.
func (c *conn) forward(msg wire.Message, b []byte, hello, reply bool, now time.Time) bool {
	if c.pumpDone == nil && !c.connectUpstream(msg) {
		return false
	}
	id := msg.Header().RequestID
	if hello && reply && !c.trackHello(id) {
		c.srv.metrics.error(errMalformed)
		c.log.Warn("closing client connection: too many handshakes in flight")
		return false
	}
	if reply {
		c.inflight.Add(1)
		if now.IsZero() {
			now = time.Now()
		}
		c.rttAt.Store(now.UnixNano())
		c.rttID.Store(id)
	} else if msg.Header().OpCode != wire.OpCodeKillCursors {
		c.trackUnacked(id)
	}

	if _, err := c.upstream.Write(b); err != nil {
		if c.ctx.Err() == nil {
			c.srv.metrics.error(errUpstreamIO)
			c.log.Warn("closing client connection: upstream write failed", zap.Error(err))
		}
		return false
	}
	return true
}

// reply answers a request with a body the proxy made.
func (c *conn) reply(msg wire.Message, cmd *wire.Command, d Decision) bool {
	if cmd != nil && cmd.MoreToCome {
		if !isOK(d.Reply) {
			// mongod closes the connection when a fire-and-forget request
			// fails, since there is no reply to carry the error.
			c.srv.metrics.error(errUnackRejected)
			errmsg, _ := d.Reply.Lookup("errmsg").StringValueOK()
			c.log.Warn("closing client connection: unacknowledged request refused", zap.String("command", cmd.Name), zap.String("error", errmsg))
			return false
		}
		return true
	}
	b, ok := wire.ReplyTo(msg, c.nextID.Add(1), d.Reply)
	if !ok {
		// Legacy write opcodes have no reply either.
		if !isOK(d.Reply) {
			c.srv.metrics.error(errUnackRejected)
			c.log.Warn("closing client connection: unacknowledged legacy request refused", zap.Stringer("opcode", msg.Header().OpCode))
			return false
		}
		return true
	}
	c.srv.metrics.proxyReplies.Inc()
	return c.writeClient(b) == nil
}

func (c *conn) writeClient(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeSince.Store(time.Now().UnixNano())
	_, err := c.client.Write(b)
	c.writeSince.Store(0)
	if err != nil {
		if c.ctx.Err() == nil {
			c.srv.metrics.error(errClientIO)
			c.log.Info("closing client connection: write failed", zap.Error(err))
		}
		c.close()
		return err
	}
	c.srv.metrics.message(toClient, len(b))
	return nil
}

// upstreamPump relays replies to the client until either side goes away.
// Upstream replies are not decoded except the handshake replies it
// rewrites: the upstream is trusted to speak the protocol, and a reply it
// cannot frame closes the connection.
func (c *conn) upstreamPump() {
	r := bufio.NewReaderSize(c.upstream, readBufferSize)
	// Replies may be as large as the upstream allows; the proxy's limit
	// governs what clients send.
	lim := wire.Limits{MaxMessageSize: wire.DefaultMaxMessageSize}
	for {
		raw, err := wire.ReadMessage(r, c.srv.pool, lim)
		if err != nil {
			if c.ctx.Err() == nil {
				if errors.Is(err, io.EOF) {
					c.log.Info("closing client connection: upstream closed the connection")
				} else {
					c.srv.metrics.error(errUpstreamIO)
					c.log.Warn("closing client connection: upstream read failed", zap.Error(err))
				}
			}
			c.close()
			return
		}
		err = c.relayReply(raw)
		raw.Release()
		if err != nil {
			c.close()
			return
		}
		if c.draining.Load() && c.inflight.Load() == 0 {
			c.close()
			return
		}
	}
}

func (c *conn) relayReply(raw *wire.RawMessage) error {
	h := raw.Header
	flags, _ := wire.PeekMsgFlags(raw.Bytes)
	moreToCome := flags&wire.MoreToCome != 0

	if c.rttID.Load() == h.ResponseTo {
		if at := c.rttAt.Swap(0); at != 0 {
			c.srv.metrics.roundTrip.Observe(float64(time.Now().UnixNano()-at) / 1e9)
		}
	}
	if c.nAsks.Load() > 0 && c.answersAsk(h.ResponseTo, raw.Bytes) {
		return nil // the proxy's own request: never the client's
	}
	if c.nUnacked.Load() > 0 && c.answersUnacked(h.ResponseTo) {
		c.srv.metrics.droppedReplies.Inc()
		c.log.Debug("dropped an upstream reply to a fire-and-forget request", zap.Int32("responseTo", h.ResponseTo))
		return nil
	}
	if c.nAuth.Load() > 0 {
		if step, ok := c.answersAuth(h.ResponseTo); ok {
			if body, ok := replyBody(raw.Bytes); ok {
				c.authReply(step, body)
			}
		}
	}
	hello := c.nHellos.Load() > 0 && c.answersHello(h, moreToCome)
	if !moreToCome && c.inflight.Load() > 0 {
		if c.inflight.Add(-1) == 0 && c.nQuiet.Load() > 0 {
			defer c.wakeQuiet() // after the reply reaches the client
		}
	}

	b := raw.Bytes
	if c.nHooks.Load() > 0 && !moreToCome {
		b = c.hookReply(h, b)
	}
	if hello {
		rewritten, err := c.rewriteHelloReply(raw.Bytes)
		if err != nil {
			c.srv.metrics.error(errUpstreamReply)
			c.log.Warn("closing client connection: cannot rewrite the upstream's handshake reply", zap.Error(err))
			return err
		}
		if rewritten != nil {
			b = rewritten
		}
	}
	return c.writeClient(b)
}

// rewriteHelloReply returns the rewritten message, or nil when the reply
// needs no rewrite (an error reply).
func (c *conn) rewriteHelloReply(b []byte) ([]byte, error) {
	msg, err := wire.Parse(b, wire.Limits{MaxMessageSize: wire.DefaultMaxMessageSize})
	if err != nil {
		return nil, err
	}
	inner := msg
	if oc, ok := msg.(*wire.OpCompressed); ok {
		inner = oc.Inner
	}
	var body []byte
	switch m := inner.(type) {
	case *wire.OpMsg:
		body = m.Body
	case *wire.OpReply:
		if len(m.Documents) != 1 {
			return nil, fmt.Errorf("OP_REPLY to a handshake has %d documents, want 1", len(m.Documents))
		}
		body = m.Documents[0]
	default:
		return nil, fmt.Errorf("handshake reply in unexpected opcode %s", inner.Header().OpCode)
	}
	nb, changed, err := rewriteHello(body)
	if err != nil || !changed {
		return nil, err
	}
	c.srv.metrics.helloRewrites.Inc()
	return wire.WithBody(msg, nb)
}

// ask implements Request.Ask. It runs on the client pump (inside
// Intercept), the only goroutine that writes upstream.
func (c *conn) ask(ctx context.Context, body bsoncore.Document) (bsoncore.Document, error) {
	if err := c.waitAnswered(ctx); err != nil {
		return nil, err
	}
	if c.pumpDone == nil && !c.connectUpstream(nil) {
		return nil, ErrNoUpstream
	}
	id := c.nextID.Add(1)
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.asks == nil {
		c.asks = map[int32]chan []byte{}
	}
	c.asks[id] = ch
	c.nAsks.Store(int32(len(c.asks)))
	c.mu.Unlock()
	// The entry stays until its reply arrives, even if the caller stops
	// waiting: a late reply must be swallowed, never handed to the client
	// as the answer to a request it did not send.
	if _, err := c.upstream.Write(wire.AppendMsg(nil, id, 0, 0, body)); err != nil {
		return nil, err
	}
	select {
	case b := <-ch:
		doc, ok := replyBody(b)
		if !ok {
			return nil, fmt.Errorf("%w: unreadable reply to the proxy's own request", wire.ErrMalformed)
		}
		return doc, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, c.ctx.Err()
	}
}

// answersAsk hands a reply to the proxy's own request it answers, if any.
func (c *conn) answersAsk(responseTo int32, b []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.asks[responseTo]
	if ok {
		ch <- append([]byte(nil), b...)
		delete(c.asks, responseTo)
		c.nAsks.Store(int32(len(c.asks)))
	}
	return ok
}

// waitAnswered implements Request.WaitAnswered. The client pump is the
// caller, so inflight can only fall while it waits.
func (c *conn) waitAnswered(ctx context.Context) error {
	for c.inflight.Load() > 0 {
		ch := make(chan struct{})
		c.mu.Lock()
		c.quiet = append(c.quiet, ch)
		c.nQuiet.Store(int32(len(c.quiet)))
		c.mu.Unlock()
		// A reply that arrived between the check and the registration
		// found no waiter to wake: look again.
		if c.inflight.Load() == 0 {
			c.wakeQuiet()
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
	return nil
}

func (c *conn) wakeQuiet() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.quiet {
		close(ch)
	}
	c.quiet = nil
	c.nQuiet.Store(0)
}

// trackHello records a handshake request whose reply must be rewritten;
// false when too many are outstanding.
func (c *conn) trackHello(id int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hellos) >= maxPendingHellos {
		return false
	}
	c.hellos = append(c.hellos, id)
	c.nHellos.Store(int32(len(c.hellos)))
	return true
}

// maxUnacked bounds the fire-and-forget requests remembered per connection.
const maxUnacked = 16

func (c *conn) trackUnacked(id int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.unacked) == maxUnacked {
		c.unacked = c.unacked[1:]
	}
	c.unacked = append(c.unacked, id)
	c.nUnacked.Store(int32(len(c.unacked)))
}

// answersUnacked reports whether responseTo names a remembered
// fire-and-forget request.
func (c *conn) answersUnacked(responseTo int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range c.unacked {
		if id == responseTo {
			c.unacked = append(c.unacked[:i], c.unacked[i+1:]...)
			c.nUnacked.Store(int32(len(c.unacked)))
			return true
		}
	}
	return false
}

// answersHello reports whether a reply answers a tracked handshake, and
// keeps tracking a streamed handshake whose next reply answers this one.
func (c *conn) answersHello(h wire.Header, moreToCome bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range c.hellos {
		if id == h.ResponseTo {
			c.hellos = append(c.hellos[:i], c.hellos[i+1:]...)
			if moreToCome {
				c.hellos = append(c.hellos, h.RequestID)
			}
			c.nHellos.Store(int32(len(c.hellos)))
			return true
		}
	}
	return false
}

// watchedReader notes when a client message starts arriving, for the
// watchdog: an idle connection may wait forever, a client that trickles a
// message one byte at a time may not.
type watchedReader struct{ c *conn }

func (w watchedReader) Read(p []byte) (int, error) {
	n, err := w.c.client.Read(p)
	if n > 0 && w.c.readSince.Load() == 0 {
		w.c.readSince.Store(time.Now().UnixNano())
		if !w.c.spoke.Load() {
			// Once: a store on every message would dirty its line.
			w.c.spoke.Store(true)
		}
	}
	return n, err
}

// stuck reports why the connection has been stuck longer than the limits
// allow, or "" when it is not.
func (c *conn) stuck(now int64, message, write, handshake time.Duration) string {
	if !c.spoke.Load() && now-c.acceptedAt > int64(handshake) {
		return fmt.Sprintf("the client sent nothing within %v of connecting", handshake)
	}
	if t := c.readSince.Load(); t != 0 && now-t > int64(message) {
		return fmt.Sprintf("a message took longer than %v to arrive", message)
	}
	if t := c.writeSince.Load(); t != 0 && now-t > int64(write) {
		return fmt.Sprintf("the client did not read its replies for %v", write)
	}
	return ""
}
