package tests

import (
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// helloRewritten lists the keys the proxy changes in a handshake reply by
// design (DESIGN §3): it presents itself as a mongos-like router.
var (
	// mustBeAbsent point drivers past the proxy or announce features the
	// proxy does not relay.
	helloMustBeAbsent = []string{"setName", "hosts", "primary", "me", "passives", "arbiters", "topologyVersion"}
	// perConnection differ between any two connections, proxy or not.
	helloPerConnection = []string{"localTime", "connectionId"}
)

// TestHelloRewriteAsSeenByDriver sends every form of the handshake command
// through the proxy with the Go driver (OP_MSG) and, by hand, as a legacy
// OP_QUERY on admin.$cmd, and compares each reply with the upstream's own:
// msg must be "isdbgrid", nothing may point past the proxy, and every other
// field (wire versions, size limits, ...) must be the upstream's.
func TestHelloRewriteAsSeenByDriver(t *testing.T) {
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
	if proxied["msg"] != "isdbgrid" {
		t.Errorf("%s through the proxy: msg = %v, want \"isdbgrid\"", form, proxied["msg"])
	}
	for _, k := range helloMustBeAbsent {
		if v, ok := proxied[k]; ok {
			t.Errorf("%s through the proxy: %s = %v, want it absent", form, k, v)
		}
	}
	for _, k := range []string{"maxWireVersion", "minWireVersion", "maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize"} {
		if direct[k] != proxied[k] {
			t.Errorf("%s: %s is %v through the proxy, %v directly", form, k, proxied[k], direct[k])
		}
	}
	// Everything else is the upstream's, unchanged.
	for _, m := range []bson.M{direct, proxied} {
		for _, k := range append(append([]string{"msg"}, helloMustBeAbsent...), helloPerConnection...) {
			delete(m, k)
		}
	}
	d, _ := bson.MarshalExtJSON(direct, true, false)
	p, _ := bson.MarshalExtJSON(proxied, true, false)
	if dj, pj := canonicalJSON(t, d), canonicalJSON(t, p); dj != pj {
		t.Errorf("%s: the other fields differ\n  direct: %s\n  proxy:  %s", form, dj, pj)
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
