package proxy

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestAuthenticateAndLogoutAsTheUpstreamSays: the one-step forms of the
// conversation the proxy follows (issue 10, item 3), by hand against a
// scripted server that accepts the X.509 subject CN=alice only. The user
// is the one the server's reply names (drivers send none for X.509), in
// the authenticate command and in a handshake's speculativeAuthenticate;
// a refused authenticate records nobody; logout returns the connection to
// nobody.
func TestAuthenticateAndLogoutAsTheUpstreamSays(t *testing.T) {
	accept := func(cmd bson.D) bool {
		for _, e := range cmd {
			if e.Key == "user" && e.Value != "CN=alice" {
				return false
			}
		}
		return true
	}
	up := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil {
			return nil
		}
		var body bson.D
		if err := bson.Unmarshal(cmd.Body, &body); err != nil {
			t.Fatal(err)
		}
		switch cmd.Name {
		case "authenticate":
			if !accept(body) {
				return s.Reply(req, mustDoc(t, bson.D{{"ok", 0.0}, {"code", int32(18)}, {"codeName", "AuthenticationFailed"}, {"errmsg", "no"}}))
			}
			return s.Reply(req, mustDoc(t, bson.D{{"dbname", "$external"}, {"user", "CN=alice"}, {"ok", 1.0}}))
		case "hello":
			return s.Reply(req, mustDoc(t, bson.D{{"isWritablePrimary", true}, {"maxWireVersion", int32(21)},
				{"speculativeAuthenticate", bson.D{{"dbname", "$external"}, {"user", "CN=alice"}}}, {"ok", 1.0}}))
		}
		return nil
	})
	rec := &userRecorder{}
	p := startProxy(t, Options{Upstream: dialTo(up.Addr()), Interceptor: rec})
	c := dialRaw(t, p.addr)
	do := func(cmd bson.D) {
		t.Helper()
		m, _ := c.msg(0, cmd)
		c.send(m)
		c.read()
	}
	ping := bson.D{{"ping", 1}, {"$db", "admin"}}
	x509 := bson.D{{"authenticate", 1}, {"mechanism", "MONGODB-X509"}, {"$db", "$external"}}

	do(x509)
	do(ping)
	if got := rec.last(); got != "CN=alice@$external" {
		t.Errorf("after an accepted X.509 authenticate naming no user: %q, want CN=alice@$external", got)
	}
	do(bson.D{{"logout", 1}, {"$db", "$external"}})
	do(ping)
	if got := rec.last(); got != "" {
		t.Errorf("after logout: %q, want nobody", got)
	}
	do(bson.D{{"authenticate", 1}, {"mechanism", "MONGODB-X509"}, {"user", "CN=mallory"}, {"$db", "$external"}})
	do(ping)
	if got := rec.last(); got != "" {
		t.Errorf("after a refused authenticate: %q, want nobody", got)
	}
	do(bson.D{{"hello", 1}, {"speculativeAuthenticate", bson.D{{"authenticate", 1}, {"mechanism", "MONGODB-X509"}, {"db", "$external"}}}, {"$db", "admin"}})
	do(ping)
	if got := rec.last(); got != "CN=alice@$external" {
		t.Errorf("after speculative X.509 in hello: %q, want CN=alice@$external", got)
	}
}
