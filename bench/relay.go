package bench

import (
	"io"
	"net"
	"sync"
)

// Relay is the physical limit of any proxy on this machine: it accepts a
// connection, dials the target, and copies bytes both ways with io.Copy, one
// goroutine per direction, parsing nothing.
type Relay struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartRelay listens on a free loopback port and relays to target.
func StartRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the copies
// to end.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

// track adds or removes a connection; a connection added after Close is
// closed at once.
func (r *Relay) track(c net.Conn, add bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if add {
		if r.closed {
			c.Close()
			return
		}
		r.conns[c] = struct{}{}
	} else {
		delete(r.conns, c)
	}
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.relay(c)
	}
}

func (r *Relay) relay(client net.Conn) {
	defer r.wg.Done()
	r.track(client, true)
	defer r.track(client, false)
	defer client.Close()
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	r.track(up, true)
	defer r.track(up, false)
	defer up.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(up, client)
		// The client is gone: end the other direction too.
		up.Close()
	}()
	io.Copy(client, up)
	client.Close()
	<-done
}
