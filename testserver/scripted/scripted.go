// Package scripted is a MongoDB server whose answers a test writes. It
// plays the server's side of protocol situations the embedded FerretDB
// cannot produce (replica-set handshakes, elections, compression, exhaust,
// slow replies); it is never a stand-in for what FerretDB can do.
package scripted

import (
	"bufio"
	"net"
	"sync"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Handler answers one request. It returns the reply messages to write, each
// a complete wire message; none for a request that expects no reply. The
// request's bytes are only valid during the call.
type Handler func(s *Server, req wire.Message, cmd *wire.Command) [][]byte

// Server is a scripted MongoDB server on a loopback port.
type Server struct {
	ln      net.Listener
	handler Handler
	// perConn, when set, makes a handler for each connection, for servers
	// whose answers depend on the connection (who authenticated on it).
	perConn func() Handler

	mu       sync.Mutex
	requests [][]byte
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	nextID   int32
}

// Start listens on 127.0.0.1 and serves every connection with h.
func Start(h Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, handler: h, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// StartPerConn is Start with a handler made for each connection.
func StartPerConn(newHandler func() Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, perConn: newHandler, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Requests returns copies of every request received so far, in order.
func (s *Server) Requests() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.requests...)
}

// CloseConnections drops every open connection, as a crashed server would.
func (s *Server) CloseConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.CloseConnections()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	h := s.handler
	if s.perConn != nil {
		h = s.perConn()
	}
	r := bufio.NewReader(c)
	pool := wire.NewBufferPool()
	for {
		raw, err := wire.ReadMessage(r, pool, wire.Limits{})
		if err != nil {
			return
		}
		s.mu.Lock()
		s.requests = append(s.requests, append([]byte(nil), raw.Bytes...))
		s.mu.Unlock()
		msg, err := wire.Parse(raw.Bytes, wire.Limits{})
		if err != nil {
			raw.Release()
			return
		}
		cmd, _ := wire.CommandOf(msg)
		replies := h(s, msg, cmd)
		raw.Release()
		for _, b := range replies {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
}

// NextID returns a fresh requestID for a reply.
func (s *Server) NextID() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	return s.nextID
}

// Reply frames body as the reply to req in req's opcode family.
func (s *Server) Reply(req wire.Message, body bsoncore.Document) [][]byte {
	b, ok := wire.ReplyTo(req, s.NextID(), body)
	if !ok {
		return nil
	}
	return [][]byte{b}
}
