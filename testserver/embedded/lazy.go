package embedded

import (
	"errors"
	"fmt"
	"sync"
)

// Lazy is the server of a test package whose tests share one but whose
// benchmarks need none: the first caller of Server starts it, Close (the
// teardown testkit.RunMain runs) stops it if anyone did. Started in
// TestMain instead, a server ran beside every benchmark of the binary,
// and its own goroutines (the _id indexer's passes, the driver's
// monitors), which run by the clock, added 25 to 35 instructions a write
// of noise to callgrind's counts of a benchmark that never touched it
// (docs/TESTING.md, issue 25).
type Lazy struct {
	opts Options
	once sync.Once
	srv  *Server
	err  error
}

// NewLazy returns a Lazy that starts its server with opts.
func NewLazy(opts Options) *Lazy { return &Lazy{opts: opts} }

var errLazyClosed = errors.New("the embedded upstream was asked for after its teardown")

// Server starts the server on the first call and returns it; every later
// call returns the same server, or the same error if it did not start.
// Safe for concurrent use (parallel tests).
func (l *Lazy) Server() (*Server, error) {
	l.once.Do(func() {
		l.srv, l.err = Start(l.opts)
		if l.err != nil {
			l.err = fmt.Errorf("starting the embedded upstream: %w", l.err)
		}
	})
	return l.srv, l.err
}

// Close stops the server if it was started, and makes any later Server
// call fail instead of starting one that nothing would stop.
func (l *Lazy) Close() error {
	l.once.Do(func() { l.err = errLazyClosed })
	if l.srv == nil {
		return nil
	}
	return l.srv.Close()
}
