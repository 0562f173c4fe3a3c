package reliability

import (
	"bytes"
	"encoding/binary"
	"fmt"
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
	target string
	ln     net.Listener
	marker []byte
	delay  time.Duration
	// hold, if set, replaces delay: a marked message waits until it is
	// closed, so that a test orders the held write after an event (a
	// write through another proxy) instead of after a time a loaded
	// machine may overrun.
	hold    chan struct{}
	stalled atomic.Bool
	heal    chan struct{} // closed and replaced when a stall ends
	dropMk  atomic.Bool   // cut the connection after forwarding a marked message
	// onMarked, if set, runs when a marked message arrives, before it is
	// held: a fault that coincides with that request.
	onMarked func()
	// onForwarded, if set, runs once a marked message was written to the
	// server.
	onForwarded func()
	// onForwardedMsg, if set, gets each marked message as it was written
	// to the server (the caller may keep it).
	onForwardedMsg func(msg []byte)
	stallGen       atomic.Int64
	mu             sync.Mutex
	conns          []net.Conn
	wg             sync.WaitGroup

	connSeq atomic.Int64
	// flights are the marked messages passed on to the server and not
	// answered yet, by relayed connection and requestID; unknown counts
	// those whose connection closed first (the server may or may not
	// have run them). settled is closed and replaced when either changes.
	flightMu sync.Mutex
	flights  map[[2]int64]bool
	unknown  int
	settled  chan struct{}
	// done is closed when the relay closes: a message held for its delay
	// is dropped then, instead of keeping the test's cleanup waiting.
	done chan struct{}
}

func newFaultRelay(t testing.TB, target string, marker string, delay time.Duration) *faultRelay {
	t.Helper()
	return startFaultRelay(t, target, marker, delay, nil)
}

// newHoldingRelay is a relay whose marked messages (and what follows
// them on their connection) wait until hold is closed.
func newHoldingRelay(t testing.TB, target string, marker string, hold chan struct{}) *faultRelay {
	t.Helper()
	return startFaultRelay(t, target, marker, 0, hold)
}

func startFaultRelay(t testing.TB, target string, marker string, delay time.Duration, hold chan struct{}) *faultRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRelay{target: target, ln: ln, marker: []byte(marker), delay: delay, hold: hold, heal: make(chan struct{}),
		flights: map[[2]int64]bool{}, settled: make(chan struct{}), done: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		close(r.done)
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
		id := r.connSeq.Add(1)
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			defer r.closed(id)
			for {
				msg, err := readFrame(up)
				if err != nil {
					return
				}
				// Answered by the server: whatever the write did, it did.
				r.answered(id, int32(binary.LittleEndian.Uint32(msg[8:12])))
				r.waitHealed()
				if _, err := c.Write(msg); err != nil {
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
					// The injected fault: a server busy for delay, or
					// until hold is closed.
					var busy <-chan time.Time
					if r.hold == nil {
						busy = time.After(r.delay)
					}
					select {
					case <-busy:
					case <-r.hold:
					case <-r.done:
						return
					}
				}
				r.waitHealed()
				if marked && len(msg) >= 16 {
					r.flying(id, int32(binary.LittleEndian.Uint32(msg[4:8])))
				}
				if _, err := up.Write(msg); err != nil {
					return
				}
				if marked && r.onForwarded != nil {
					r.onForwarded()
				}
				if marked && r.onForwardedMsg != nil {
					r.onForwardedMsg(msg)
				}
				if marked && r.dropMk.Load() {
					// The write reached the server; its reply never
					// reaches lockgate. The server side stays open until
					// the server has answered it (the other pump reads
					// the reply and drops it), so that the server runs
					// what it received.
					c.Close()
					r.awaitAnswer(id, int32(binary.LittleEndian.Uint32(msg[4:8])), dropAnswerWithin)
					return
				}
			}
		}()
	}
}

// readFrame reads one wire message.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < 16 || n > 64<<20 {
		return nil, io.ErrUnexpectedEOF
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

func (r *faultRelay) settleLocked() {
	close(r.settled)
	r.settled = make(chan struct{})
}

func (r *faultRelay) flying(conn int64, requestID int32) {
	r.flightMu.Lock()
	defer r.flightMu.Unlock()
	r.flights[[2]int64{conn, int64(requestID)}] = true
}

func (r *faultRelay) answered(conn int64, responseTo int32) {
	r.flightMu.Lock()
	defer r.flightMu.Unlock()
	k := [2]int64{conn, int64(responseTo)}
	if r.flights[k] {
		delete(r.flights, k)
		r.settleLocked()
	}
}

// closed gives up on the marked messages of a connection whose server
// side is gone: nobody can tell whether the server ran them.
func (r *faultRelay) closed(conn int64) {
	r.flightMu.Lock()
	defer r.flightMu.Unlock()
	for k := range r.flights {
		if k[0] == conn {
			delete(r.flights, k)
			r.unknown++
			r.settleLocked()
		}
	}
}

// dropAnswerWithin bounds how long a dropped connection's server side
// stays open for the server to answer the marked message it received; a
// server that has not answered by then is not going to.
const dropAnswerWithin = 30 * time.Second

// awaitAnswer waits until the server has answered the marked message
// requestID of connection conn, or its connection closed, or d passed.
func (r *faultRelay) awaitAnswer(conn int64, requestID int32, d time.Duration) {
	deadline := time.After(d)
	k := [2]int64{conn, int64(requestID)}
	for {
		r.flightMu.Lock()
		pending, ch := r.flights[k], r.settled
		r.flightMu.Unlock()
		if !pending {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			return
		case <-r.done:
			return
		}
	}
}

// WaitAnswered waits until the server has answered every marked message
// the relay passed on, so that none of them can still land, and returns
// how many it can say nothing about (their connection closed first).
func (r *faultRelay) WaitAnswered(timeout time.Duration) (unknown int, err error) {
	deadline := time.After(timeout)
	for {
		r.flightMu.Lock()
		n, u, ch := len(r.flights), r.unknown, r.settled
		r.flightMu.Unlock()
		if n == 0 {
			return u, nil
		}
		select {
		case <-ch:
		case <-deadline:
			return u, fmt.Errorf("%d marked messages passed on to the server were not answered within %v", n, timeout)
		}
	}
}
