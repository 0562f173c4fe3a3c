package tests

import (
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Handshake fields that differ between any two connections, proxy or not.
var helloPerConnection = []string{"localTime", "connectionId"}

// TestHelloUnchangedForStandalone sends every form of the handshake command
// through the proxy with the Go driver (OP_MSG) and, by hand, as a legacy
// OP_QUERY on admin.$cmd, and compares each reply with the upstream's own.
// The embedded upstream is a standalone server, which has no members a
// driver could discover behind the proxy, so the proxy passes its reply on
// unchanged (DESIGN §3; docs/ARCHITECTURE.md): every field but the
// per-connection ones must be equal. The replica-set and router
// masquerade is tested against scripted upstreams in package proxy.
func TestHelloUnchangedForStandalone(t *testing.T) {
	g := startGateway(t, upstream.URI())
	ctx := testCtx(t, time.Minute)
	direct := connect(t, g.Direct).Database("admin")
	proxied := connect(t, g.URI).Database("admin")

	forms := []bson.D{
		{{Key: "hello", Value: 1}},
		{{Key: "hello", Value: true}},
		{{Key: "isMaster", Value: 1}},
		{{Key: "isMaster", Value: 1.0}},
		{{Key: "ismaster", Value: true}},
		{{Key: "ismaster", Value: int64(1)}},
	}
	for _, cmd := range forms {
		var want, got bson.M
		if err := direct.RunCommand(ctx, cmd).Decode(&want); err != nil {
			t.Fatalf("%v directly: %v", cmd, err)
		}
		if err := proxied.RunCommand(ctx, cmd).Decode(&got); err != nil {
			t.Fatalf("%v through the proxy: %v", cmd, err)
		}
		checkHello(t, cmd[0].Key+" over OP_MSG", want, got)
	}

	// Legacy OP_QUERY handshake, as pymongo 3.x and old drivers send it.
	cmd := bsoncore.NewDocumentBuilder().AppendInt32("isMaster", 1).Build()
	want := legacyIsMaster(t, g.Direct, upstream.Addr(), cmd)
	got := legacyIsMaster(t, g.URI, g.ProxyAddr().String(), cmd)
	checkHello(t, "isMaster over OP_QUERY", want, got)
}

func checkHello(t *testing.T, form string, direct, proxied bson.M) {
	t.Helper()
	if direct["maxWireVersion"] == nil || direct["maxBsonObjectSize"] == nil {
		t.Fatalf("%s: the upstream's reply lacks wire version or size limits: %v", form, direct)
	}
	if _, ok := direct["setName"]; ok {
		t.Fatalf("%s: the upstream is a replica-set member (%v); this test needs a standalone", form, direct["setName"])
	}
	for _, m := range []bson.M{direct, proxied} {
		for _, k := range helloPerConnection {
			delete(m, k)
		}
	}
	d, _ := bson.MarshalExtJSON(direct, true, false)
	p, _ := bson.MarshalExtJSON(proxied, true, false)
	if dj, pj := canonicalJSON(t, d), canonicalJSON(t, p); dj != pj {
		t.Errorf("%s: the reply through the proxy differs from the standalone's own\n  direct: %s\n  proxy:  %s", form, dj, pj)
	}
}

// legacyIsMaster sends cmd as OP_QUERY to admin.$cmd on a raw connection
// and returns the OP_REPLY's document.
func legacyIsMaster(t *testing.T, uri, addr string, cmd bsoncore.Document) bson.M {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", uri, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(opQueryBytes(42, "admin.$cmd", cmd)); err != nil {
		t.Fatalf("%s: write OP_QUERY: %v", uri, err)
	}
	m, err := readMessage(c)
	if err != nil {
		t.Fatalf("%s: reading the reply to OP_QUERY isMaster: %v", uri, err)
	}
	if m.ResponseTo != 42 {
		t.Errorf("%s: reply has responseTo %d, want 42", uri, m.ResponseTo)
	}
	doc, err := replyDoc(m)
	if err != nil {
		t.Fatalf("%s: %v", uri, err)
	}
	var out bson.M
	if err := bson.Unmarshal(doc, &out); err != nil {
		t.Fatalf("%s: %v", uri, err)
	}
	return out
}
