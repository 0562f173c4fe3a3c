package scripted

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/wire"
)

// SCRAMAuthz is SCRAM for one connection of a server that also enforces
// authorization: once a user has authenticated on the connection, an
// insert, update or delete is allowed only on the namespaces mayWrite
// lists for that user ("db.coll"), a find only on those mayRead lists, and
// anything else is refused with Unauthorized (13), as is any of them
// before authentication. Use it with StartPerConn, which calls it once per
// connection.
func SCRAMAuthz(users map[string]string, mayWrite, mayRead map[string][]string, next Handler) (Handler, error) {
	user := "" // authenticated on this connection
	var pending string
	inner, err := SCRAM(users, func(s *Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil {
			var grants map[string][]string
			switch cmd.Name {
			case "insert", "update", "delete":
				grants = mayWrite
			case "find":
				grants = mayRead
			}
			if grants != nil {
				allowed := false
				for _, ns := range grants[user] {
					allowed = allowed || ns == cmd.DB+"."+cmd.Collection
				}
				if user == "" || !allowed {
					return s.Reply(req, (&mongoerr.Error{Code: mongoerr.Unauthorized, Msg: "not authorized on " + cmd.DB + " to execute command " + cmd.Name}).Document())
				}
			}
		}
		return next(s, req, cmd)
	})
	if err != nil {
		return nil, err
	}
	return func(s *Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.Name == "saslStart" {
			_, payload, _ := cmd.Body.Lookup("payload").BinaryOK()
			pending = scramName(payload)
		}
		if cmd != nil && (cmd.Name == "hello" || cmd.Name == "isMaster" || cmd.Name == "ismaster") {
			if spec, ok := cmd.Body.Lookup("speculativeAuthenticate").DocumentOK(); ok {
				_, payload, _ := spec.Lookup("payload").BinaryOK()
				pending = scramName(payload)
			}
		}
		replies := inner(s, req, cmd)
		if cmd != nil && (cmd.Name == "saslStart" || cmd.Name == "saslContinue") && len(replies) == 1 {
			if m, err := wire.Parse(replies[0], wire.Limits{}); err == nil {
				if msg, ok := m.(*wire.OpMsg); ok {
					if done, _ := msg.Body.Lookup("done").BooleanOK(); done {
						user = pending
					}
				}
			}
		}
		return replies
	}, nil
}

func scramName(payload []byte) string {
	for _, part := range strings.Split(string(payload), ",") {
		if u, ok := strings.CutPrefix(part, "n="); ok {
			return u
		}
	}
	return ""
}

// SCRAM returns a handler that plays a server enforcing SCRAM-SHA-256
// authentication for users (name -> password) with the real conversation
// (the xdg-go implementation the Go driver itself uses): saslStart and
// saslContinue are answered, a wrong password or unknown user is refused
// with AuthenticationFailed (18), and listDatabases on a connection that
// has not authenticated is refused with Unauthorized (13), as a server
// with authorization enabled does. Every other request goes to next. The
// embedded FerretDB enforces no authentication, hence this.
func SCRAM(users map[string]string, next Handler) (Handler, error) {
	creds := map[string]scram.StoredCredentials{}
	for u, p := range users {
		c, err := scram.SHA256.NewClient(u, p, "")
		if err != nil {
			return nil, err
		}
		creds[u] = c.GetStoredCredentials(scram.KeyFactors{Salt: "lockgate-scripted-salt", Iters: 4096})
	}
	server, err := scram.SHA256.NewServer(func(user string) (scram.StoredCredentials, error) {
		c, ok := creds[user]
		if !ok {
			return scram.StoredCredentials{}, errors.New("unknown user")
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	convs := map[int32]*scram.ServerConversation{}
	var nextConv atomic.Int32
	refuse := func(s *Server, req wire.Message) [][]byte {
		return s.Reply(req, (&mongoerr.Error{Code: mongoerr.AuthenticationFailed, Msg: "Authentication failed."}).Document())
	}
	return func(s *Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil {
			return next(s, req, cmd)
		}
		switch cmd.Name {
		case "hello", "isMaster", "ismaster":
			// Speculative authentication: the first SCRAM step rides in
			// the handshake, its answer in the handshake's reply, as
			// drivers do for SCRAM-SHA-256 against servers of 4.4 on.
			spec, ok := cmd.Body.Lookup("speculativeAuthenticate").DocumentOK()
			if !ok {
				break
			}
			if _, err := spec.LookupErr("saslStart"); err != nil {
				break
			}
			replies := next(s, req, cmd)
			if len(replies) != 1 {
				return replies
			}
			m, err := wire.Parse(replies[0], wire.Limits{})
			if err != nil {
				return replies
			}
			var body bsoncore.Document
			switch r := m.(type) {
			case *wire.OpMsg:
				body = r.Body
			case *wire.OpReply:
				if len(r.Documents) == 1 {
					body = r.Documents[0]
				}
			}
			if body == nil {
				return replies
			}
			_, payload, _ := spec.Lookup("payload").BinaryOK()
			conv := server.NewConversation()
			out, err := conv.Step(string(payload))
			if err != nil {
				return replies // no speculative answer: the driver starts over
			}
			mu.Lock()
			id := nextConv.Add(1)
			convs[id] = conv
			mu.Unlock()
			answer := bsoncore.NewDocumentBuilder().AppendInt32("conversationId", id).AppendBoolean("done", false).
				AppendBinary("payload", 0, []byte(out)).Build()
			elems, _ := body.Elements()
			b := bsoncore.NewDocumentBuilder()
			for _, e := range elems {
				b.AppendValue(e.Key(), e.Value())
			}
			return s.Reply(req, b.AppendDocument("speculativeAuthenticate", answer).Build())
		case "listDatabases":
			// Only the unauthenticated probe sends it here.
			return s.Reply(req, (&mongoerr.Error{Code: mongoerr.Unauthorized, Msg: "command listDatabases requires authentication"}).Document())
		case "saslStart", "saslContinue":
			_, payload, _ := cmd.Body.Lookup("payload").BinaryOK()
			mu.Lock()
			var id int32
			var conv *scram.ServerConversation
			if cmd.Name == "saslStart" {
				id, conv = nextConv.Add(1), server.NewConversation()
				convs[id] = conv
			} else {
				id, _ = cmd.Body.Lookup("conversationId").Int32OK()
				conv = convs[id]
			}
			mu.Unlock()
			if conv == nil {
				return refuse(s, req)
			}
			out := ""
			if !conv.Done() {
				var err error
				if out, err = conv.Step(string(payload)); err != nil {
					return refuse(s, req)
				}
			}
			return s.Reply(req, bsoncore.NewDocumentBuilder().AppendInt32("conversationId", id).
				AppendBoolean("done", conv.Done() && conv.Valid()).AppendBinary("payload", 0, []byte(out)).AppendDouble("ok", 1).Build())
		}
		return next(s, req, cmd)
	}, nil
}
