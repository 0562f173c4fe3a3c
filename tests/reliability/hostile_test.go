package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/wire"
)

// outcome is what a raw connection saw after sending hostile bytes.
type outcome struct {
	replies []bsoncore.Document // bodies of the replies read before the end
	closed  bool                // the proxy closed the connection
	err     error               // how the connection ended
}

// sendHostile dials addr, writes b (whole, or as far as the proxy reads
// it), and reads replies until the connection closes or nothing comes for
// quiet. The local address is returned to find the connection's log lines.
func sendHostile(t *testing.T, addr string, b []byte, quiet time.Duration) (outcome, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	local := c.LocalAddr().String()
	// The proxy may close the connection before it has read everything; a
	// failed write is part of the outcome, not a test failure.
	go c.Write(b)
	r := bufio.NewReader(c)
	var out outcome
	for {
		c.SetReadDeadline(time.Now().Add(quiet))
		raw, err := wire.ReadMessage(r, nil, wire.Limits{})
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				out.err = err
				return out, local
			}
			out.closed, out.err = true, err
			return out, local
		}
		m, err := wire.Parse(raw.Bytes, wire.Limits{})
		if err != nil {
			t.Fatalf("lockgate sent a reply that does not parse: %v", err)
		}
		switch m := m.(type) {
		case *wire.OpMsg:
			out.replies = append(out.replies, m.Body)
		case *wire.OpReply:
			if len(m.Documents) > 0 {
				out.replies = append(out.replies, m.Documents[0])
			}
		default:
			t.Fatalf("unexpected reply opcode %v", m.Header().OpCode)
		}
	}
}

func isOKReply(d bsoncore.Document) bool {
	v, err := d.LookupErr("ok")
	if err != nil {
		return false
	}
	switch v.Type {
	case bson.TypeDouble:
		return v.Double() == 1
	case bson.TypeInt32:
		return v.Int32() == 1
	case bson.TypeInt64:
		return v.Int64() == 1
	case bson.TypeBoolean:
		return v.Boolean()
	}
	return false
}

// compressedFrame builds an OP_COMPRESSED by hand: any declared size, any
// compressor id, any payload.
func compressedFrame(id int32, original wire.OpCode, declared int32, comp wire.Compressor, payload []byte) []byte {
	b := wire.Header{RequestID: id, OpCode: wire.OpCodeCompressed}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, uint32(original))
	b = binary.LittleEndian.AppendUint32(b, uint32(declared))
	b = append(b, byte(comp))
	b = append(b, payload...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// zstdStream compresses src as a streamed zstd frame, which carries no
// content size: the decoder learns the size only by decoding.
func zstdStream(t *testing.T, src []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(src); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zlibBytes(t *testing.T, src []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, _ := zlib.NewWriterLevel(&buf, zlib.BestCompression)
	w.Write(src)
	w.Close()
	return buf.Bytes()
}

// pingMsg is a well-formed OP_MSG ping.
func pingMsg(t *testing.T, id int32, flags wire.MsgFlags) []byte {
	return wire.AppendMsg(nil, id, 0, flags, mustDoc(t, bson.D{{"ping", 1}, {"$db", "admin"}}))
}

// bigMsg is an OP_MSG whose body is a document of about n bytes of zeros
// (a string): highly compressible.
func bigMsg(t *testing.T, n int) []byte {
	return wire.AppendMsg(nil, 9, 0, 0, mustDoc(t, bson.D{{"insert", "bomb"}, {"pad", string(make([]byte, n))}, {"$db", relDB}}))
}

// TestHostileInput is item 4 of issue 5, beyond what proxy/proxy_test.go
// covers: compression bombs (declaring a small size, declaring a size over
// the limit, and a 32000:1 one declaring its true size), nested
// OP_COMPRESSED, an unknown compressor, a bad OP_MSG checksum, an unknown
// opcode followed by garbage, invalid BSON inside a valid frame (unknown
// element type, string running past its document), messages longer or
// shorter than they declare, trailing garbage after a good message and a
// header cut short. Each must close only its own connection (or get an
// error reply, never an ok reply), with a logged reason and a count in
// lockgate_errors_total; nothing of it may reach the upstream; the proxy
// stays up, and a healthy driver client running concurrently sees no
// error and keeps making progress throughout.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	ns := relDB + "." + uniq("hostile")
	g := startGateway(t, gatewayConfig(upstream.URI(), uniq("locks"), ns))
	ctx := testCtx(t, 2*time.Minute)

	// The healthy neighbour.
	healthy := connect(t, g.URI, "healthy")
	hcoll := healthy.Database(relDB).Collection(uniq("healthy"))
	var hOps atomic.Int64
	var hErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := hcoll.InsertOne(opCtx, bson.D{{"_id", i}})
			if err == nil {
				err = hcoll.FindOne(opCtx, bson.D{{"_id", i}}).Err()
			}
			cancel()
			if err != nil {
				hErr.Store(fmt.Sprintf("op %d: %v", i, err))
				return
			}
			hOps.Add(1)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})

	zeros := make([]byte, 4<<20)
	okPing := pingMsg(t, 21, 0)

	badChecksum := pingMsg(t, 22, wire.ChecksumPresent)
	badChecksum[len(badChecksum)-1] ^= 0xFF

	nestedInner, err := wire.AppendCompressed(nil, pingMsg(t, 23, 0), wire.CompressorZstd)
	if err != nil {
		t.Fatal(err)
	}
	nested, err := wire.AppendCompressed(nil, nestedInner, wire.CompressorZlib)
	if err != nil {
		t.Fatal(err)
	}

	unknownOp := wire.Header{MessageLength: wire.HeaderSize + 32, RequestID: 24, OpCode: wire.OpCode(4242)}.Append(nil)
	unknownOp = append(unknownOp, bytes.Repeat([]byte{0xA5}, 32)...)
	unknownOp = append(unknownOp, bytes.Repeat([]byte{0x5A, 0xFF, 0x00, 0x13}, 16)...) // garbage after it

	badType := pingMsg(t, 25, 0)
	// body starts after header (16), flags (4), kind (1), length (4): the
	// first element's type byte.
	badType[wire.HeaderSize+4+1+4] = 0x99

	overrun := wire.AppendMsg(nil, 26, 0, 0, mustDoc(t, bson.D{{"ping", 1}, {"s", "abcdef"}, {"$db", "admin"}}))
	// The string "abcdef" has length 7 (with its NUL); claim 4000.
	if i := bytes.Index(overrun, []byte("abcdef")); i > 4 {
		binary.LittleEndian.PutUint32(overrun[i-4:], 4000)
	} else {
		t.Fatal("string not found")
	}

	shortDeclared := pingMsg(t, 27, 0)
	binary.LittleEndian.PutUint32(shortDeclared, uint32(len(shortDeclared)-8)) // declares 8 bytes fewer than it has

	trailing := append(pingMsg(t, 28, 0), bytes.Repeat([]byte{0xEE}, 40)...)

	longDeclared := pingMsg(t, 29, 0)
	binary.LittleEndian.PutUint32(longDeclared, uint32(len(longDeclared)+64)) // then 64 more bytes of garbage
	longDeclared = append(longDeclared, bytes.Repeat([]byte{0x01}, 64)...)

	cases := []struct {
		name     string
		in       []byte
		okFirst  bool // the first reply may be ok (a good message precedes the garbage)
		wantKind []string
	}{
		{"zstd bomb (frame size) declaring 200 bytes", compressedFrame(30, wire.OpCodeMsg, 200, wire.CompressorZstd, mustCompress(t, wire.CompressorZstd, zeros)), false, []string{"malformed"}},
		{"zstd bomb (streamed, no frame size) declaring 200 bytes", compressedFrame(31, wire.OpCodeMsg, 200, wire.CompressorZstd, zstdStream(t, zeros)), false, []string{"malformed"}},
		{"zlib bomb declaring 200 bytes", compressedFrame(32, wire.OpCodeMsg, 200, wire.CompressorZlib, zlibBytes(t, zeros)), false, []string{"malformed"}},
		{"zstd declaring 64 MB, over the limit", compressedFrame(33, wire.OpCodeMsg, 64<<20, wire.CompressorZstd, mustCompress(t, wire.CompressorZstd, zeros)), false, []string{"too_large", "malformed"}},
		{"zlib declaring -1 bytes", compressedFrame(34, wire.OpCodeMsg, -1, wire.CompressorZlib, zlibBytes(t, zeros)), false, []string{"too_large", "malformed"}},
		{"nested OP_COMPRESSED", nested, false, []string{"malformed"}},
		{"unknown compressor id 9", compressedFrame(35, wire.OpCodeMsg, int32(len(okPing)-wire.HeaderSize), wire.Compressor(9), okPing[wire.HeaderSize:]), false, []string{"malformed"}},
		{"bad OP_MSG checksum", badChecksum, false, []string{"malformed"}},
		{"unknown opcode followed by garbage", unknownOp, false, nil},
		{"invalid BSON: unknown element type", badType, false, []string{"malformed"}},
		{"invalid BSON: string runs past its document", overrun, false, []string{"malformed"}},
		{"message longer than it declares", shortDeclared, false, []string{"malformed"}},
		{"declared length covers trailing garbage", longDeclared, false, []string{"malformed"}},
		{"good message then trailing garbage", trailing, true, []string{"malformed"}},
		{"header cut short, then hang-up", okPing[:10], false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := g.errorsByKind(t)
			opsBefore := hOps.Load()
			in := tc.in
			if tc.name == "header cut short, then hang-up" {
				out := hangUpAfter(t, g.Addr, in)
				_ = out
			} else {
				out, local := sendHostile(t, g.Addr, in, 5*time.Second)
				for i, r := range out.replies {
					if isOKReply(r) && !(tc.okFirst && i == 0) {
						t.Fatalf("hostile input got an ok reply: %v", r)
					}
				}
				if !out.closed && len(out.replies) == 0 {
					t.Fatalf("connection neither closed nor answered within 5s (%v)", out.err)
				}
				if tc.okFirst {
					// The good message was forwarded before the garbage
					// behind it was read; its reply may be relayed or be
					// dropped when the garbage closes the connection (it
					// raced here). Either way the connection must close.
					t.Logf("reply to the good message before the close: %v", len(out.replies) == 1)
					if !out.closed {
						t.Fatalf("garbage after a good message did not close the connection")
					}
				}
				if out.closed {
					testkit.Eventually(t, 5*time.Second, "a log line giving the reason the connection was closed", func() bool {
						return closeReasonLogged(g, local) != ""
					})
					t.Logf("closed; logged: %s", closeReasonLogged(g, local))
				} else {
					t.Logf("error reply: %v", out.replies)
				}
			}
			var after map[string]float64
			testkit.Eventually(t, 5*time.Second, "lockgate_errors_total to count the hostile connection", func() bool {
				after = g.errorsByKind(t)
				return total(after) > total(before)
			})
			var kinds []string
			for k, v := range after {
				if v > before[k] {
					kinds = append(kinds, k)
				}
			}
			t.Logf("counted as %v", kinds)
			if tc.wantKind != nil && !anyIn(kinds, tc.wantKind) {
				t.Errorf("counted as %v, want one of %v", kinds, tc.wantKind)
			}
			testkit.Eventually(t, 20*time.Second, "the healthy client to keep making progress", func() bool {
				return hOps.Load() > opsBefore || hErr.Load() != nil
			})
			if e := hErr.Load(); e != nil {
				t.Fatalf("the healthy client failed: %v", e)
			}
		})
	}

	// The 32000:1 bomb that declares its true size is legal up to the
	// limit: measure what one such message costs the proxy, and check that
	// the result (a body over maxBsonObjectSize) is refused.
	t.Run("zstd bomb declaring its true size", func(t *testing.T) {
		plain := bigMsg(t, 20<<20)
		packed, err := wire.AppendCompressed(nil, plain, wire.CompressorZstd)
		if err != nil {
			t.Fatal(err)
		}
		before := g.errorsByKind(t)
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		out, local := sendHostile(t, g.Addr, packed, 5*time.Second)
		runtime.ReadMemStats(&ms1)
		for _, r := range out.replies {
			if isOKReply(r) {
				t.Fatalf("a %d-byte body was accepted", len(plain))
			}
		}
		if !out.closed && len(out.replies) == 0 {
			t.Fatalf("neither closed nor answered")
		}
		testkit.Eventually(t, 5*time.Second, "lockgate_errors_total to count it", func() bool { return total(g.errorsByKind(t)) > total(before) })
		t.Logf("%d compressed bytes declaring %d: closed=%v, reason %q; the process allocated %.1f MiB meanwhile (amplification %.0f:1)",
			len(packed), len(plain)-wire.HeaderSize, out.closed, closeReasonLogged(g, local),
			float64(ms1.TotalAlloc-ms0.TotalAlloc)/(1<<20), float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(len(packed)))
	})

	close(stop)
	wg.Wait()
	if e := hErr.Load(); e != nil {
		t.Fatalf("the healthy client failed: %v", e)
	}
	// Still up: a fresh connection works.
	out, _ := sendHostile(t, g.Addr, okPing, 5*time.Second)
	if len(out.replies) != 1 || !isOKReply(out.replies[0]) {
		t.Fatalf("a fresh connection after the hostile input: %+v", out)
	}
	t.Logf("healthy client: %d insert+find rounds during the hostile input, no error", hOps.Load())
	// Nothing hostile reached the upstream as a write.
	if n, err := healthy.Database(relDB).Collection("bomb").CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("the bomb collection has %d documents (%v)", n, err)
	}
}

// hangUpAfter writes b and closes the write side at once.
func hangUpAfter(t *testing.T, addr string, b []byte) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(b)
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(c)
	return err
}

func mustCompress(t *testing.T, c wire.Compressor, src []byte) []byte {
	t.Helper()
	b, err := wire.Compress(c, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// closeReasonLogged returns the message of the gateway's log line that
// closed the connection from local, "" if there is none yet.
func closeReasonLogged(g *gw, local string) string {
	for _, e := range g.Logs.All() {
		if e.ContextMap()["client"] != local {
			continue
		}
		if containsAny(e.Message, "closing client connection", "closing") {
			reason := e.Message
			if err, ok := e.ContextMap()["error"]; ok {
				reason += ": " + fmt.Sprint(err)
			}
			if r, ok := e.ContextMap()["reason"]; ok {
				reason += ": " + fmt.Sprint(r)
			}
			return reason
		}
	}
	return ""
}

func total(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

func anyIn(have, want []string) bool {
	for _, h := range have {
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}

// TestUnknownOpcodeIsRefused: a message in an opcode lockgate does not
// decode (OP_RESERVED 2003, or an invented 4242) cannot be classified, so
// on a proxy with an enforced namespace it must not be forwarded: the
// connection is closed (or answered with an error) with a logged reason
// counted in lockgate_errors_total. The upstream is a scripted server here
// because it records exactly what reaches it.
//
// The same opcodes wrapped in OP_COMPRESSED (and OP_COMMAND, 2010, which
// old drivers sent) must meet the same rule: the server executes the inner
// message, so the proxy judges it (issue 12: they used to pass wrapped).
func TestUnknownOpcodeIsRefused(t *testing.T) {
	t.Parallel()
	type tc struct {
		op         wire.OpCode
		compressed bool
	}
	var cases []tc
	for _, op := range []wire.OpCode{wire.OpCodeReserved, wire.OpCode(4242), wire.OpCode(2010)} {
		cases = append(cases, tc{op, false}, tc{op, true})
	}
	for _, c := range cases {
		op := c.op
		name := op.String()
		if c.compressed {
			name += " in OP_COMPRESSED"
		}
		t.Run(name, func(t *testing.T) {
			up, _ := slowUpstream(t, 0)
			ns := relDB + "." + uniq("unknown_op")
			g := startGateway(t, gatewayConfig("mongodb://"+up.Addr()+"/?directConnection=true", uniq("locks"), ns))
			msg := wire.Header{MessageLength: wire.HeaderSize + 32, RequestID: 77, OpCode: op}.Append(nil)
			msg = append(msg, bytes.Repeat([]byte{0xA5}, 32)...)
			if c.compressed {
				var err error
				if msg, err = wire.AppendCompressed(nil, msg, wire.CompressorNoop); err != nil {
					t.Fatal(err)
				}
			}
			before := total(g.errorsByKind(t))
			out, local := sendHostile(t, g.Addr, msg, 2*time.Second)
			forwarded := false
			for _, r := range up.Requests() {
				if h, err := wire.ParseHeader(r); err == nil && (h.OpCode == op || h.OpCode == wire.OpCodeCompressed) {
					forwarded = true
				}
			}
			after := total(g.errorsByKind(t))
			t.Logf("%v: forwarded to the upstream: %v; closed: %v; replies: %d; logged: %q; lockgate_errors_total +%v",
				op, forwarded, out.closed, len(out.replies), closeReasonLogged(g, local), after-before)
			if forwarded {
				t.Errorf("%v, which lockgate cannot classify, was forwarded to the upstream unexamined on a proxy enforcing %s "+
					"(policy.Classify treats unknown opcodes as carrying no write)", op, ns)
			}
			if !out.closed && len(out.replies) == 0 {
				t.Errorf("%v: the connection was neither closed nor answered within 2s", op)
			}
			if after <= before {
				t.Errorf("%v: not counted in lockgate_errors_total", op)
			}
		})
	}
}
