package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"sync"
	"testing"
	"testing/iotest"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// countingReader fails the test if more than limit bytes are read.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReadMessage(t *testing.T) {
	pool := NewBufferPool()
	a := AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin"))
	b := AppendReply(nil, 2, 1, 0, 0, 0, cmdDoc("ok", "", "x"))
	stream := append(bytes.Clone(a), b...)
	r := iotest.OneByteReader(bytes.NewReader(stream))
	for i, want := range [][]byte{a, b} {
		m, err := ReadMessage(r, pool, Limits{})
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(m.Bytes, want) || int(m.Header.MessageLength) != len(want) {
			t.Fatalf("message %d differs", i)
		}
		m.Release()
		if m.Bytes != nil {
			t.Error("Bytes kept after Release")
		}
	}
	if _, err := ReadMessage(r, pool, Limits{}); err != io.EOF {
		t.Fatalf("clean close: %v, want io.EOF", err)
	}
	// nil pool works.
	m, err := ReadMessage(bytes.NewReader(a), nil, Limits{})
	if err != nil || !bytes.Equal(m.Bytes, a) {
		t.Fatalf("nil pool: %v", err)
	}
	m.Release()
}

func TestReadMessageErrors(t *testing.T) {
	good := AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin"))
	withLen := func(n int32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b, uint32(n))
		return b
	}
	withOp := func(n int32, op OpCode) []byte {
		b := withLen(n)
		binary.LittleEndian.PutUint32(b[12:], uint32(op))
		return b
	}
	readErr := errors.New("connection reset")
	tests := []struct {
		name     string
		r        io.Reader
		lim      Limits
		sentinel error
		reason   string
	}{
		{"truncated header", bytes.NewReader(good[:10]), Limits{}, io.ErrUnexpectedEOF, ""},
		{"truncated body", bytes.NewReader(good[:len(good)-1]), Limits{}, io.ErrUnexpectedEOF, ""},
		{"negative length", bytes.NewReader(withLen(-1)), Limits{}, ErrMalformed, "negative"},
		{"zero length", bytes.NewReader(withLen(0)), Limits{}, ErrMalformed, "below the minimum"},
		{"below header", bytes.NewReader(withLen(15)), Limits{}, ErrMalformed, "below the minimum of 26"},
		{"below OP_MSG minimum", bytes.NewReader(withLen(25)), Limits{}, ErrMalformed, "below the minimum of 26"},
		{"below OP_REPLY minimum", bytes.NewReader(withOp(35, OpCodeReply)), Limits{}, ErrMalformed, "below the minimum of 36"},
		{"over default limit", bytes.NewReader(withLen(DefaultMaxMessageSize + 1)), Limits{}, ErrTooLarge, "exceeds the limit of 48000000"},
		{"over configured limit", bytes.NewReader(good), Limits{MaxMessageSize: len(good) - 1}, ErrTooLarge, "exceeds"},
		{"reader error", iotest.ErrReader(readErr), Limits{}, readErr, ""},
		{"reader error in body", io.MultiReader(bytes.NewReader(good[:20]), iotest.ErrReader(readErr)), Limits{}, readErr, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cr := &countingReader{r: tt.r}
			m, err := ReadMessage(cr, NewBufferPool(), tt.lim)
			if m != nil {
				t.Fatal("message returned with an error")
			}
			if tt.reason == "" {
				if !errors.Is(err, tt.sentinel) {
					t.Fatalf("got %v, want %v", err, tt.sentinel)
				}
				return
			}
			wantErr(t, err, tt.sentinel, tt.reason)
			// A refused length is refused after the header, before the body.
			if cr.n != HeaderSize {
				t.Errorf("read %d bytes before refusing", cr.n)
			}
		})
	}
}

// TestReadMessageAllocatesNothingClaimed: a header claiming 48 MB followed
// by a trickle must cost memory in proportion to what arrived.
func TestReadMessageAllocatesNothingClaimed(t *testing.T) {
	hdr := Header{MessageLength: DefaultMaxMessageSize, OpCode: OpCodeMsg}.Append(nil)
	stream := append(hdr, make([]byte, 3<<20)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadMessage(bytes.NewReader(stream), NewBufferPool(), Limits{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatal(err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("allocated %d bytes for a message cut after 3 MiB", n)
	}
	// A large message that does arrive whole is read exactly.
	big := AppendMsg(nil, 1, 0, 0, doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("insert", "c").AppendString("$db", "d").AppendBinary("pad", 0, make([]byte, 5<<20))
	}))
	m, err := ReadMessage(iotest.HalfReader(bytes.NewReader(big)), NewBufferPool(), Limits{})
	if err != nil || !bytes.Equal(m.Bytes, big) {
		t.Fatalf("large message: %v", err)
	}
	if cap(m.Bytes) > len(big)*2 {
		t.Errorf("capacity %d for %d bytes", cap(m.Bytes), len(big))
	}
	m.Release()
}

func TestBufferPoolClasses(t *testing.T) {
	p := NewBufferPool()
	for _, n := range []int{0, 1, 16, 511, 512, 513, 4096, 5000, 1 << 20} {
		pb := p.get(n)
		if len(pb.b) != n {
			t.Errorf("get(%d): len %d", n, len(pb.b))
		}
		class := 512
		for class < n {
			class *= 2
		}
		if cap(pb.b) != class {
			t.Errorf("get(%d): capacity %d, want class %d", n, cap(pb.b), class)
		}
		p.put(pb)
	}
	big := p.get(1<<20 + 1)
	if big.class != -1 || cap(big.b) != 1<<20+1 {
		t.Errorf("buffers above 1 MiB must not be pooled: class %d cap %d", big.class, cap(big.b))
	}
	p.put(big) // no-op
}

// TestBufferPoolInUse: InUse counts every buffer a reader holds, through a
// message that grows, one above the largest class and one cut short, and
// only those (a test of the proxy waits on it to know that its readers
// hold their buffers).
func TestBufferPoolInUse(t *testing.T) {
	pool := NewBufferPool()
	small := AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin"))
	big := AppendMsg(nil, 2, 0, 0, doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("insert", "c").AppendString("$db", "d").AppendBinary("pad", 0, make([]byte, 3<<20))
	}))
	var held []*RawMessage
	for i, msg := range [][]byte{small, big} {
		m, err := ReadMessage(iotest.HalfReader(bytes.NewReader(msg)), pool, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
		if n := pool.InUse(); n != int64(i+1) {
			t.Fatalf("%d messages held: InUse %d", i+1, n)
		}
	}
	cut := Header{MessageLength: DefaultMaxMessageSize, OpCode: OpCodeMsg}.Append(nil)
	if _, err := ReadMessage(bytes.NewReader(append(cut, make([]byte, 1<<20)...)), pool, Limits{}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatal(err)
	}
	if n := pool.InUse(); n != 2 {
		t.Fatalf("after a message cut short: InUse %d, want 2", n)
	}
	for _, m := range held {
		m.Release()
	}
	if n := pool.InUse(); n != 0 {
		t.Fatalf("all released: InUse %d", n)
	}
}

func TestDoubleReleasePanics(t *testing.T) {
	pool := NewBufferPool()
	m, err := ReadMessage(bytes.NewReader(AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin"))), pool, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	buf := m.buf
	m.Release()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("second Release did not panic")
			}
		}()
		m.Release()
	}()
	// The buffer itself refuses a second return even through another path.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("returning a free buffer did not panic")
			}
		}()
		pool.put(buf)
	}()
}

func TestBufferPoolConcurrent(t *testing.T) {
	pool := NewBufferPool()
	msgs := [][]byte{
		AppendMsg(nil, 1, 0, 0, cmdDoc("ping", "", "admin")),
		AppendMsg(nil, 2, 0, 0, cmdDoc("find", string(bytes.Repeat([]byte("x"), 3000)), "admin")),
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				want := msgs[(g+i)%2]
				m, err := ReadMessage(bytes.NewReader(want), pool, Limits{})
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(m.Bytes, want) {
					t.Error("buffer shared between readers")
				}
				m.Release()
			}
		}()
	}
	wg.Wait()
}
