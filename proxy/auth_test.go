package proxy

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// scramUpstream plays a server that enforces SCRAM-SHA-256 for one user,
// alice with password "right", and answers everything else like
// echoUpstream; hello replies describe a standalone server.
func scramUpstream(t *testing.T) *scripted.Server {
	t.Helper()
	var up *scripted.Server
	h, err := scripted.SCRAM(map[string]string{"alice": "right"}, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && (cmd.Role() == wire.RoleHandshake) {
			return s.Reply(req, mustDoc(t, bson.D{{"isWritablePrimary", true}, {"maxWireVersion", int32(21)}, {"minWireVersion", int32(0)},
				{"maxBsonObjectSize", int32(16777216)}, {"maxMessageSizeBytes", int32(48000000)}, {"ok", 1.0}}))
		}
		if cmd == nil {
			return nil
		}
		return s.Reply(req, mustDoc(t, bson.D{{"ok", 1.0}, {"cmd", cmd.Name}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	up, err = scripted.Start(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

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
	// The driver began in its handshake (speculative authentication) and
	// never needed a saslStart: the path followed is the speculative one.
	spec, starts := 0, 0
	for _, b := range up.Requests() {
		switch {
		case bytes.Contains(b, []byte("speculativeAuthenticate")):
			spec++
		case bytes.Contains(b, []byte("saslStart\x00")):
			starts++
		}
	}
	if spec == 0 || starts != 0 {
		t.Errorf("%d handshakes with speculativeAuthenticate and %d saslStart, want the speculative path only", spec, starts)
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
		steps := []authStep{{kind: authStart, user: "u@admin"}, {kind: authStart, user: "u@admin", spec: true},
			{kind: authContinue, convID: 1}, {kind: authOnce, user: "u@admin"}, {kind: authOnce, spec: true}, {kind: authLogout}}
		for _, step := range steps {
			c := &conn{info: &ClientInfo{}, conv: conversation{user: "u@admin", id: 1}}
			c.authReply(step, bsoncore.Document(b))
			u := c.info.User()
			// Only the claimed user, or for authenticate the one the
			// reply itself names, can be recorded.
			named := ""
			body := bsoncore.Document(b)
			if step.spec {
				body, _ = body.Lookup("speculativeAuthenticate").DocumentOK()
			}
			if n, ok := body.Lookup("user").StringValueOK(); ok && n != "" {
				db, _ := body.Lookup("dbname").StringValueOK()
				named = qualify(truncate(n, 128), db)
			}
			if u != "" && u != "u@admin" && !(step.kind == authOnce && u == named) {
				t.Fatalf("step %+v recorded %q", step, u)
			}
			if u != "" && !isOK(bsoncore.Document(b)) {
				t.Fatalf("step %+v recorded %q from a failed reply", step, u)
			}
		}
	})
}

// askingInterceptor asks the upstream a question of its own, with a short
// patience, before letting each ping through.
type askingInterceptor struct {
	patience time.Duration
	// gaveUp, if set, receives once per question the proxy stopped
	// waiting for.
	gaveUp chan<- struct{}
}

func (a askingInterceptor) Intercept(ctx context.Context, req *Request) Decision {
	if req.Command != nil && req.Command.Name == "ping" {
		actx, cancel := context.WithTimeout(ctx, a.patience)
		_, err := req.Ask(actx, bsoncore.NewDocumentBuilder().AppendInt32("slowQuestion", 1).AppendString("$db", "admin").Build())
		cancel()
		if err != nil && a.gaveUp != nil {
			a.gaveUp <- struct{}{}
		}
	}
	return Decision{Action: Forward}
}

// TestLateAnswerToTheProxyIsNotTheClients: when the proxy stops waiting
// for its own request's reply, the reply that comes later is swallowed,
// never delivered to the client as the answer to its next request.
func TestLateAnswerToTheProxyIsNotTheClients(t *testing.T) {
	gaveUp := make(chan struct{}, 2)
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd != nil && cmd.Name == "slowQuestion" {
			// Answered only once the proxy stopped waiting for it.
			select {
			case <-gaveUp:
			case <-time.After(10 * time.Second):
			}
			return s.Reply(req, mustDoc(t, bson.D{{"ok", 1.0}, {"answer", "late"}}))
		}
		return nil
	})
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: askingInterceptor{patience: 50 * time.Millisecond, gaveUp: gaveUp}})
	c := dialRaw(t, p.addr)
	for i := 0; i < 2; i++ {
		req, id := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(req)
		reply := c.read()
		if reply.Header().ResponseTo != id {
			t.Fatalf("ping %d: reply answers %d, want %d", i, reply.Header().ResponseTo, id)
		}
		if _, err := body(t, reply).LookupErr("answer"); err == nil {
			t.Fatalf("ping %d: the client got the proxy's own late answer: %v", i, body(t, reply))
		}
	}
}
