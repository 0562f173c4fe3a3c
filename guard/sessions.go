package guard

import (
	"context"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// sessionStage settles the commands that end sessions and transactions:
// endSessions releases the ended sessions' locks (below), and commit or
// abort decides a transaction's writes (txn.go). Everything else passes.
type sessionStage struct{ g *Guard }

func (s sessionStage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	cmd := req.Command
	if cmd == nil {
		return proxy.Decision{}, false
	}
	switch cmd.Role() {
	case wire.RoleEndSessions:
		return s.g.endSessions(ctx, req), true
	case wire.RoleEndTransaction:
		return s.g.endTransaction(ctx, req), true
	}
	return proxy.Decision{}, false
}

// endSessions releases the locks of every session the driver ends, then
// lets the upstream end the sessions too, or answers for an upstream that
// does not know the command. A lock store failure does not fail the
// command: drivers ignore endSessions errors, and the leases still expire.
func (g *Guard) endSessions(ctx context.Context, req *proxy.Request) proxy.Decision {
	// In the connection's order, like releaseLock: a write sent before
	// endSessions keeps its lock until it is answered.
	wctx, cancel := context.WithTimeout(ctx, g.opts.OrderTimeout)
	ordered := req.WaitAnswered(wctx) == nil
	cancel()
	arr, isArray := req.Command.Body.Lookup("endSessions").ArrayOK()
	if !isArray {
		// The server's answer, without a panic on the way.
		e := refuse.BadArg(mongoerr.TypeMismatch, "endSessions: the value must be an array of session ids, got %s", req.Command.Body.Lookup("endSessions").Type)
		return proxy.Decision{Action: proxy.Reply, Reply: e.Document()}
	}
	vals, err := arr.Values()
	if err == nil && !ordered {
		g.log.Warn("endSessions: requests sent before it were still running; the sessions' locks are left to expire with their leases")
		vals = nil
	}
	// One share of the connection's lock commands (throttle.go), not one
	// per session: ending a session that holds no lock through this
	// instance costs no round trip (the sweep for the others runs once a
	// second for all), and drivers end up to 10,000 sessions in one
	// command when they disconnect.
	if err == nil && len(vals) > 0 && !g.throttle.beforeLockCommand(ctx, req.Client.ID, 1) {
		vals = nil
	}
	if err == nil {
		for _, v := range vals {
			doc, ok := v.DocumentOK()
			if !ok {
				continue
			}
			data, ok := wire.SessionID(doc)
			if !ok {
				continue
			}
			// The locks of this session as this connection's user: an
			// endSessions naming someone else's session id from another
			// user releases nothing of theirs. Its writes in flight on
			// other connections keep their locks until answered.
			key := g.owners.session(req.Client.User(), data)
			wctx, cancel := context.WithTimeout(ctx, g.opts.OrderTimeout)
			err := g.flights.WaitSession(wctx, key)
			cancel()
			if err != nil {
				g.log.Warn("endSessions: the session's writes were still running; its locks are left to expire with their leases",
					zap.String("session", lockstore.SessionPrefix(data)))
				continue
			}
			n, err := g.opts.Store.ReleaseSession(ctx, key)
			if err != nil {
				g.log.Warn("endSessions: could not release the session's locks; they expire with their lease",
					zap.String("session", lockstore.SessionPrefix(data)), zap.Error(err))
				continue
			}
			g.metrics.sessionsEnded.Inc()
			if n > 0 {
				g.log.Debug("endSessions released locks", zap.String("session", lockstore.SessionPrefix(data)), zap.Int("released", n))
			}
		}
	}
	if g.upstreamKnowsEndSessions(ctx) {
		return proxy.Decision{Action: proxy.Forward}
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return proxy.Decision{Action: proxy.Reply, Reply: d}
}

// upstreamKnowsEndSessions reports whether the upstream answers
// endSessions, asking once (Options.EndSessionsSupported).
func (g *Guard) upstreamKnowsEndSessions(ctx context.Context) bool {
	switch g.endSessionsSupport.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	if g.opts.EndSessionsSupported == nil {
		return true
	}
	ok, err := g.opts.EndSessionsSupported(ctx)
	if err != nil {
		// Unknown: forward; a server that does not know the command
		// answers CommandNotFound, which drivers ignore for endSessions.
		return true
	}
	if ok {
		g.endSessionsSupport.Store(1)
	} else {
		g.endSessionsSupport.Store(2)
	}
	return ok
}
