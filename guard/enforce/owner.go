package enforce

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strings"
	"sync"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// OwnerKeys turns a caller's identity into the owner the lock store keeps:
// a keyed hash of the authenticated user and the logical session id, and
// of the bind value. The store, its backups and anyone who reads them see
// only these hashes, from which no session id, and so no write as the
// holder, can be recovered (docs/SECURITY.md). Safe for concurrent use.
type OwnerKeys struct {
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

// maxKnownOwners bounds OwnerKeys.known: sessions alive at once across
// all connections, well above what one proxy serves.
const maxKnownOwners = 1 << 14

// MinOwnerSecret is the shortest owner secret accepted, in bytes.
const MinOwnerSecret = 32

// NewOwnerKeys returns the owner keys of secret; an empty secret is a
// random one, for this process alone.
func NewOwnerKeys(secret []byte) *OwnerKeys {
	if len(secret) == 0 {
		secret = make([]byte, MinOwnerSecret)
		rand.Read(secret)
	}
	secret = append([]byte(nil), secret...)
	return &OwnerKeys{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}, known: map[sessionKey][]byte{}}
}

// Session is the owner key of (user, lsid): 16 bytes, the size of the
// session id it stands for, which keeps the store's records unchanged in
// shape. The user is length-prefixed so that no (user, lsid) pair can be
// made to collide with another by moving bytes between them.
//
// The result is shared: callers must not modify it.
func (k *OwnerKeys) Session(user string, lsid []byte) []byte {
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

func (k *OwnerKeys) derive(user string, lsid []byte) []byte {
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

// Bind is the stored form of a bind value; "" stays "" (no binding).
func (k *OwnerKeys) Bind(v string) string {
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

// Owner is the lock owner of client c acting in the session whose owner
// key is key, bound to bind (not yet hashed): neither the session id nor
// the bind value reaches the lock store.
func (k *OwnerKeys) Owner(c *proxy.ClientInfo, key []byte, bind string) lockstore.Owner {
	return lockstore.Owner{
		Session: key,
		App:     c.AppName(),
		Client:  c.Addr,
		User:    c.User(),
		Bind:    k.Bind(bind),
	}
}

// Binding is the binding a write names in its comment, if any:
// "lockgate:<bind>" (a string, which every server accepts), or
// {lockgate: "<bind>"}; "" for none.
func Binding(cmd *wire.Command) string {
	c, ok := cmd.Kept(wire.KeyComment)
	if !ok {
		return ""
	}
	switch c.Type {
	case bson.TypeString:
		if b, ok := strings.CutPrefix(c.StringValue(), "lockgate:"); ok {
			return b
		}
	case bson.TypeEmbeddedDocument:
		if d, ok := c.DocumentOK(); ok {
			if b, ok := d.Lookup("lockgate").StringValueOK(); ok {
				return b
			}
		}
	}
	return ""
}
