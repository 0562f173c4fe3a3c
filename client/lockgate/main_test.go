package lockgate_test

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// upstream is the embedded FerretDB every test's gateway fronts.
var upstream *embedded.Server

func TestMain(m *testing.M) {
	os.Exit(testkit.RunMain(m, embedded.Shared(&upstream, embedded.Options{})))
}

// startGateway starts a lockgate in front of the embedded upstream that
// enforces every collection of database "kit". lockURI is the lock
// store's connection string ("" = the upstream).
func startGateway(t *testing.T, lockURI string) *gateway.Gateway {
	t.Helper()
	cfg := gatewaytest.Config(upstream.URI())
	cfg.Lockstore.URI = lockURI
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "kit.*", Mode: config.ModeEnforce}}
	return gatewaytest.Start(t, cfg, nil).Gateway
}

func connect(t *testing.T, uri, app string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(uri).SetAppName(app).SetServerSelectionTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c.Disconnect(ctx)
	})
	return c
}

func startSession(t *testing.T, c *mongo.Client) mongo.Session {
	t.Helper()
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.EndSession(context.Background()) })
	return s
}

// relay is a plain TCP relay that can be cut: after Cut it accepts
// nothing and every connection through it is closed, as if the server
// behind it had gone away.
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
	wg     sync.WaitGroup
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() { r.Cut(); r.wg.Wait() })
	return r
}

// Restore listens again on the same address after Cut, so that what the
// test started can shut down without waiting out the lock store's
// time-outs.
func (r *relay) Restore(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	ln, err := net.Listen("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatalf("relay restore: %v", err)
	}
	r.ln, r.cut = ln, false
	r.wg.Add(1)
	go r.accept()
}

func (r *relay) URI() string { return "mongodb://" + r.ln.Addr().String() + "/" }

func (r *relay) accept() {
	defer r.wg.Done()
	r.mu.Lock()
	ln := r.ln
	r.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		if r.cut {
			r.mu.Unlock()
			c.Close()
			u.Close()
			return
		}
		r.conns = append(r.conns, c, u)
		r.mu.Unlock()
		r.wg.Add(2)
		go func() { defer r.wg.Done(); io.Copy(u, c); u.Close() }()
		go func() { defer r.wg.Done(); io.Copy(c, u); c.Close() }()
	}
}

// Cut closes the listener and every relayed connection.
func (r *relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = true
	r.ln.Close()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}
