package schemes

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// cmdCounter is a TCP relay in front of the upstream that counts the
// OP_MSG commands lockgate sends, by name: the lock store's client and the
// forwarding connections alike go through it, so the counts between two
// snapshots are what one application write cost upstream.
type cmdCounter struct {
	ln net.Listener
	mu sync.Mutex
	n  map[string]int
}

func startCmdCounter(t *testing.T, upstream string) *cmdCounter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cmdCounter{ln: ln, n: map[string]int{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", upstream)
			if err != nil {
				in.Close()
				continue
			}
			go func() { io.Copy(in, out); in.Close() }()
			go func() { c.relay(in, out); out.Close() }()
		}
	}()
	return c
}

// relay copies client-to-server messages whole, noting each OP_MSG's
// command name (the first key of its body section).
func (c *cmdCounter) relay(in, out net.Conn) {
	var hdr [16]byte
	for {
		if _, err := io.ReadFull(in, hdr[:]); err != nil {
			return
		}
		size := int(binary.LittleEndian.Uint32(hdr[:4]))
		if size < 16 || size > 48<<20 {
			return
		}
		body := make([]byte, size-16)
		if _, err := io.ReadFull(in, body); err != nil {
			return
		}
		if binary.LittleEndian.Uint32(hdr[12:]) == 2013 && len(body) > 10 && body[4] == 0 {
			if doc, err := bson.Raw(body[5:]).Elements(); err == nil && len(doc) > 0 {
				c.mu.Lock()
				c.n[doc[0].Key()]++
				c.mu.Unlock()
			}
		}
		if _, err := out.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

// since returns the commands counted since the last call, heartbeats left
// out (the drivers' monitoring, not the write).
func (c *cmdCounter) since() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	total := 0
	for k, v := range c.n {
		if k == "hello" || k == "isMaster" || k == "ismaster" || k == "ping" {
			continue
		}
		total += v
		names = append(names, k+"="+itoa(v))
	}
	sort.Strings(names)
	c.n = map[string]int{}
	return total, strings.Join(names, " ")
}

// TestSchemeRoundTrips counts the upstream commands of a holderFields
// lock's life through lockgate (acquire, holder's write, release) against
// the same three writes sent straight to the database (one each), and
// checks the outcome of each: a measurement for docs/TESTING.md, run with
// -v to see it. Background work of the lock store (renewals, the
// registry's announcements) can add a command to a step; the lease here is
// long so that no renewal falls inside.
func TestSchemeRoundTrips(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := embedded.Start(embedded.Options{Dir: filepath.Join(dir, "ferretdb")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	counter := startCmdCounter(t, srv.Addr())
	cfg := gatewaytest.Config(strings.Replace(srv.URI(), srv.Addr(), counter.ln.Addr().String(), 1))
	cfg.Policy.Default = config.ModeOff
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "rt.*", Mode: config.ModeEnforce,
		Scheme: &config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 600000}}}
	cfg.Lockstore.OwnerSecretFile = filepath.Join(dir, "owner-secret")
	if err := os.WriteFile(cfg.Lockstore.OwnerSecretFile, []byte(strings.Repeat("0123456789abcdef", 3)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g, stop, err := gatewaytest.Run(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })

	ctx := context.Background()
	seed := connect(t, srv.URI(), "rt-seed").Database("rt").Collection("c")
	if _, err := seed.InsertMany(ctx, []any{bson.D{{"_id", 1}, {"n", 0}}, bson.D{{"_id", 2}, {"n", 0}}}); err != nil {
		t.Fatal(err)
	}
	free := bson.A{bson.D{{"LockId", nil}}, bson.D{{"LockTime", bson.D{{"$lt", primitive.NewDateTimeFromTime(time.Now().Add(-time.Hour))}}}}}
	steps := []struct {
		name   string
		filter bson.D
		update bson.D
	}{
		{"acquire", bson.D{{"_id", 0}, {"$or", free}}, bson.D{{"$set", bson.D{{"LockId", "h"}, {"LockTime", now()}}}}},
		{"holder's write", bson.D{{"_id", 0}, {"LockId", "h"}}, bson.D{{"$inc", bson.D{{"n", 1}}}}},
		{"release", bson.D{{"_id", 0}, {"LockId", "h"}}, bson.D{{"$set", bson.D{{"LockId", nil}}}}},
	}
	for _, via := range []struct {
		name string
		uri  string
		id   int
	}{{"lockgate", g.URI, 1}, {"direct", strings.Replace(srv.URI(), srv.Addr(), counter.ln.Addr().String(), 1), 2}} {
		coll := connect(t, via.uri, "rt-app").Database("rt").Collection("c")
		// A first round warms the connections and the lock store's
		// namespace; the second is the one counted.
		for round := 0; round < 2; round++ {
			for _, s := range steps {
				s.filter[0].Value = via.id
				counter.since()
				r, err := coll.UpdateOne(ctx, s.filter, s.update)
				n, names := counter.since()
				if err != nil || r.ModifiedCount != 1 {
					t.Fatalf("%s, %s: %+v, %v", via.name, s.name, r, err)
				}
				if round == 1 {
					t.Logf("%s: %s: %d upstream commands (%s)", via.name, s.name, n, names)
				}
			}
		}
	}
}
