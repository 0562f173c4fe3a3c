package boundary

import (
	"bytes"

	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Commands and stages that list other clients' logical sessions, or end
// them. Where the upstream enforces no authentication, a listed lsid is all
// it takes to act as that session, so while any namespace is enforced they
// are refused unless policy.allowSessionIntrospection says otherwise
// (docs/SECURITY.md). The commands are marked RevealsSessions in the
// command table (getLog among them: slow operations are logged with their
// lsid); the aggregation stages are listed here.
var sessionStages = map[string]bool{"$currentOp": true, "$listSessions": true, "$listLocalSessions": true}

// isSessionsCollection reports whether (db, coll) holds other sessions'
// ids: the sessions collection, the retryable write and transaction
// tables (config.transactions and config.image_collection are keyed by
// lsid), the oplog (retryable writes carry their lsid), any database's
// profiler collection (profiled operations record theirs) and the legacy
// currentOp pseudo-collection.
func isSessionsCollection(db, coll string) bool {
	switch {
	case sameName(db, "config"):
		return sameName(coll, "system.sessions") || sameName(coll, "transactions") || sameName(coll, "image_collection")
	case sameName(db, "local"):
		return len(coll) > len("oplog.") && sameName(coll[:len("oplog.")], "oplog.")
	}
	return sameName(coll, "system.profile") || sameName(coll, "$cmd.sys.inprog")
}

func revealsSessions(cmd *wire.Command) bool {
	spec := cmd.Spec()
	return spec != nil && spec.RevealsSessions
}

// harmlessSessionCommand reports whether a command that reveals sessions
// reveals and ends nothing of other clients: killSessions of the caller's
// own session only, getLog: "*" (the names of the logs, no lines).
func harmlessSessionCommand(req *proxy.Request) bool {
	switch req.Command.Spec().Discloses {
	case wire.DisclosesUnlessOwn:
		return killsOnlyOwn(req)
	case wire.DisclosesLogLines:
		s, ok := firstValue(req.Command.Body).StringValueOK()
		return ok && s == "*"
	}
	return false
}

// routineProbe reports whether a request that reveals sessions is one
// that clients send on their own on every connection (mongosh's
// getLog: "startupWarnings"), not one a person typed: its refusal is
// expected and logged at debug.
func routineProbe(req *proxy.Request) bool {
	if req.Command == nil || req.Command.Spec() == nil || req.Command.Spec().Discloses != wire.DisclosesLogLines {
		return false
	}
	s, ok := firstValue(req.Command.Body).StringValueOK()
	return ok && s == "startupWarnings"
}

// firstValue is the value of a body's first element, the command's own.
func firstValue(body bsoncore.Document) bsoncore.Value {
	e, err := body.IndexErr(0)
	if err != nil {
		return bsoncore.Value{}
	}
	return e.Value()
}

// killsOnlyOwn reports whether a killSessions command names no session but
// the caller's own.
func killsOnlyOwn(req *proxy.Request) bool {
	own, ok := req.Command.SessionID()
	if !ok || len(req.Command.Sequences) > 0 {
		// A document sequence could add sessions to kill on an upstream
		// that reads it as part of the body.
		return false
	}
	arr, ok := firstValue(req.Command.Body).ArrayOK()
	if !ok {
		return false
	}
	vals, err := arr.Values()
	if err != nil {
		return false
	}
	for _, e := range vals {
		d, ok := e.DocumentOK()
		if !ok {
			return false
		}
		id, ok := wire.SessionID(d)
		if !ok || !bytes.Equal(id, own) {
			return false
		}
	}
	return true
}
