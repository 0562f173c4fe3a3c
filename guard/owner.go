package guard

import (
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/proxy"
)

// MinOwnerSecret is the shortest owner secret accepted, in bytes.
const MinOwnerSecret = enforce.MinOwnerSecret

// owner builds the lock owner of a request (enforce.OwnerKeys.Owner), for
// the stage packages that are given it: a copy of their own.
func (g *Guard) owner(req *proxy.Request, session []byte, bind string) lockstore.Owner {
	o, _ := g.ownerAndFlights(req, session, bind)
	return *o
}

// ownerAndFlights is owner, shared: the connection's owner memo's when
// the connection writes as it again (enforce.OwnerMemo.Owner), which no
// one may modify; with the owner session's entry in the flight tracker
// that the connection kept from its last write in that session, if any
// (Flight.Session).
func (g *Guard) ownerAndFlights(req *proxy.Request, session []byte, bind string) (*lockstore.Owner, *inflight.Session) {
	key, flights, st := g.sessionKey(req, session)
	if st == nil {
		o := g.owners.Owner(req.Client, key, bind)
		return &o, flights
	}
	o := st.owner.Owner(req.Client, bind)
	st.unlock(req)
	return o, flights
}

// sessionKey is g.owners.Session for req's user and lsid, through the
// connection's memo (enforce.OwnerMemo), with the session's flight
// tracker entry the memo kept (keepFlights). The connection is unlocked
// while the key is derived. st, when not nil, is the connection, locked,
// whose memo holds the key: the caller unlocks it.
func (g *Guard) sessionKey(req *proxy.Request, lsid []byte) (_ []byte, _ *inflight.Session, st *connState) {
	user := req.Client.User()
	if len(lsid) != 16 {
		return g.owners.Session(user, lsid), nil, nil
	}
	st = connStateOf(req)
	if st == nil {
		return g.owners.Session(user, lsid), nil, nil
	}
	if key, flights, ok := st.owner.Get(g.owners, user, lsid); ok {
		return key, flights, st
	}
	st.unlock(req)
	key := g.owners.Session(user, lsid)
	if st := connStateOf(req); st != nil {
		st.owner.Set(g.owners, user, lsid, key)
		return key, nil, st
	}
	return key, nil, nil
}

// keepFlights remembers the flight tracker's entry of the owner session
// key beside the connection's owner memo, when that is still the key.
func keepFlights(req *proxy.Request, key []byte, flights *inflight.Session) {
	if st := connStateOf(req); st != nil {
		st.owner.KeepFlights(key, flights)
		st.unlock(req)
	}
}
