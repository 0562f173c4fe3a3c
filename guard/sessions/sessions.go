// Package sessions is the guard's stage for the commands that end
// sessions and transactions. endSessions releases the ended sessions'
// locks here; commitTransaction and abortTransaction are decided by the
// function the stage is given (the guard's transaction check, which is
// enforcement's lock check and launch applied to the transaction's
// writes). The stage depends on nothing of the guard but what New is
// given.
package sessions

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// Config is what the stage needs from outside.
type Config struct {
	// Store releases a session's locks: the lock store's ReleaseSession.
	Store interface {
		ReleaseSession(ctx context.Context, session []byte) (int, error)
	}
	// Flights waits for a session's writes still in flight on this proxy
	// (inflight.Tracker).
	Flights interface {
		WaitSession(ctx context.Context, session []byte) error
	}
	// SessionKey is the owner key of a (user, lsid) session, under which
	// its locks are stored.
	SessionKey func(user string, lsid []byte) []byte
	// Admit waits until the connection may run a lock command on n ids
	// (the guard's throttle); false when ctx ends first.
	Admit func(ctx context.Context, conn *proxy.ClientInfo, n int) bool
	// EndTransaction decides commitTransaction and abortTransaction.
	EndTransaction func(ctx context.Context, req *proxy.Request) proxy.Decision
	// EndSessionsSupported tells whether the upstream knows endSessions
	// (guard.Options.EndSessionsSupported); nil means supported.
	EndSessionsSupported func(ctx context.Context) (bool, error)
	// Forget lets go of the guard's memos of an ended (user, lsid)
	// session; nil for none.
	Forget func(user string, lsid []byte)
	// OrderTimeout bounds the waits for the requests sent before.
	OrderTimeout time.Duration
	Log          *zap.Logger
	// Ended counts the sessions whose locks were released
	// (lockgate_sessions_ended_total, owned by the guard's metrics).
	Ended prometheus.Counter
}

// Stage settles the commands that end sessions and transactions; it is a
// proxy.Stage. Everything else passes.
type Stage struct {
	cfg Config
	// support caches the upstream's support of endSessions: 0 unknown,
	// 1 yes, 2 no.
	support atomic.Int32
}

// New returns the stage.
func New(cfg Config) *Stage { return &Stage{cfg: cfg} }

// Decide implements proxy.Stage.
func (s *Stage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	cmd := req.Command
	if cmd == nil {
		return proxy.Decision{}, false
	}
	switch cmd.Role() {
	case wire.RoleEndSessions:
		return s.endSessions(ctx, req), true
	case wire.RoleEndTransaction:
		return s.cfg.EndTransaction(ctx, req), true
	}
	return proxy.Decision{}, false
}

// endSessions releases the locks of every session the driver ends, then
// lets the upstream end the sessions too, or answers for an upstream that
// does not know the command. A lock store failure does not fail the
// command: drivers ignore endSessions errors, and the leases still expire.
func (s *Stage) endSessions(ctx context.Context, req *proxy.Request) proxy.Decision {
	cfg := &s.cfg
	// In the connection's order, like releaseLock: a write sent before
	// endSessions keeps its lock until it is answered.
	wctx, cancel := context.WithTimeout(ctx, cfg.OrderTimeout)
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
		cfg.Log.Warn("endSessions: requests sent before it were still running; the sessions' locks are left to expire with their leases")
		vals = nil
	}
	// One share of the connection's lock commands (the guard's throttle),
	// not one per session: ending a session that holds no lock through
	// this instance costs no round trip (the sweep for the others runs
	// once a second for all), and drivers end up to 10,000 sessions in
	// one command when they disconnect.
	if err == nil && len(vals) > 0 && !cfg.Admit(ctx, req.Client, 1) {
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
			if cfg.Forget != nil {
				cfg.Forget(req.Client.User(), data)
			}
			// The locks of this session as this connection's user: an
			// endSessions naming someone else's session id from another
			// user releases nothing of theirs. Its writes in flight on
			// other connections keep their locks until answered.
			key := cfg.SessionKey(req.Client.User(), data)
			wctx, cancel := context.WithTimeout(ctx, cfg.OrderTimeout)
			err := cfg.Flights.WaitSession(wctx, key)
			cancel()
			if err != nil {
				cfg.Log.Warn("endSessions: the session's writes were still running; its locks are left to expire with their leases",
					zap.String("session", lockstore.SessionPrefix(data)))
				continue
			}
			n, err := cfg.Store.ReleaseSession(ctx, key)
			if err != nil {
				cfg.Log.Warn("endSessions: could not release the session's locks; they expire with their lease",
					zap.String("session", lockstore.SessionPrefix(data)), zap.Error(err))
				continue
			}
			cfg.Ended.Inc()
			if n > 0 {
				cfg.Log.Debug("endSessions released locks", zap.String("session", lockstore.SessionPrefix(data)), zap.Int("released", n))
			}
		}
	}
	if s.upstreamKnowsEndSessions(ctx) {
		return proxy.Decision{Action: proxy.Forward}
	}
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return proxy.Decision{Action: proxy.Reply, Reply: d}
}

// upstreamKnowsEndSessions reports whether the upstream answers
// endSessions, asking once (Config.EndSessionsSupported).
func (s *Stage) upstreamKnowsEndSessions(ctx context.Context) bool {
	switch s.support.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	if s.cfg.EndSessionsSupported == nil {
		return true
	}
	ok, err := s.cfg.EndSessionsSupported(ctx)
	if err != nil {
		// Unknown: forward; a server that does not know the command
		// answers CommandNotFound, which drivers ignore for endSessions.
		return true
	}
	if ok {
		s.support.Store(1)
	} else {
		s.support.Store(2)
	}
	return ok
}
