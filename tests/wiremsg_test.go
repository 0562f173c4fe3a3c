package tests

// A deliberately small, independent reading of the wire protocol, used as a
// test oracle and to play misbehaving clients. It shares no code with the
// wire package under test.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

const (
	opReply = 1
	opQuery = 2004
	opMsg   = 2013
)

// message is one framed wire message.
type message struct {
	RequestID, ResponseTo, OpCode int32
	Body                          []byte // everything after the 16-byte header
}

func readMessage(r io.Reader) (message, error) {
	var h [16]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return message{}, err
	}
	n := int32(binary.LittleEndian.Uint32(h[0:]))
	if n < 16 || n > 48_000_000 {
		return message{}, fmt.Errorf("message length %d out of range", n)
	}
	m := message{
		RequestID:  int32(binary.LittleEndian.Uint32(h[4:])),
		ResponseTo: int32(binary.LittleEndian.Uint32(h[8:])),
		OpCode:     int32(binary.LittleEndian.Uint32(h[12:])),
		Body:       make([]byte, n-16),
	}
	_, err := io.ReadFull(r, m.Body)
	return m, err
}

func frame(requestID, responseTo, opCode int32, body []byte) []byte {
	b := make([]byte, 16, 16+len(body))
	binary.LittleEndian.PutUint32(b[0:], uint32(16+len(body)))
	binary.LittleEndian.PutUint32(b[4:], uint32(requestID))
	binary.LittleEndian.PutUint32(b[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(b[12:], uint32(opCode))
	return append(b, body...)
}

// opMsgBytes is an OP_MSG with flags 0 and one kind-0 section.
func opMsgBytes(requestID int32, doc bsoncore.Document) []byte {
	body := []byte{0, 0, 0, 0, 0}
	return frame(requestID, 0, opMsg, append(body, doc...))
}

// opQueryBytes is an OP_QUERY on ns returning at most one document.
func opQueryBytes(requestID int32, ns string, doc bsoncore.Document) []byte {
	body := []byte{0, 0, 0, 0}
	body = append(body, ns...)
	body = append(body, 0)
	body = binary.LittleEndian.AppendUint32(body, 0)
	body = binary.LittleEndian.AppendUint32(body, uint32(0xFFFFFFFF)) // numberToReturn -1
	return frame(requestID, 0, opQuery, append(body, doc...))
}

// msgBody returns the kind-0 section of an OP_MSG.
func msgBody(m message) (bsoncore.Document, error) {
	if m.OpCode != opMsg {
		return nil, fmt.Errorf("opcode %d, want OP_MSG", m.OpCode)
	}
	b := m.Body[4:]
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		if len(b) < 4 {
			return nil, fmt.Errorf("truncated section")
		}
		n := int(binary.LittleEndian.Uint32(b))
		if n > len(b) {
			return nil, fmt.Errorf("section length %d beyond message", n)
		}
		if kind == 0 {
			return bsoncore.Document(b[:n]), nil
		}
		b = b[n:]
	}
	return nil, fmt.Errorf("no kind-0 section")
}

// msgSequences returns the kind-1 sections of an OP_MSG: for each
// identifier, the number of documents it carries.
func msgSequences(m message) (map[string]int, error) {
	if m.OpCode != opMsg {
		return nil, fmt.Errorf("opcode %d, want OP_MSG", m.OpCode)
	}
	out := map[string]int{}
	b := m.Body[4:]
	if binary.LittleEndian.Uint32(m.Body)&1 != 0 { // checksumPresent
		b = b[:len(b)-4]
	}
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		if len(b) < 4 {
			return nil, fmt.Errorf("truncated section")
		}
		n := int(binary.LittleEndian.Uint32(b))
		if n < 4 || n > len(b) {
			return nil, fmt.Errorf("section length %d out of range", n)
		}
		if kind == 1 {
			seq := b[4:n]
			i := 0
			for i < len(seq) && seq[i] != 0 {
				i++
			}
			if i == len(seq) {
				return nil, fmt.Errorf("unterminated sequence identifier")
			}
			id, docs := string(seq[:i]), seq[i+1:]
			for len(docs) > 0 {
				d, rest, ok := bsoncore.ReadDocument(docs)
				if !ok || len(d) == 0 {
					return nil, fmt.Errorf("malformed document in sequence %q", id)
				}
				out[id]++
				docs = rest
			}
		}
		b = b[n:]
	}
	return out, nil
}

// replyDoc returns the first document of an OP_REPLY.
func replyDoc(m message) (bsoncore.Document, error) {
	if m.OpCode != opReply {
		return nil, fmt.Errorf("opcode %d, want OP_REPLY", m.OpCode)
	}
	if len(m.Body) < 20+5 {
		return nil, fmt.Errorf("OP_REPLY of %d bytes has no document", len(m.Body))
	}
	d, _, ok := bsoncore.ReadDocument(m.Body[20:])
	if !ok {
		return nil, fmt.Errorf("OP_REPLY document is malformed")
	}
	return d, nil
}

// recorder is a TCP relay between the proxy and the upstream that keeps a
// copy of every message the proxy sent upstream.
type recorder struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup
	mu       sync.Mutex
	sent     []message
	conns    []net.Conn
}

// startRecorder relays to upstreamAddr and stops when the test ends.
func startRecorder(t testing.TB, upstreamAddr string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, upstream: upstreamAddr}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *recorder) URI() string { return "mongodb://" + r.ln.Addr().String() + "/" }

func (r *recorder) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.upstream)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, u)
		r.mu.Unlock()
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			defer u.Close()
			for {
				m, err := readMessage(c)
				if err != nil {
					return
				}
				r.mu.Lock()
				r.sent = append(r.sent, m)
				r.mu.Unlock()
				if _, err := u.Write(frame(m.RequestID, m.ResponseTo, m.OpCode, m.Body)); err != nil {
					return
				}
			}
		}()
		go func() {
			defer r.wg.Done()
			defer c.Close()
			io.Copy(c, u)
		}()
	}
}

func (r *recorder) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// messages returns a copy of the messages recorded so far.
func (r *recorder) messages() []message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]message(nil), r.sent...)
}

// commands returns the OP_MSG bodies recorded so far whose command name is
// name.
func (r *recorder) commands(name string) []bsoncore.Document {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []bsoncore.Document
	for _, m := range r.sent {
		if m.OpCode != opMsg {
			continue
		}
		d, err := msgBody(m)
		if err != nil {
			continue
		}
		if e, err := d.IndexErr(0); err == nil && e.Key() == name {
			out = append(out, d)
		}
	}
	return out
}
