package guard

import (
	"bytes"

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
