package guard

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Commands and stages that list other clients' logical sessions, or end
// them. Where the upstream enforces no authentication, a listed lsid is all
// it takes to act as that session, so while any namespace is enforced they
// are refused unless policy.allowSessionIntrospection says otherwise
// (docs/SECURITY.md).
var (
	sessionCommands = map[string]bool{
		"currentOp": true, "killSessions": true, "killAllSessions": true, "killAllSessionsByPattern": true,
	}
	sessionStages = map[string]bool{"$currentOp": true, "$listSessions": true, "$listLocalSessions": true}
)

// introspectionRefusal returns the refusal of a request that reveals or
// kills other sessions under pol, or nil.
func (g *Guard) introspectionRefusal(req *proxy.Request, pol *policy.Policy) *cmdError {
	if pol == nil || pol.SessionIntrospection() {
		return nil
	}
	what := ""
	if cmd := req.Command; cmd != nil {
		if sessionCommands[cmd.Name] && !(cmd.Name == "killSessions" && killsOnlyOwn(req)) {
			what = cmd.Name
		} else {
			policy.VisitReferences(cmd, func(db, coll string) bool {
				if isSessionsCollection(db, coll) {
					what = "config.system.sessions"
				}
				return what != ""
			}, func(stage string) bool {
				if sessionStages[stage] {
					what = stage
				}
				return what != ""
			})
		}
	} else if db, coll, ok := strings.Cut(legacyNamespace(req.Message), "."); ok && isSessionsCollection(db, coll) {
		what = "config.system.sessions"
	}
	if what == "" {
		return nil
	}
	return &cmdError{code: codeUnauthorized, reason: reasonIntrospection,
		msg: fmt.Sprintf("lockgate: %s refused: it lists or ends other clients' logical sessions, and while namespaces are enforced a session id "+
			"is enough to act as a lock holder on a deployment without authentication; an operator can allow it with policy.allowSessionIntrospection", what)}
}

func isSessionsCollection(db, coll string) bool {
	return sameName(db, "config") && sameName(coll, "system.sessions")
}

// killsOnlyOwn reports whether a killSessions command names no session but
// the caller's own.
func killsOnlyOwn(req *proxy.Request) bool {
	own, ok := req.Command.SessionID()
	if !ok {
		return false
	}
	v, err := req.Command.Body.LookupErr("killSessions")
	if err != nil {
		return false
	}
	arr, ok := v.ArrayOK()
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
		_, id, ok := d.Lookup("id").BinaryOK()
		if !ok || !bytes.Equal(id, own) {
			return false
		}
	}
	return true
}
