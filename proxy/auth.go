package proxy

import (
	"bytes"
	"strings"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Authentication is followed, not performed: the proxy reads the user a
// client names in its conversation, and counts the connection as
// authenticated as that user only once the upstream's reply says the
// conversation succeeded. Lock ownership is keyed by that user, so a
// user the upstream refused, or one merely claimed, owns nothing.

// authStep is one request of an authentication conversation awaiting its
// reply.
type authStep struct {
	id     int32
	user   string // "user@db" the conversation authenticates; "" for logout
	logout bool
	spec   bool // speculativeAuthenticate inside a handshake
}

// maxPendingAuth bounds the authentication requests one connection may
// have outstanding; drivers send one at a time.
const maxPendingAuth = 8

// authRequest inspects a command for an authentication step, returning
// what to track, if anything. The conversation's user carries over from
// saslStart to the saslContinue steps.
func (c *conn) authRequest(cmd *wire.Command) (authStep, bool) {
	switch cmd.Name {
	case "saslStart":
		u := saslUser(cmd.Body)
		c.authUser = qualify(u, cmd.DB)
		return authStep{user: c.authUser}, true
	case "saslContinue":
		return authStep{user: c.authUser}, c.authUser != ""
	case "authenticate":
		u, _ := cmd.Body.Lookup("user").StringValueOK()
		return authStep{user: qualify(truncate(u, 128), cmd.DB)}, u != ""
	case "logout":
		return authStep{logout: true}, true
	case "hello", "isMaster", "ismaster":
		spec, ok := cmd.Body.Lookup("speculativeAuthenticate").DocumentOK()
		if !ok {
			return authStep{}, false
		}
		db, _ := spec.Lookup("db").StringValueOK()
		u := saslUser(spec)
		if u == "" {
			u, _ = spec.Lookup("user").StringValueOK()
		}
		if u == "" {
			return authStep{}, false
		}
		c.authUser = qualify(truncate(u, 128), db)
		return authStep{user: c.authUser, spec: true}, true
	}
	return authStep{}, false
}

func qualify(user, db string) string {
	if user == "" {
		return ""
	}
	return user + "@" + db
}

// authReply applies the upstream's answer to an authentication step.
func (c *conn) authReply(step authStep, body bsoncore.Document) {
	ok := isOK(body)
	if step.logout {
		if ok {
			c.info.setUser("")
		}
		return
	}
	if step.spec {
		spec, found := body.Lookup("speculativeAuthenticate").DocumentOK()
		if !ok || !found {
			return // the driver goes on with saslStart, or gives up
		}
		body, ok = spec, true
	}
	done := true // authenticate has no done field: ok is the verdict
	if v, err := body.LookupErr("done"); err == nil {
		done = v.Type == bsontype.Boolean && v.Boolean()
	}
	if ok && done {
		c.info.setUser(step.user)
	}
	if !ok {
		c.authUser = ""
	}
}

// trackAuth remembers a step; false when too many are outstanding.
func (c *conn) trackAuth(s authStep) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.auth) >= maxPendingAuth {
		return false
	}
	c.auth = append(c.auth, s)
	c.nAuth.Store(int32(len(c.auth)))
	return true
}

// answersAuth returns the step a reply answers, if any.
func (c *conn) answersAuth(responseTo int32) (authStep, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.auth {
		if s.id == responseTo {
			c.auth = append(c.auth[:i], c.auth[i+1:]...)
			c.nAuth.Store(int32(len(c.auth)))
			return s, true
		}
	}
	return authStep{}, false
}

// replyBody is the body of an OP_MSG or the document of an OP_REPLY,
// decompressed.
func replyBody(b []byte) (bsoncore.Document, bool) {
	m, err := wire.Parse(b, wire.Limits{MaxMessageSize: wire.DefaultMaxMessageSize})
	if err != nil {
		return nil, false
	}
	if oc, ok := m.(*wire.OpCompressed); ok {
		m = oc.Inner
	}
	switch r := m.(type) {
	case *wire.OpMsg:
		return r.Body, true
	case *wire.OpReply:
		if len(r.Documents) == 1 {
			return r.Documents[0], true
		}
	}
	return nil, false
}

// saslUser reads the user name from the first SASL message: SCRAM's
// client-first "n,,n=<user>,r=<nonce>" or PLAIN's "\x00<user>\x00<pass>".
func saslUser(doc bsoncore.Document) string {
	mech, _ := doc.Lookup("mechanism").StringValueOK()
	_, payload, ok := doc.Lookup("payload").BinaryOK()
	if !ok {
		return ""
	}
	switch {
	case strings.HasPrefix(mech, "SCRAM-"):
		for _, part := range bytes.Split(payload, []byte(",")) {
			if u, ok := bytes.CutPrefix(part, []byte("n=")); ok {
				// SCRAM escapes ',' and '=' in names.
				name := strings.NewReplacer("=2C", ",", "=3D", "=").Replace(string(u))
				return truncate(name, 128)
			}
		}
	case mech == "PLAIN":
		parts := bytes.SplitN(payload, []byte{0}, 3)
		if len(parts) == 3 {
			return truncate(string(parts[1]), 128)
		}
	}
	return ""
}
