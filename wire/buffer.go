package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Size classes are powers of two from minClass to maxPooled. Larger buffers
// are allocated for one message and left to the GC: keeping them would pin
// megabytes per idle connection.
const (
	minClassShift = 9  // 512 B
	maxClassShift = 20 // 1 MiB
	numClasses    = maxClassShift - minClassShift + 1
	maxPooled     = 1 << maxClassShift
)

// BufferPool recycles message buffers by size class. A buffer handed out is
// at most twice the size asked for (its class), so a small message never
// holds a large buffer. Safe for concurrent use.
type BufferPool struct {
	classes [numClasses]sync.Pool
	// out counts the buffers handed out and not yet returned.
	out atomic.Int64
}

// NewBufferPool returns an empty pool.
func NewBufferPool() *BufferPool { return &BufferPool{} }

// pooledBuf carries its in-use state so that a buffer returned twice panics
// instead of being handed to two readers at once.
type pooledBuf struct {
	b     []byte
	class int
	inUse atomic.Bool
}

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// InUse returns how many buffers the pool has handed out that were not
// returned yet (one per message being read or held), those above its
// largest class included.
func (p *BufferPool) InUse() int64 { return p.out.Load() }

// get returns a buffer of length n; it is pooled only when n <= maxPooled.
func (p *BufferPool) get(n int) *pooledBuf {
	if p == nil {
		return &pooledBuf{b: make([]byte, n), class: -1}
	}
	p.out.Add(1)
	if n > maxPooled {
		return &pooledBuf{b: make([]byte, n), class: -1}
	}
	c := classOf(n)
	pb, _ := p.classes[c].Get().(*pooledBuf)
	if pb == nil {
		pb = &pooledBuf{b: make([]byte, 1<<(c+minClassShift)), class: c}
	}
	if !pb.inUse.CompareAndSwap(false, true) {
		panic("wire: pooled buffer handed out while in use")
	}
	pb.b = pb.b[:n]
	return pb
}

func (p *BufferPool) put(pb *pooledBuf) {
	if p == nil {
		return
	}
	if pb.class >= 0 {
		if !pb.inUse.CompareAndSwap(true, false) {
			panic("wire: buffer returned to the pool twice")
		}
		pb.b = pb.b[:cap(pb.b)]
		p.classes[pb.class].Put(pb)
	}
	p.out.Add(-1)
}

// RawMessage is one framed message as read. Bytes is the whole message,
// header included; it lives in a pooled buffer and is valid until Release.
// Anything derived from it (a parsed Message, its documents) shares that
// lifetime: copy what must outlive the message.
type RawMessage struct {
	Header Header
	Bytes  []byte

	pool     *BufferPool
	buf      *pooledBuf
	released bool
	hdr      [HeaderSize]byte
}

// Release returns the buffer to the pool. Releasing twice panics: a silent
// second release would let two connections share one buffer.
func (m *RawMessage) Release() {
	if m.released {
		panic("wire: RawMessage released twice")
	}
	m.released = true
	m.Bytes = nil
	if m.buf != nil && m.pool != nil {
		m.pool.put(m.buf)
	}
	m.buf = nil
}

// ReadMessage reads exactly one message from r. The declared length is
// checked (not negative, at least the opcode's minimum, within
// lim.MaxMessageSize) before any buffer is taken. It returns io.EOF only
// when r ends cleanly between messages and io.ErrUnexpectedEOF when a
// message is cut short. A nil pool allocates a fresh buffer per message.
func ReadMessage(r io.Reader, pool *BufferPool, lim Limits) (*RawMessage, error) {
	m := &RawMessage{pool: pool}
	if _, err := io.ReadFull(r, m.hdr[:]); err != nil {
		return nil, err // io.EOF before any byte, io.ErrUnexpectedEOF inside the header
	}
	h := Header{
		MessageLength: int32(binary.LittleEndian.Uint32(m.hdr[0:])),
		RequestID:     int32(binary.LittleEndian.Uint32(m.hdr[4:])),
		ResponseTo:    int32(binary.LittleEndian.Uint32(m.hdr[8:])),
		OpCode:        OpCode(binary.LittleEndian.Uint32(m.hdr[12:])),
	}
	if err := lim.checkLength(h); err != nil {
		return nil, err
	}
	n := int(h.MessageLength)
	if n > eagerMax {
		pb, err := readGrowing(r, pool, m.hdr[:], n)
		if err != nil {
			return nil, err
		}
		m.Header, m.Bytes, m.buf = h, pb.b, pb
		return m, nil
	}
	pb := pool.get(n)
	copy(pb.b, m.hdr[:])
	if _, err := io.ReadFull(r, pb.b[HeaderSize:]); err != nil {
		pool.put(pb)
		return nil, bodyErr(err)
	}
	m.Header, m.Bytes, m.buf = h, pb.b, pb
	return m, nil
}

// eagerMax is the largest message whose whole buffer is taken before its
// body arrives. Above it the buffer grows with the bytes that actually
// arrive, so that a client declaring a large message and trickling it (or
// sending nothing more) holds about what it sent, not what it declared:
// a thousand such clients must not cost a gigabyte.
const eagerMax = 64 << 10

// readGrowing reads a message above eagerMax into a buffer that starts at
// eagerMax and doubles as bytes arrive; the buffers come from the pool up
// to its largest class.
func readGrowing(r io.Reader, pool *BufferPool, hdr []byte, n int) (*pooledBuf, error) {
	pb := pool.get(eagerMax)
	copy(pb.b, hdr)
	have := HeaderSize
	for {
		want := min(cap(pb.b), n)
		pb.b = pb.b[:want]
		k, err := io.ReadFull(r, pb.b[have:want])
		have += k
		if err != nil {
			pool.put(pb)
			return nil, bodyErr(err)
		}
		if have == n {
			return pb, nil
		}
		nb := pool.get(min(2*cap(pb.b), n))
		copy(nb.b, pb.b[:have])
		pool.put(pb)
		pb = nb
	}
}

// bodyErr reports the end of the stream inside a message as truncation.
func bodyErr(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
