package testkit

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Relay is a plain TCP relay to a server that a test can cut, as a
// network partition or a dead server would: after Cut it accepts nothing
// and every connection it relayed is closed. Restore listens again on
// the same address, so that what the test started can shut down without
// waiting out its time-outs.
type Relay struct {
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	cut   bool
}

// StartRelay relays a new local address to target until the test ends.
func StartRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: target}
	r.wg.Add(1)
	go r.accept(ln)
	t.Cleanup(func() { r.Cut(); r.wg.Wait() })
	return r
}

// URI is a MongoDB connection string to the relay.
func (r *Relay) URI() string { return "mongodb://" + r.Addr() + "/" }

// Addr is the relay's address, the same after Restore.
func (r *Relay) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ln.Addr().String()
}

func (r *Relay) accept(ln net.Listener) {
	defer r.wg.Done()
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
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = true
	r.ln.Close()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// Restore listens again on the relay's address after Cut.
func (r *Relay) Restore(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	ln, err := net.Listen("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatalf("relay restore: %v", err)
	}
	r.ln, r.cut = ln, false
	r.wg.Add(1)
	go r.accept(ln)
}
