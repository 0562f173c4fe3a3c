package proxy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/upstream"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// replicaSet is two scripted members whose primary a test can move.
type replicaSet struct {
	mu      sync.Mutex
	primary string
	members []*scripted.Server
}

func (rs *replicaSet) setPrimary(addr string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.primary = addr
}

func (rs *replicaSet) hello(t *testing.T, s *scripted.Server) bson.D {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	hosts := bson.A{}
	for _, m := range rs.members {
		hosts = append(hosts, m.Addr())
	}
	isPrimary := rs.primary == s.Addr()
	return bson.D{
		{"helloOk", true},
		{"isWritablePrimary", isPrimary},
		{"ismaster", isPrimary},
		{"secondary", !isPrimary},
		{"hosts", hosts},
		{"setName", "rs0"},
		{"setVersion", int32(1)},
		{"primary", rs.primary},
		{"me", s.Addr()},
		{"maxBsonObjectSize", int32(16777216)},
		{"maxMessageSizeBytes", int32(48000000)},
		{"maxWriteBatchSize", int32(100000)},
		{"logicalSessionTimeoutMinutes", int32(30)},
		{"minWireVersion", int32(0)},
		{"maxWireVersion", int32(21)},
		{"ok", 1.0},
	}
}

func startReplicaSet(t *testing.T) *replicaSet {
	rs := &replicaSet{}
	for i := 0; i < 2; i++ {
		m := echoUpstream(t, func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
			if cmd != nil && (cmd.Role() == wire.RoleHandshake) {
				return s.Reply(req, mustDoc(t, rs.hello(t, s)))
			}
			return nil
		})
		rs.members = append(rs.members, m)
	}
	rs.setPrimary(rs.members[0].Addr())
	return rs
}

// TestFollowsThePrimary: with a replica-set URI, client connections reach
// the primary; after an election, connections bound to the old primary are
// closed once idle and new ones reach the new primary.
func TestFollowsThePrimary(t *testing.T) {
	rs := startReplicaSet(t)
	a, b := rs.members[0].Addr(), rs.members[1].Addr()
	up, err := upstream.New(context.Background(), upstream.Options{
		URI: "mongodb://" + b + "," + a + "/?replicaSet=rs0&heartbeatFrequencyMS=500",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	p := startProxy(t, Options{Upstream: up})

	served := func(c *rawClient) string {
		t.Helper()
		req, _ := c.msg(0, bson.D{{"ping", 1}, {"$db", "admin"}})
		c.send(req)
		s, _ := body(t, c.read()).Lookup("served").StringValueOK()
		return s
	}
	first := dialRaw(t, p.addr)
	if got := served(first); got != a {
		t.Fatalf("ping served by %s, want the primary %s", got, a)
	}

	rs.setPrimary(b)
	testkit.Eventually(t, 10*time.Second, "the election to be noticed", func() bool { return up.Target() == b })
	first.expectClosed()
	second := dialRaw(t, p.addr)
	if got := served(second); got != b {
		t.Fatalf("after the election, ping served by %s, want the new primary %s", got, b)
	}
	if n := testutilCount(p.metrics.retiredConns); n != 1 {
		t.Fatalf("retired connections = %v, want 1", n)
	}
}
