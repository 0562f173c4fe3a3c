package guard

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"

	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/proxy"
)

// ownerKeys turns a caller's identity into the owner the lock store keeps:
// a keyed hash of the authenticated user and the logical session id, and
// of the bind value. The store, its backups and anyone who reads them see
// only these hashes, from which no session id, and so no write as the
// holder, can be recovered (docs/SECURITY.md). Safe for concurrent use.
type ownerKeys struct {
	pool sync.Pool // of hash.Hash keyed with the secret

	// known remembers the owner keys of recent (user, lsid) pairs: a
	// session writes many times, and the keyed hash costs more than the
	// rest of deriving its owner. Bounded by emptying it when full.
	mu    sync.Mutex
	known map[sessionKey][]byte
}

type sessionKey struct {
	user string
	lsid [16]byte
}

// maxKnownOwners bounds ownerKeys.known: sessions alive at once across
// all connections, well above what one proxy serves.
const maxKnownOwners = 1 << 14

// MinOwnerSecret is the shortest owner secret accepted, in bytes.
const MinOwnerSecret = 32

func newOwnerKeys(secret []byte) *ownerKeys {
	if len(secret) == 0 {
		secret = make([]byte, MinOwnerSecret)
		rand.Read(secret)
	}
	secret = append([]byte(nil), secret...)
	return &ownerKeys{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}, known: map[sessionKey][]byte{}}
}

// session is the owner key of (user, lsid): 16 bytes, the size of the
// session id it stands for, which keeps the store's records unchanged in
// shape. The user is length-prefixed so that no (user, lsid) pair can be
// made to collide with another by moving bytes between them.
//
// The result is shared: callers must not modify it.
func (k *ownerKeys) session(user string, lsid []byte) []byte {
	if len(lsid) != 16 {
		return k.derive(user, lsid)
	}
	sk := sessionKey{user: user, lsid: [16]byte(lsid)}
	k.mu.Lock()
	key, ok := k.known[sk]
	k.mu.Unlock()
	if ok {
		return key
	}
	key = k.derive(user, lsid)
	k.mu.Lock()
	if len(k.known) >= maxKnownOwners {
		clear(k.known)
	}
	k.known[sk] = key
	k.mu.Unlock()
	return key
}

func (k *ownerKeys) derive(user string, lsid []byte) []byte {
	h := k.pool.Get().(hash.Hash)
	defer k.pool.Put(h)
	h.Reset()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(user)))
	h.Write([]byte("lockgate owner v1\x00"))
	h.Write(n[:])
	h.Write([]byte(user))
	h.Write(lsid)
	return h.Sum(nil)[:16]
}

// bind is the stored form of a bind value; "" stays "" (no binding).
func (k *ownerKeys) bind(v string) string {
	if v == "" {
		return ""
	}
	h := k.pool.Get().(hash.Hash)
	defer k.pool.Put(h)
	h.Reset()
	h.Write([]byte("lockgate bind v1\x00"))
	h.Write([]byte(v))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// owner builds the lock owner of a request: the keyed hash of its user and
// logical session, plus the hashed binding when the caller asked for one.
// Neither the session id nor the bind value reaches the lock store.
func (g *Guard) owner(req *proxy.Request, session []byte, bind string) lockstore.Owner {
	o, _ := g.ownerAndFlights(req, session, bind)
	return o
}

// ownerAndFlights is owner, with the owner session's entry in the flight
// tracker that the connection kept from its last write in that session,
// if any (Flight.Session).
func (g *Guard) ownerAndFlights(req *proxy.Request, session []byte, bind string) (lockstore.Owner, *inflight.Session) {
	key, flights := g.sessionKey(req, session)
	return lockstore.Owner{
		Session: key,
		App:     req.Client.AppName(),
		Client:  req.Client.Addr,
		User:    req.Client.User(),
		Bind:    g.owners.bind(bind),
	}, flights
}

// sessionKey is g.owners.session for req's user and lsid, remembered by
// the connection for the session it wrote in last: a connection writes in
// one session at a time, and the shared map behind g.owners takes a lock
// every connection contends for. The key is a function of the guard's
// secret, the user and the lsid alone, so the memo can never be stale.
// The connection keeps the session's flight tracker entry beside it
// (keepFlights), returned too.
func (g *Guard) sessionKey(req *proxy.Request, lsid []byte) ([]byte, *inflight.Session) {
	user := req.Client.User()
	if len(lsid) != 16 {
		return g.owners.session(user, lsid), nil
	}
	st := connStateOf(req)
	if st == nil {
		return g.owners.session(user, lsid), nil
	}
	m := &st.owner
	if m.keys == g.owners && m.key != nil && m.user == user && m.lsid == [16]byte(lsid) {
		key, flights := m.key, m.flights
		st.mu.Unlock()
		return key, flights
	}
	st.mu.Unlock()
	key := g.owners.session(user, lsid)
	if st := connStateOf(req); st != nil {
		st.owner = ownerMemo{keys: g.owners, user: user, lsid: [16]byte(lsid), key: key}
		st.mu.Unlock()
	}
	return key, nil
}

// keepFlights remembers the flight tracker's entry of the owner session
// key beside the connection's owner memo, when that is still the key.
func keepFlights(req *proxy.Request, key []byte, flights *inflight.Session) {
	if st := connStateOf(req); st != nil {
		if m := &st.owner; m.key != nil && bytes.Equal(m.key, key) {
			m.flights = flights
		}
		st.mu.Unlock()
	}
}

// ownerMemo is a connection's latest session and its owner key
// (sessionKey), with the owner keys that made it, and the session's
// entry in the flight tracker once a write of it was launched.
type ownerMemo struct {
	keys    *ownerKeys
	user    string
	lsid    [16]byte
	key     []byte
	flights *inflight.Session
}
