package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/internal/scripted"
	"github.com/lockgate/lockgate/wire"
)

// scramUpstream plays a server that runs real SCRAM-SHA-256 conversations
// (the xdg-go implementation the Go driver itself uses) and knows one
// user, alice with password "right". FerretDB here enforces no
// authentication, so this is the only way to see an upstream refuse one.
func scramUpstream(t *testing.T) *scripted.Server {
	t.Helper()
	client, err := scram.SHA256.NewClient("alice", "right", "")
	if err != nil {
		t.Fatal(err)
	}
	creds := client.GetStoredCredentials(scram.KeyFactors{Salt: "lockgate-test-salt", Iters: 4096})
	server, err := scram.SHA256.NewServer(func(user string) (scram.StoredCredentials, error) {
		if user != "alice" {
			return scram.StoredCredentials{}, errUnknownUser
		}
		return creds, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	convs := map[int32]*scram.ServerConversation{}
	var nextConv atomic.Int32
	refuse := func(s *scripted.Server, req wire.Message) [][]byte {
		return s.Reply(req, wire.ErrorDocument(18, "AuthenticationFailed", "Authentication failed."))
	}
	return echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil {
			return nil
		}
		switch cmd.Name {
		case "hello", "isMaster", "ismaster":
			return s.Reply(req, mustDoc(t, bson.D{{"isWritablePrimary", true}, {"maxWireVersion", int32(21)}, {"minWireVersion", int32(0)},
				{"maxBsonObjectSize", int32(16777216)}, {"maxMessageSizeBytes", int32(48000000)}, {"ok", 1.0}}))
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
		return nil
	})
}

type authErr string

func (e authErr) Error() string { return string(e) }

const errUnknownUser = authErr("unknown user")

// userRecorder notes the connection's user as the proxy sees it on each
// ping: what lock ownership would be keyed by.
type userRecorder struct {
	mu    sync.Mutex
	users []string
}

func (r *userRecorder) Intercept(_ context.Context, req *Request) Decision {
	if req.Command != nil && req.Command.Name == "ping" {
		r.mu.Lock()
		r.users = append(r.users, req.Client.User())
		r.mu.Unlock()
	}
	return Decision{Action: Forward}
}

func (r *userRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.users) == 0 {
		return "<no ping>"
	}
	return r.users[len(r.users)-1]
}

// TestUserIsWhatTheUpstreamAccepted: the proxy records a connection's
// user only after the upstream accepted the SCRAM conversation (issue 10,
// item 3), with the real Go driver authenticating through the proxy; a
// user claimed in a conversation the upstream refused is never recorded
// (the proxy used to record the name from saslStart, before any verdict).
func TestUserIsWhatTheUpstreamAccepted(t *testing.T) {
	up := scramUpstream(t)
	rec := &userRecorder{}
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: rec})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	connect := func(user, pass string) (*mongo.Client, error) {
		o := options.Client().ApplyURI("mongodb://" + p.addr + "/?directConnection=true").
			SetAuth(options.Credential{Username: user, Password: pass, AuthMechanism: "SCRAM-SHA-256", AuthSource: "admin"}).
			SetServerSelectionTimeout(5 * time.Second)
		c, err := mongo.Connect(ctx, o)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Disconnect(context.Background()) })
		return c, c.Database("admin").RunCommand(ctx, bson.D{{"ping", 1}}).Err()
	}
	if _, err := connect("alice", "right"); err != nil {
		t.Fatalf("alice through the proxy: %v", err)
	}
	if got := rec.last(); got != "alice@admin" {
		t.Errorf("user after alice's accepted conversation = %q, want alice@admin", got)
	}
	if _, err := connect("alice", "wrong"); err == nil {
		t.Fatal("a wrong password was accepted")
	}

	// By hand, on one connection: a conversation the upstream refuses,
	// then a command on the same connection.
	c := dialRaw(t, p.addr)
	start, _ := c.msg(0, bson.D{{"saslStart", 1}, {"mechanism", "SCRAM-SHA-256"},
		{"payload", bsonBinary([]byte("n,,n=mallory,r=abcdefghijklmnop"))}, {"$db", "admin"}})
	c.send(start)
	if isOK(body(t, c.read())) {
		t.Fatal("the scripted server accepted mallory")
	}
	ping, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
	c.send(ping)
	c.read()
	if got := rec.last(); got != "" {
		t.Errorf("user after a refused conversation = %q, want none (a claimed user must not count)", got)
	}
	// A first step the server accepts is not yet an authentication.
	start, _ = c.msg(0, bson.D{{"saslStart", 1}, {"mechanism", "SCRAM-SHA-256"},
		{"payload", bsonBinary([]byte("n,,n=alice,r=abcdefghijklmnop"))}, {"$db", "admin"}})
	c.send(start)
	if !isOK(body(t, c.read())) {
		t.Fatal("the first SCRAM step for alice was refused")
	}
	c.send(ping)
	c.read()
	if got := rec.last(); got != "" {
		t.Errorf("user after an unfinished conversation = %q, want none", got)
	}
}

func bsonBinary(b []byte) any {
	return bson.RawValue{Type: bson.TypeBinary, Value: bsoncore.AppendBinary(nil, 0, b)}
}

// FuzzAuthReply feeds arbitrary reply bodies to every kind of
// authentication step: whatever the upstream sends, following the
// conversation never panics, and only ok with done (or an ok authenticate)
// records a user.
func FuzzAuthReply(f *testing.F) {
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).AppendBoolean("done", true).Build()))
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).AppendDocument("speculativeAuthenticate",
		bsoncore.NewDocumentBuilder().AppendBoolean("done", true).Build()).Build()))
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendInt32("ok", 0).AppendInt32("done", 1).Build()))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b), wire.Limits{}); err != nil {
			return // the proxy never reads a reply it cannot frame
		}
		for _, step := range []authStep{{user: "u@admin"}, {user: "u@admin", spec: true}, {logout: true}} {
			c := &conn{info: &ClientInfo{}}
			c.authReply(step, bsoncore.Document(b))
			if u := c.info.User(); u != "" && u != "u@admin" {
				t.Fatalf("recorded %q", u)
			}
		}
	})
}
