package guard

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/reqplan"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.uber.org/zap"
	"golang.org/x/text/unicode/norm"
)

// Reserved names the lock store's own namespaces, which no client request
// through the proxy may read or write in any form (docs/SECURITY.md): a
// reader would learn who holds what, a writer could erase or forge locks.
// Operators see locks through the admin endpoints instead.
type Reserved struct {
	// DB is the lock store's database.
	DB string
	// Collections are its collections in DB: the lock records and the
	// claims beside them.
	Collections []string
}

// ReservedFor returns the namespaces of a lock store configured with
// database db and lock collection coll.
func ReservedFor(db, coll string) Reserved {
	return Reserved{DB: db, Collections: []string{coll, coll + lockstore.ClaimsSuffix, coll + lockstore.TxnsSuffix, coll + lockstore.InstancesSuffix, coll + lockstore.WakeSuffix}}
}

// dbMatches compares database names as an upstream that folds case
// would: MongoDB refuses a second database that differs only by case, and
// FerretDB's SQLite backend folds table names, so "LockGate" must be
// treated as "lockgate".
func (r Reserved) dbMatches(db string) bool {
	return db == policy.UnknownNS || sameName(db, r.DB)
}

// touches reports whether (db, coll) is, or may be, a reserved namespace;
// coll "" is the whole database.
func (r Reserved) touches(db, coll, command string) bool {
	if r.DB == "" || !r.dbMatches(db) {
		return false
	}
	if coll == policy.UnknownNS {
		return true
	}
	if coll == "" {
		// Database-level commands that name no collection and reveal
		// nothing but collection names may run on the lock store's
		// database, which may hold application data too; everything else
		// that acts on the database as a whole is refused there.
		spec := wire.LookupCommand(command)
		return spec == nil || spec.Scope != wire.ScopeNoCollection
	}
	for _, c := range r.Collections {
		if sameName(coll, c) {
			return true
		}
	}
	return false
}

// sameName compares names case-insensitively and, for non-ASCII names,
// after compatibility normalization, so that neither "LOCKS" nor a
// full-width "ｌｏｃｋｓ" slips past an upstream that would map it to the
// same storage. ASCII names, nearly all traffic, take the fast path.
func sameName(a, b string) bool {
	if strings.EqualFold(a, b) {
		return true
	}
	if isASCII(a) {
		return false
	}
	return strings.EqualFold(norm.NFKC.String(a), norm.NFKC.String(b))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// boundaryStage refuses, first and whatever the policy, a request that
// reaches the lock store in any form (lock commands on it included) or,
// while anything is enforced, lists or ends other clients' sessions.
type boundaryStage struct{ g *Guard }

func (s boundaryStage) Decide(ctx context.Context, req *proxy.Request) (proxy.Decision, bool) {
	g := s.g
	e, what := g.boundaryRefusal(req, g.policy.Load())
	if e == nil {
		return proxy.Decision{}, false
	}
	g.metrics.reservedRefusals.WithLabelValues(what).Inc()
	level := zap.InfoLevel
	if routineProbe(req) {
		// Every mongosh asks for the startup warnings on connect: a
		// line at info for each would read as an alarm to an
		// operator. It is still counted.
		level = zap.DebugLevel
	}
	g.log.Log(level, "refused a request across the proxy's boundary", zap.String("what", what), zap.Uint64("conn", req.Client.ID),
		zap.String("client", req.Client.Addr), zap.String("app", req.Client.AppName()), zap.String("error", e.Msg))
	return proxy.Decision{Action: proxy.Reply, Reply: e.Document()}, true
}

// boundaryRefusal returns the refusal of a request that crosses one of
// the lines drawn whatever the policy's modes: it names the lock store's
// namespaces, or, while introspection is not allowed, it lists or ends
// other clients' sessions. The request's plan (reqplan.Of) serves both, and
// enforcement after it. what is the metric label.
func (g *Guard) boundaryRefusal(req *proxy.Request, pol *policy.Policy) (e *refuse.Error, what string) {
	r := g.opts.Reserved
	introspect := pol == nil || pol.SessionIntrospection()
	if r.DB == "" && introspect {
		return nil, ""
	}
	var reserved, reveals string
	if cmd := req.Command; cmd != nil {
		if !introspect && revealsSessions(cmd) && !harmlessSessionCommand(req) {
			reveals = cmd.Name
		} else {
			reserved, reveals = g.boundaryRefs(reqplan.Of(req), cmd.Name, introspect)
		}
	} else {
		reserved, reveals = g.boundaryRefs(reqplan.Of(req), "", introspect)
	}
	name := "request"
	if req.Command != nil {
		name = req.Command.Name
	} else {
		name = req.Message.Header().OpCode.String()
	}
	switch {
	case reserved != "":
		return &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonReserved, NS: reserved,
			Msg: fmt.Sprintf("lockgate: %s refused: %s is reserved for the lock store, which clients cannot read or write through the proxy; "+
				"operators see locks on the admin listener (/locks)", name, reserved)}, "lock_store"
	case reveals != "":
		return &refuse.Error{Code: mongoerr.Unauthorized, Reason: refuse.ReasonIntrospection,
			Msg: fmt.Sprintf("lockgate: %s refused: it reveals or ends other clients' logical sessions, and while namespaces are enforced a session id "+
				"is enough to act as a lock holder on a deployment without authentication; an operator can allow it with policy.allowSessionIntrospection", reveals)}, "session_introspection"
	}
	return nil, ""
}

// boundaryRefs reads the request's plan for a namespace of the lock
// store, or, unless introspect, one that holds other sessions' ids or a
// stage that lists them; command is the command's name, "" for a legacy
// opcode. The plan holds every namespace the request names and every one
// it writes, so nothing the enforcement stage would see a write on can
// pass here unseen.
func (g *Guard) boundaryRefs(p *policy.Plan, command string, introspect bool) (reserved, reveals string) {
	r := g.opts.Reserved
	for _, ref := range p.Refs() {
		db, coll := ref.NS.DB(), ref.NS.Collection()
		switch {
		case r.DB != "" && r.touches(db, coll, command):
			switch {
			case ref.NS.IsUnknown():
				// It may reach any namespace (a change stream over the
				// deployment, applyOps by UUID).
				return r.DB + ".*", ""
			case coll == "":
				return db, ""
			}
			return db + "." + coll, ""
		case !introspect && reveals == "" && isSessionsCollection(db, coll):
			reveals = db + "." + coll
		}
	}
	if !introspect && reveals == "" {
		for _, s := range p.Stages() {
			if sessionStages[s] {
				return "", s
			}
		}
	}
	return "", reveals
}
