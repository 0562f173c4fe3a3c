package proxy

import (
	"bytes"
	"strings"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
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
	kind   wire.AuthStep
	user   string // "user@db" the request claims; "" where it names none
	convID int64  // saslContinue: the conversation it continues
	spec   bool   // speculativeAuthenticate inside a handshake
}

// The steps, as the command table names them.
const (
	authStart    = wire.AuthStart
	authContinue = wire.AuthContinue
	authOnce     = wire.AuthOnce
	authLogout   = wire.AuthLogout
)

// conversation is the SASL conversation the upstream has open on the
// connection: the user its saslStart claimed and the id the upstream gave
// it. A server keeps one per connection, and a later saslStart replaces
// it; a saslContinue counts only for the conversation it names, so a user
// claimed in one conversation is never credited with another's success.
type conversation struct {
	user string
	id   int64
}

// maxPendingAuth bounds the authentication requests one connection may
// have outstanding; drivers send one at a time.
const maxPendingAuth = 8

// authRequest inspects a command for an authentication step, returning
// what to track, if anything. It reads only the request: which user a
// step authenticates is decided when its reply comes (authReply).
func (c *conn) authRequest(cmd *wire.Command) (authStep, bool) {
	spec := cmd.Spec()
	if spec == nil {
		return authStep{}, false
	}
	switch spec.Role {
	case wire.RoleAuth:
	case wire.RoleHandshake:
		return speculativeAuth(cmd.Body)
	default:
		return authStep{}, false
	}
	switch spec.Auth {
	case authStart:
		return authStep{kind: authStart, user: qualify(saslUser(cmd.Body), cmd.DB)}, true
	case authContinue:
		id, ok := cmd.Body.Lookup("conversationId").AsInt64OK()
		return authStep{kind: authContinue, convID: id}, ok
	case authOnce:
		u, _ := cmd.Body.Lookup("user").StringValueOK()
		return authStep{kind: authOnce, user: qualify(truncate(u, 128), cmd.DB)}, true
	case authLogout:
		return authStep{kind: authLogout}, true
	}
	return authStep{}, false
}

// speculativeAuth is the authentication step a handshake carries in its
// speculativeAuthenticate document: a saslStart when the document has the
// saslStart command's field, else an authenticate.
func speculativeAuth(body bsoncore.Document) (authStep, bool) {
	spec, ok := body.Lookup("speculativeAuthenticate").DocumentOK()
	if !ok {
		return authStep{}, false
	}
	db, _ := spec.Lookup("db").StringValueOK()
	elems, _ := spec.Elements()
	for _, e := range elems {
		if c := wire.LookupCommand(e.Key()); c != nil && c.Auth == authStart {
			return authStep{kind: authStart, user: qualify(saslUser(spec), db), spec: true}, true
		}
	}
	u, _ := spec.Lookup("user").StringValueOK()
	return authStep{kind: authOnce, user: qualify(truncate(u, 128), db), spec: true}, true
}

func qualify(user, db string) string {
	if user == "" {
		return ""
	}
	return user + "@" + db
}

// authReply applies the upstream's answer to an authentication step.
// Replies come in the order of their requests; the conversation state is
// under mu, as the client pump tracks steps while this runs on the
// upstream pump.
func (c *conn) authReply(step authStep, body bsoncore.Document) {
	ok := isOK(body)
	if step.spec {
		spec, found := body.Lookup("speculativeAuthenticate").DocumentOK()
		if !ok || !found {
			return // the driver goes on with saslStart, or gives up
		}
		body = spec
	}
	done := true // authenticate has no done field: ok is the verdict
	if v, err := body.LookupErr("done"); err == nil {
		done = v.Type == bson.TypeBoolean && v.Boolean()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	user := ""
	switch step.kind {
	case authLogout:
		if ok {
			c.conv = conversation{}
			c.info.setUser("")
		}
		return
	case authStart:
		c.conv = conversation{}
		if ok {
			id, _ := body.Lookup("conversationId").AsInt64OK()
			c.conv = conversation{user: step.user, id: id}
			user = step.user
		}
	case authContinue:
		if !ok {
			c.conv = conversation{}
			return
		}
		if step.convID != c.conv.id {
			return // not the conversation whose user is known
		}
		user = c.conv.user
	case authOnce:
		user = step.user
		// The server names whom it authenticated (X.509 takes the name
		// from the certificate, and drivers may not send one).
		if u, ok := body.Lookup("user").StringValueOK(); ok && u != "" {
			db, _ := body.Lookup("dbname").StringValueOK()
			user = qualify(truncate(u, 128), db)
		}
	}
	if ok && done && user != "" {
		c.conv = conversation{}
		c.info.setUser(user)
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
