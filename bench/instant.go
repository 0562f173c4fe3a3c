package bench

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Instant is an in-process MongoDB server that answers from memory, as fast
// as it can read: the upstream that leaves the proxy's own cost visible.
//
// It plays a mongos-like router (msg "isdbgrid") so that the driver builds
// the same messages whether it talks to it directly or through the proxy,
// which presents itself that way. It keeps one counter per document _id
// docID(k), k in [0, docs): "insert" sets them, "update" with
// {$inc: {n: x}} adds to them, and "find" with an _id filter returns
// {_id, n, payload}; "listCollections" lists none. Every
// other command answers {ok: 1}. The collection name is not checked: the
// server holds a single collection.
type Instant struct {
	ln      net.Listener
	counts  []atomic.Int64
	payload string
	connID  atomic.Int32

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartInstant listens on a free loopback port and serves docs documents
// whose payload field is payload.
func StartInstant(docs int, payload string) (*Instant, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Instant{ln: ln, counts: make([]atomic.Int64, docs), payload: payload, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the server's host:port.
func (s *Instant) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for their
// goroutines.
func (s *Instant) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Instant) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Instant) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	id := s.connID.Add(1)
	r := bufio.NewReaderSize(c, 4<<10)
	pool := wire.NewBufferPool()
	var out, body []byte
	var reqID int32
	for {
		raw, err := wire.ReadMessage(r, pool, wire.Limits{})
		if err != nil {
			return
		}
		msg, err := wire.Parse(raw.Bytes, wire.Limits{})
		if err != nil {
			raw.Release()
			return
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil || cmd == nil {
			raw.Release()
			return // the benchmark's clients send nothing else
		}
		body = s.answer(body[:0], cmd, id)
		reqID++
		out, err = appendReply(out[:0], msg, reqID, body)
		raw.Release()
		if err != nil {
			return
		}
		if out == nil {
			continue // moreToCome: no reply
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// appendReply frames body as the reply to req: OP_MSG for OP_MSG, OP_REPLY
// for OP_QUERY. It returns nil for a request that expects no reply.
func appendReply(dst []byte, req wire.Message, requestID int32, body []byte) ([]byte, error) {
	responseTo := req.Header().RequestID
	switch m := req.(type) {
	case *wire.OpMsg:
		if m.Flags&wire.MoreToCome != 0 {
			return nil, nil
		}
		return wire.AppendMsg(dst, requestID, responseTo, 0, body), nil
	case *wire.OpQuery:
		return wire.AppendReply(dst, requestID, responseTo, 0, 0, 0, body), nil
	}
	return nil, errors.New("instant upstream: unexpected opcode")
}

// answer appends the reply body to cmd.
func (s *Instant) answer(dst []byte, cmd *wire.Command, connID int32) []byte {
	idx, dst := bsoncore.AppendDocumentStart(dst)
	switch cmd.Name {
	case "hello", "isMaster", "ismaster":
		dst = bsoncore.AppendBooleanElement(dst, "helloOk", true)
		dst = bsoncore.AppendBooleanElement(dst, "ismaster", true)
		dst = bsoncore.AppendStringElement(dst, "msg", "isdbgrid")
		dst = bsoncore.AppendInt32Element(dst, "maxBsonObjectSize", 16<<20)
		dst = bsoncore.AppendInt32Element(dst, "maxMessageSizeBytes", 48000000)
		dst = bsoncore.AppendInt32Element(dst, "maxWriteBatchSize", 100000)
		dst = bsoncore.AppendDateTimeElement(dst, "localTime", time.Now().UnixMilli())
		dst = bsoncore.AppendInt32Element(dst, "logicalSessionTimeoutMinutes", 30)
		dst = bsoncore.AppendInt32Element(dst, "connectionId", connID)
		dst = bsoncore.AppendInt32Element(dst, "minWireVersion", 0)
		dst = bsoncore.AppendInt32Element(dst, "maxWireVersion", 17)
		dst = bsoncore.AppendBooleanElement(dst, "readOnly", false)
	case "find":
		dst = s.find(dst, cmd)
	case "update":
		dst = s.update(dst, cmd)
	case "insert":
		dst = s.insert(dst, cmd)
	case "listCollections":
		// No collection has options: the default collation is the simple
		// one, which lockgate's guard asks before it trusts a string _id
		// pin.
		cidx, d := bsoncore.AppendDocumentElementStart(dst, "cursor")
		aidx, d := bsoncore.AppendArrayElementStart(d, "firstBatch")
		d, _ = bsoncore.AppendArrayEnd(d, aidx)
		d = bsoncore.AppendInt64Element(d, "id", 0)
		d = bsoncore.AppendStringElement(d, "ns", cmd.DB+".$cmd.listCollections")
		dst, _ = bsoncore.AppendDocumentEnd(d, cidx)
	}
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

// slot returns the counter index for an _id value, docID(k) for k in
// [0, docs), or -1.
func (s *Instant) slot(v bsoncore.Value) int {
	id, ok := v.StringValueOK()
	if !ok || !strings.HasPrefix(id, idPrefix) {
		return -1
	}
	k, err := strconv.Atoi(id[len(idPrefix):])
	if err != nil || k < 0 || k >= len(s.counts) {
		return -1
	}
	return k
}

func (s *Instant) find(dst []byte, cmd *wire.Command) []byte {
	cidx, dst := bsoncore.AppendDocumentElementStart(dst, "cursor")
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "firstBatch")
	if v, err := cmd.Body.LookupErr("filter", "_id"); err == nil {
		if i := s.slot(v); i >= 0 {
			didx, d := bsoncore.AppendDocumentElementStart(dst, "0")
			d = bsoncore.AppendValueElement(d, "_id", v)
			d = bsoncore.AppendInt64Element(d, "n", s.counts[i].Load())
			d = bsoncore.AppendStringElement(d, "payload", s.payload)
			dst, _ = bsoncore.AppendDocumentEnd(d, didx)
		}
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	dst = bsoncore.AppendInt64Element(dst, "id", 0)
	dst = bsoncore.AppendStringElement(dst, "ns", cmd.DB+"."+cmd.Collection)
	dst, _ = bsoncore.AppendDocumentEnd(dst, cidx)
	return dst
}

func (s *Instant) update(dst []byte, cmd *wire.Command) []byte {
	stmts, _ := cmd.Documents("updates")
	var n int32
	for _, st := range stmts {
		id, err := st.LookupErr("q", "_id")
		if err != nil {
			continue
		}
		i := s.slot(id)
		if i < 0 {
			continue
		}
		inc, err := st.LookupErr("u", "$inc", "n")
		if err != nil {
			continue
		}
		by, ok := inc.AsInt64OK()
		if !ok {
			continue
		}
		s.counts[i].Add(by)
		n++
	}
	dst = bsoncore.AppendInt32Element(dst, "n", n)
	dst = bsoncore.AppendInt32Element(dst, "nModified", n)
	return dst
}

func (s *Instant) insert(dst []byte, cmd *wire.Command) []byte {
	docs, _ := cmd.Documents("documents")
	var n int32
	for _, d := range docs {
		id, err := d.LookupErr("_id")
		if err != nil {
			continue
		}
		i := s.slot(id)
		if i < 0 {
			continue
		}
		v, _ := d.Lookup("n").AsInt64OK()
		s.counts[i].Store(v)
		n++
	}
	return bsoncore.AppendInt32Element(dst, "n", n)
}
