package guard

import (
	"bytes"

	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// MinOwnerSecret is the shortest owner secret accepted, in bytes.
const MinOwnerSecret = enforce.MinOwnerSecret

// owner builds the lock owner of a request (enforce.OwnerKeys.Owner), for
// the stage packages that are given it: a copy of their own.
func (g *Guard) owner(req *proxy.Request, session []byte, bind string) lockstore.Owner {
	return g.owners.Owner(req.Client, g.owners.Session(req.Client.User(), session), bind)
}

// writeOwner is the lock owner a write acts as: its session, and the
// binding it names, if any, in its comment: "lockgate:<bind>" (a string,
// which every server accepts), or {lockgate: "<bind>"}. It is made into
// the verdict, which outlives every holder of it (the walk, the flight:
// a verdict is only reused once its flight landed with nothing else
// pointing into it), and which no one writes to once handed out.
//
// The session's memo (takeSession), when the decision gets it, gives the
// owner key, the binding's stored form and the session's flight tracker
// entry, and a copy of the session id for the audit line.
func (g *Guard) writeOwner(req *proxy.Request, v *verdict) (*lockstore.Owner, bool) {
	if req.Command == nil || req.Command.LSID == nil {
		return nil, false
	}
	lsid, ok := wire.SessionID(req.Command.LSID)
	if !ok {
		return nil, false
	}
	c := req.Client
	user := c.User()
	bind := enforce.Binding(req.Command)
	if m := g.sessionMemoOf(req, user, lsid, v); m != nil {
		v.LSID, v.Flights = m.lsid[:], m.flights
		// Field by field, not as a literal: a literal is built on the
		// stack and copied in (about 40 instructions more a write).
		o := &v.owner
		o.Session, o.App, o.Client, o.User = m.key, c.AppName(), c.Addr, user
		o.Bind, o.Implicit = m.boundOf(g.owners, bind), ""
		return o, true
	}
	v.LSID = bytes.Clone(lsid) // for the audit line: the request's buffer is not ours
	v.owner = g.owners.Owner(c, g.owners.Session(user, lsid), bind)
	return &v.owner, true
}

// sessionMemoOf is the memo of req's session, taken for the rest of its
// decision (connState.takeSession); nil without one.
func (g *Guard) sessionMemoOf(req *proxy.Request, user string, lsid []byte, v *verdict) *sessionMemo {
	if req.Client == nil || len(lsid) != 16 {
		return nil
	}
	st := v.home // the connection v's decision holds, as a rule
	if st == nil || st.deciding.Load() != req {
		if st, _ = req.Client.Local().(*connState); st == nil || st.deciding.Load() != req {
			return nil
		}
	}
	return st.takeSession(g.sessionMemos, g.owners, user, lsid, v.Now.UnixNano())
}
