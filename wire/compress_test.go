package wire

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

var compressors = []Compressor{CompressorNoop, CompressorSnappy, CompressorZlib, CompressorZstd}

func TestCompressRoundTrip(t *testing.T) {
	for _, c := range compressors {
		for _, src := range [][]byte{{}, []byte("x"), bytes.Repeat([]byte("lockgate "), 5000)} {
			enc, err := Compress(c, src, []byte("prefix"))
			if err != nil {
				t.Fatalf("%v: %v", c, err)
			}
			if string(enc[:6]) != "prefix" {
				t.Fatalf("%v: Compress did not append to dst", c)
			}
			dec, err := Decompress(c, enc[6:], len(src))
			if err != nil || !bytes.Equal(dec, src) {
				t.Fatalf("%v: round trip of %d bytes: %v", c, len(src), err)
			}
			if cap(dec) > len(src)+1 {
				t.Errorf("%v: result capacity %d for %d bytes", c, cap(dec), len(src))
			}
		}
	}
	if _, err := Compress(9, nil, nil); err == nil {
		t.Error("unknown compressor accepted")
	}
	if got := Compressor(9).String(); got != "compressor(9)" {
		t.Errorf("String = %q", got)
	}
	if CompressorZstd.String() != "zstd" || CompressorSnappy.String() != "snappy" || CompressorZlib.String() != "zlib" || CompressorNoop.String() != "noop" {
		t.Error("compressor names")
	}
}

// TestDecompressBombs: a tiny payload that expands far beyond its declared
// size must be refused without inflating it.
func TestDecompressBombs(t *testing.T) {
	huge := make([]byte, 8<<20)
	for _, c := range []Compressor{CompressorSnappy, CompressorZlib, CompressorZstd} {
		enc, err := Compress(c, huge, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{0, 100, len(huge) - 1} {
			_, err := Decompress(c, enc, size)
			wantErr(t, err, ErrMalformed, c.String())
		}
		// Declared larger than the content: short.
		_, err = Decompress(c, enc, len(huge)+1)
		wantErr(t, err, ErrMalformed, c.String())
	}
	// The zstd frame without a content size cannot make the decoder
	// allocate past the declared size either.
	w, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false))
	var buf bytes.Buffer
	w.Reset(&buf)
	w.Write(huge)
	w.Close()
	bombs := map[string][]byte{"zstd stream": buf.Bytes()}
	// A small window so that only the cap on the output stops it.
	w, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false), zstd.WithWindowSize(zstd.MinWindowSize))
	var small bytes.Buffer
	w.Reset(&small)
	w.Write(huge)
	w.Close()
	bombs["zstd small window"] = small.Bytes()
	for _, c := range []Compressor{CompressorSnappy, CompressorZlib, CompressorZstd} {
		enc, _ := Compress(c, huge, nil)
		bombs[c.String()] = enc
	}
	for name, bomb := range bombs {
		c := CompressorZstd
		switch name {
		case "snappy":
			c = CompressorSnappy
		case "zlib":
			c = CompressorZlib
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Decompress(c, bomb, 1000)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("%s bomb accepted", name)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("%s bomb of %d bytes allocated %d bytes while refusing a declared size of 1000", name, len(huge), n)
		} else {
			t.Logf("%s bomb: %d bytes allocated", name, n)
		}
	}
	// snappy: the declared length in the block header is checked first.
	lie := snappy.Encode(nil, []byte("hello"))
	lie[0] = 4
	_, err := Decompress(CompressorSnappy, lie, 5)
	wantErr(t, err, ErrMalformed, "decodes to 4 bytes, declared 5")
	_, err = Decompress(CompressorNoop, []byte("abc"), 4)
	wantErr(t, err, ErrMalformed, "noop")
	_, err = Decompress(CompressorZlib, []byte("not zlib"), 4)
	wantErr(t, err, ErrMalformed, "zlib")
	_, err = Decompress(CompressorZstd, []byte("not zstd"), 4)
	wantErr(t, err, ErrMalformed, "zstd")
	_, err = Decompress(CompressorSnappy, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 4)
	wantErr(t, err, ErrMalformed, "snappy")
	_, err = Decompress(7, []byte("x"), 1)
	wantErr(t, err, ErrMalformed, "compressor id 7 is unknown")
	_, err = Decompress(CompressorNoop, nil, -1)
	wantErr(t, err, ErrMalformed, "negative")
	// zlib with bytes after the stream.
	z, _ := Compress(CompressorZlib, []byte("abc"), nil)
	_, err = Decompress(CompressorZlib, append(z, 1, 2), 3)
	wantErr(t, err, ErrMalformed, "trailing")
	// zlib with a corrupted checksum.
	z[len(z)-1] ^= 1
	_, err = Decompress(CompressorZlib, z, 3)
	wantErr(t, err, ErrMalformed, "zlib")
}

func compressedFrame(op OpCode, size int32, c Compressor, payload []byte) []byte {
	return frameOf(OpCodeCompressed, i32(int32(op)), i32(size), []byte{byte(c)}, payload)
}

func TestParseCompressed(t *testing.T) {
	body := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "items").AppendString("$db", "app")
	})
	plain := AppendMsg(nil, 41, 0, 0, body, Sequence{Identifier: "updates", Documents: []bsoncore.Document{body}})
	for _, c := range compressors {
		raw, err := AppendCompressed(nil, plain, c)
		if err != nil {
			t.Fatal(err)
		}
		m := mustParse(t, raw).(*OpCompressed)
		if m.OriginalOpCode != OpCodeMsg || m.UncompressedSize != int32(len(plain)-HeaderSize) || m.CompressorID != c {
			t.Errorf("%v: %+v", c, m)
		}
		if !bytes.Equal(m.Inner.Raw(), plain) || m.Header().RequestID != 41 {
			t.Errorf("%v: inner message differs", c)
		}
		cmd, err := CommandOf(m)
		if err != nil || !cmd.Compressed || cmd.Name != "update" || cmd.DB != "app" {
			t.Errorf("%v: command %+v, %v", c, cmd, err)
		}
		// WithBody returns the inner message uncompressed, same ids.
		nb, err := WithBody(m, body)
		if err != nil || !bytes.Equal(nb, plain) {
			t.Errorf("%v: WithBody: %v", c, err)
		}
	}

	snap, _ := Compress(CompressorSnappy, plain[HeaderSize:], nil)
	nested, _ := AppendCompressed(nil, plain, CompressorNoop)
	badInner := bytes.Clone(plain)
	badInner[HeaderSize] = 0x08 // unknown required flag bit 3
	tests := []struct {
		name     string
		raw      []byte
		sentinel error
		reason   string
	}{
		{"nested compression", compressedFrame(OpCodeCompressed, int32(len(nested)-HeaderSize), CompressorNoop, nested[HeaderSize:]), ErrMalformed, "nested compression"},
		{"negative size", compressedFrame(OpCodeMsg, -1, CompressorSnappy, snap), ErrTooLarge, "uncompressed size -1"},
		{"size over limit", compressedFrame(OpCodeMsg, DefaultMaxMessageSize-HeaderSize+1, CompressorSnappy, snap), ErrTooLarge, "outside"},
		{"size mismatch", compressedFrame(OpCodeMsg, int32(len(plain)-HeaderSize+1), CompressorSnappy, snap), ErrMalformed, "snappy: payload decodes to"},
		{"size smaller than content", compressedFrame(OpCodeMsg, int32(len(plain)-HeaderSize-1), CompressorNoop, plain[HeaderSize:]), ErrMalformed, "noop"},
		{"unknown compressor", compressedFrame(OpCodeMsg, int32(len(plain)-HeaderSize), 4, plain[HeaderSize:]), ErrMalformed, "compressor id 4 is unknown"},
		{"size below opcode minimum", compressedFrame(OpCodeMsg, 3, CompressorNoop, []byte{0, 0, 0}), ErrMalformed, "below the OP_MSG minimum"},
		{"truncated compressor id", frameOf(OpCodeCompressed, i32(int32(OpCodeMsg)), i32(10)), ErrMalformed, "below the minimum"},
		{"zlib claim beyond any ratio", compressedFrame(OpCodeMsg, 40_000_000, CompressorZlib, make([]byte, 30)), ErrMalformed, "30 bytes cannot expand to the declared 40000000"},
		{"snappy claim beyond any ratio", compressedFrame(OpCodeMsg, 40_000, CompressorSnappy, snap), ErrMalformed, "cannot expand"},
		{"zstd frame size disagrees", compressedFrame(OpCodeMsg, int32(len(plain)-HeaderSize-1), CompressorZstd, zstdOf(plain[HeaderSize:])), ErrMalformed, "zstd: frame declares"},
		{"inner message malformed", compressedFrame(OpCodeMsg, int32(len(badInner)-HeaderSize), CompressorNoop, badInner[HeaderSize:]), ErrMalformed, "unknown required flag bits 0x0008 (inside OP_COMPRESSED)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(tt.raw, Limits{})
			wantErr(t, err, tt.sentinel, tt.reason)
			if m != nil {
				t.Fatal("message returned with an error")
			}
		})
	}
	// The size limit follows Limits.
	raw, _ := AppendCompressed(nil, plain, CompressorZstd)
	_, err := Parse(raw, Limits{MaxMessageSize: len(plain) - 1})
	wantErr(t, err, ErrTooLarge, "uncompressed size")
	// A compressed legacy query parses too.
	q := frameOf(OpCodeQuery, i32(0), cstr("admin.$cmd"), i32(0), i32(-1), doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("isMaster", 1) }))
	binary.LittleEndian.PutUint32(q[4:], 99)
	raw, _ = AppendCompressed(nil, q, CompressorZlib)
	cmd, err := CommandOf(mustParse(t, raw))
	if err != nil || cmd.Name != "isMaster" || !cmd.Legacy || !cmd.Compressed {
		t.Errorf("compressed OP_QUERY: %+v, %v", cmd, err)
	}
}

// TestDecompressZstdStreams: frames without a content size, as streaming
// encoders write them, decode when their window fits the message.
func TestDecompressZstdStreams(t *testing.T) {
	src := bytes.Repeat([]byte("0123456789abcdef"), 4000)
	for _, window := range []int{zstd.MinWindowSize, 64 << 10} {
		w, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false), zstd.WithWindowSize(window))
		var buf bytes.Buffer
		w.Reset(&buf)
		w.Write(src)
		w.Close()
		got, err := Decompress(CompressorZstd, buf.Bytes(), len(src))
		if err != nil || !bytes.Equal(got, src) {
			t.Errorf("window %d: %v", window, err)
		}
		_, err = Decompress(CompressorZstd, buf.Bytes(), len(src)-1)
		wantErr(t, err, ErrMalformed, "zstd")
	}
}

func zstdOf(b []byte) []byte {
	out, err := Compress(CompressorZstd, b, nil)
	if err != nil {
		panic(err)
	}
	return out
}

// TestCompressedClaimCostsNothing: a small OP_COMPRESSED that claims a
// large uncompressed size is refused before the size is allocated.
func TestCompressedClaimCostsNothing(t *testing.T) {
	for _, c := range []Compressor{CompressorNoop, CompressorSnappy, CompressorZlib, CompressorZstd} {
		raw := compressedFrame(OpCodeMsg, 40_000_000, c, make([]byte, 100))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Parse(raw, Limits{})
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("%v: accepted", c)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("%v: %d bytes allocated to refuse a 40 MB claim", c, n)
		}
	}
}
