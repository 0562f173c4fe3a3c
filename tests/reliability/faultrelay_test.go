package reliability

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultRelay is a TCP relay that injects the faults of issue 11 between
// lockgate and a server: it frames client messages so that it can hold a
// chosen one (every message containing a marker waits delay before it is
// passed on, and, as a busy server would, everything behind it on its
// connection waits too); it can stall all traffic in both directions
// (a partition that loses nothing: bytes wait until it heals); and it can
// cut every connection, optionally right after a marked message was
// passed on (the write reached the server, its reply never comes back).
type faultRelay struct {
	target  string
	ln      net.Listener
	marker  []byte
	delay   time.Duration
	stalled atomic.Bool
	heal    chan struct{} // closed and replaced when a stall ends
	dropMk  atomic.Bool   // cut the connection after forwarding a marked message
	// onMarked, if set, runs when a marked message arrives, before it is
	// held: a fault that coincides with that request.
	onMarked func()
	stallGen atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newFaultRelay(t testing.TB, target string, marker string, delay time.Duration) *faultRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRelay{target: target, ln: ln, marker: []byte(marker), delay: delay, heal: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		r.Stall(false)
		r.CutAll()
		r.wg.Wait()
	})
	return r
}

// Addr is the relay's host:port.
func (r *faultRelay) Addr() string { return r.ln.Addr().String() }

// Stall stops (true) or resumes (false) all traffic.
func (r *faultRelay) Stall(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stalled.Swap(on) && !on {
		close(r.heal)
		r.heal = make(chan struct{})
	}
}

// StallFor stalls all traffic for d (extending a stall in progress).
func (r *faultRelay) StallFor(d time.Duration) {
	gen := r.stallGen.Add(1)
	r.Stall(true)
	time.AfterFunc(d, func() {
		if r.stallGen.Load() == gen {
			r.Stall(false)
		}
	})
}

// DropAfterMarked makes the relay cut a connection right after it passed
// on a marked message.
func (r *faultRelay) DropAfterMarked(on bool) { r.dropMk.Store(on) }

// CutAll closes every relayed connection.
func (r *faultRelay) CutAll() {
	r.mu.Lock()
	cs := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (r *faultRelay) waitHealed() {
	for r.stalled.Load() {
		r.mu.Lock()
		h := r.heal
		r.mu.Unlock()
		if !r.stalled.Load() {
			return
		}
		<-h
	}
}

func (r *faultRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					r.waitHealed()
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer r.wg.Done()
			defer up.Close()
			for {
				var hdr [4]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				msg := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
				if len(msg) < 4 {
					return
				}
				copy(msg, hdr[:])
				if _, err := io.ReadFull(c, msg[4:]); err != nil {
					return
				}
				marked := len(r.marker) > 0 && bytes.Contains(msg, r.marker)
				if marked {
					if r.onMarked != nil {
						r.onMarked()
					}
					time.Sleep(r.delay)
				}
				r.waitHealed()
				if _, err := up.Write(msg); err != nil {
					return
				}
				if marked && r.dropMk.Load() {
					// The write reached the server; its reply never
					// reaches lockgate. The server side stays open a
					// moment so that the server runs what it received.
					c.Close()
					time.Sleep(2 * time.Second)
					return
				}
			}
		}()
	}
}
