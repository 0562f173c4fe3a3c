package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

type capture struct {
	client, name string
	raw          []byte
}

// loadCaptures reads every recorded frame, in recording order per client.
func loadCaptures(tb testing.TB) []capture {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "captures", "*", "*.bin"))
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(paths)
	var cs []capture
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		cs = append(cs, capture{client: filepath.Base(filepath.Dir(p)), name: filepath.Base(p), raw: b})
	}
	return cs
}

// summary is a one-line description of a frame used by the golden test:
// the opcode, and for commands "name db coll", for replies their ok value.
func summary(m Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", m.Header().OpCode)
	if c, _ := CommandOf(m); c != nil {
		fmt.Fprintf(&b, " %s %s %s", c.Name, c.DB, c.Collection)
		if c.LSID != nil {
			b.WriteString(" lsid")
		}
		for _, s := range c.Sequences {
			fmt.Fprintf(&b, " seq:%s:%d", s.Identifier, len(s.Documents))
		}
		return b.String()
	}
	var reply bsoncore.Document
	switch r := m.(type) {
	case *OpMsg:
		reply = r.Body
	case *OpReply:
		if len(r.Documents) == 1 {
			reply = r.Documents[0]
		}
	}
	if reply != nil {
		if v, err := reply.LookupErr("ok"); err == nil && v.IsNumber() {
			fmt.Fprintf(&b, " ok:%d", v.AsInt64())
		}
	}
	return b.String()
}

func TestGoldenCaptures(t *testing.T) {
	caps := loadCaptures(t)
	if len(caps) != len(goldenSummaries) {
		t.Errorf("%d captures on disk, %d expected", len(caps), len(goldenSummaries))
	}
	clients := map[string]bool{}
	for _, c := range caps {
		clients[c.client] = true
		key := c.client + "/" + c.name
		m, err := Parse(c.raw, Limits{})
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		if len(m.Raw()) != len(c.raw) || int(m.Header().MessageLength) != len(c.raw) {
			t.Errorf("%s: not every byte accounted for", key)
		}
		if want, ok := goldenSummaries[key]; !ok {
			t.Errorf("%s: unexpected capture", key)
		} else if got := summary(m); got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
		// The direction in the file name agrees with the opcode family.
		wantOp := strings.Split(strings.TrimSuffix(c.name, ".bin"), "-")[2]
		if got := strings.ToLower(m.Header().OpCode.String()); got != wantOp {
			t.Errorf("%s: opcode %s", key, got)
		}
		checkReencode(t, key, m)
	}
	for _, want := range []string{"go", "pymongo", "node"} {
		if !clients[want] {
			t.Errorf("no captures of %s", want)
		}
	}
}

// checkReencode asserts that re-encoding a parsed message with its own
// document reproduces the original bytes exactly.
func checkReencode(t *testing.T, key string, m Message) {
	t.Helper()
	var body bsoncore.Document
	switch m := m.(type) {
	case *OpMsg:
		body = m.Body
	case *OpQuery:
		body = m.Query
	case *OpReply:
		body = m.Documents[0]
	default:
		return
	}
	b, err := WithBody(m, body)
	if err != nil {
		t.Errorf("%s: WithBody: %v", key, err)
		return
	}
	if string(b) != string(m.Raw()) {
		t.Errorf("%s: re-encoding differs from the original bytes", key)
	}
}

// TestGoldenFacts checks what the proxy relies on in real traffic.
func TestGoldenFacts(t *testing.T) {
	byKey := map[string]Message{}
	for _, c := range loadCaptures(t) {
		m, err := Parse(c.raw, Limits{})
		if err != nil {
			t.Fatalf("%s/%s: %v", c.client, c.name, err)
		}
		byKey[c.client+"/"+c.name] = m
	}
	get := func(key string) Message {
		t.Helper()
		m, ok := byKey[key]
		if !ok {
			t.Fatalf("capture %s missing", key)
		}
		return m
	}

	// The Go driver offers the compressors of its URI in the handshake.
	hs, err := CommandOf(get("go/001-c2s-op_query.bin"))
	if err != nil || !hs.Legacy || hs.Name != "isMaster" || hs.DB != "admin" {
		t.Fatalf("go handshake: %+v, %v", hs, err)
	}
	comp, err := hs.Body.LookupErr("compression")
	if err != nil {
		t.Fatal("go handshake offers no compression")
	}
	vals, _ := comp.Array().Values()
	var offered []string
	for _, v := range vals {
		offered = append(offered, v.StringValue())
	}
	if strings.Join(offered, ",") != "zstd,snappy,zlib" {
		t.Errorf("go handshake offers %v", offered)
	}

	// Handshake replies come as OP_REPLY with one document carrying ok:1 and
	// the limits the proxy keeps.
	for _, key := range []string{"go/002-s2c-op_reply.bin", "pymongo/002-s2c-op_reply.bin", "node/002-s2c-op_reply.bin"} {
		r := get(key).(*OpReply)
		if len(r.Documents) != 1 || r.Header().ResponseTo != get(strings.Replace(key, "002-s2c-op_reply", "001-c2s-op_query", 1)).Header().RequestID {
			t.Errorf("%s: %d documents, responseTo %d", key, len(r.Documents), r.Header().ResponseTo)
		}
		for _, field := range []string{"maxBsonObjectSize", "maxMessageSizeBytes", "maxWireVersion"} {
			if _, err := r.Documents[0].LookupErr(field); err != nil {
				t.Errorf("%s: no %s", key, field)
			}
		}
	}

	// Statements in a kind-1 section (Go, pymongo) and in the body (Node).
	for key, want := range map[string]int{
		"go/009-c2s-op_msg.bin": 20, "go/023-c2s-op_msg.bin": 2, "pymongo/009-c2s-op_msg.bin": 10,
		"node/009-c2s-op_msg.bin": 8, "node/021-c2s-op_msg.bin": 1,
	} {
		c, err := CommandOf(get(key))
		if err != nil {
			t.Fatal(err)
		}
		field := map[string]string{"insert": "documents", "update": "updates", "delete": "deletes"}[c.Name]
		docs, err := c.Documents(field)
		if err != nil || len(docs) != want {
			t.Errorf("%s: %s has %d statements (%v), want %d", key, field, len(docs), err, want)
		}
		if id, ok := c.SessionID(); !ok || len(id) != 16 {
			t.Errorf("%s: no session id", key)
		}
	}

	// Every reply answers the request just before it.
	for key, m := range byKey {
		if !strings.Contains(key, "-s2c-") {
			continue
		}
		n := 0
		fmt.Sscanf(key[strings.Index(key, "/")+1:], "%03d", &n)
		req := get(fmt.Sprintf("%s/%03d-c2s-%s", key[:strings.Index(key, "/")], n-1, reqOpName(m)))
		if m.Header().ResponseTo != req.Header().RequestID {
			t.Errorf("%s: responseTo %d, request id %d", key, m.Header().ResponseTo, req.Header().RequestID)
		}
	}
}

func reqOpName(reply Message) string {
	if reply.Header().OpCode == OpCodeReply {
		return "op_query.bin"
	}
	return "op_msg.bin"
}
