package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// Compressor is an OP_COMPRESSED compressor id.
type Compressor uint8

// Compressor ids as assigned by the MongoDB wire protocol.
const (
	CompressorNoop   Compressor = 0
	CompressorSnappy Compressor = 1
	CompressorZlib   Compressor = 2
	CompressorZstd   Compressor = 3
)

// String returns the name used in the handshake's "compression" array.
func (c Compressor) String() string {
	switch c {
	case CompressorNoop:
		return "noop"
	case CompressorSnappy:
		return "snappy"
	case CompressorZlib:
		return "zlib"
	case CompressorZstd:
		return "zstd"
	default:
		return "compressor(" + strconv.Itoa(int(c)) + ")"
	}
}

// Compress appends the compressed form of src to dst and returns the
// extended slice. Each call creates its own encoder: the package keeps no
// mutable state, and the proxy only compresses when a client negotiated it.
func Compress(c Compressor, src []byte, dst []byte) ([]byte, error) {
	switch c {
	case CompressorNoop:
		return append(dst, src...), nil
	case CompressorSnappy:
		n := snappy.MaxEncodedLen(len(src))
		if n < 0 {
			return dst, tooLarge("snappy: %d bytes cannot be compressed", len(src))
		}
		dst = slices.Grow(dst, n)
		enc := snappy.Encode(dst[len(dst):len(dst)+n], src)
		return dst[:len(dst)+len(enc)], nil
	case CompressorZlib:
		var b bytes.Buffer
		// BestSpeed: the proxy compresses in flight, where latency matters
		// more than the last few percent of ratio.
		w, _ := zlib.NewWriterLevel(&b, zlib.BestSpeed)
		if _, err := w.Write(src); err != nil {
			return dst, err
		}
		if err := w.Close(); err != nil {
			return dst, err
		}
		return append(dst, b.Bytes()...), nil
	case CompressorZstd:
		// A window no larger than the message and the lower-memory mode
		// keep a per-call encoder to tens of kilobytes for small messages.
		window := zstd.MinWindowSize
		for window < len(src) && window < 8<<20 {
			window <<= 1
		}
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(window),
			zstd.WithLowerEncoderMem(true), zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithSingleSegment(true))
		if err != nil {
			return dst, err
		}
		defer enc.Close()
		return enc.EncodeAll(src, dst), nil
	default:
		return dst, malformed("compressor id %d is unknown", uint8(c))
	}
}

// Decompress returns src decompressed, which must be exactly size bytes.
// The declared size is the only allocation: a payload that would expand
// beyond it is cut off at size+1 bytes and refused, so a compression bomb
// costs no more than what the header already admitted.
func Decompress(c Compressor, src []byte, size int) ([]byte, error) {
	if size < 0 {
		return nil, malformed("%v: negative uncompressed size %d", c, size)
	}
	out, err := decompress(c, src, size, 0)
	if err != nil {
		return nil, malformed("%v", err)
	}
	return out, nil
}

// Largest expansion each format can achieve, used to refuse a declared size
// that src cannot possibly produce before allocating it: a snappy copy
// emits at most 64 bytes for a 3-byte tag, deflate at most 258 bytes for
// two bits (the classic 1032:1), a zstd RLE block 128 KiB for 4 bytes.
const (
	maxSnappyRatio = 22
	maxZlibRatio   = 1032
	maxZstdRatio   = 32 << 10
)

// decompress checks that src can plausibly expand to size, then allocates
// prefix+size+1 bytes once and decompresses after the prefix.
func decompress(c Compressor, src []byte, size, prefix int) ([]byte, error) {
	ratio := 1
	switch c {
	case CompressorNoop:
	case CompressorSnappy:
		ratio = maxSnappyRatio
	case CompressorZlib:
		ratio = maxZlibRatio
	case CompressorZstd:
		ratio = maxZstdRatio
		var h zstd.Header
		if err := h.Decode(src); err == nil && h.HasFCS && h.FrameContentSize > uint64(size) {
			return nil, fmt.Errorf("zstd: frame declares %d bytes, message declares %d", h.FrameContentSize, size)
		}
	default:
		return nil, fmt.Errorf("compressor id %d is unknown", uint8(c))
	}
	if size > len(src)*ratio+64 {
		return nil, fmt.Errorf("%v: %d bytes cannot expand to the declared %d", c, len(src), size)
	}
	return decompressInto(make([]byte, prefix, prefix+size+1), c, src, size)
}

// decompressInto appends exactly size decompressed bytes to dst, whose
// spare capacity must be at least size+1. Its errors are bare reasons; the
// callers wrap them with the sentinel and their context.
func decompressInto(dst []byte, c Compressor, src []byte, size int) ([]byte, error) {
	start := len(dst)
	switch c {
	case CompressorNoop:
		if len(src) != size {
			return nil, fmt.Errorf("noop: payload is %d bytes, declared %d", len(src), size)
		}
		return append(dst, src...), nil
	case CompressorSnappy:
		n, err := snappy.DecodedLen(src)
		if err != nil {
			return nil, fmt.Errorf("snappy: %v", err)
		}
		if n != size {
			return nil, fmt.Errorf("snappy: payload decodes to %d bytes, declared %d", n, size)
		}
		out, err := snappy.DecodeStrict(dst[start:start+size], src)
		if err != nil {
			return nil, fmt.Errorf("snappy: %v", err)
		}
		// DecodeStrict wrote into dst's spare capacity: the length was checked.
		return dst[:start+len(out)], nil
	case CompressorZlib:
		br := bytes.NewReader(src)
		zr, err := zlib.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("zlib: %v", err)
		}
		defer zr.Close()
		out := dst[start : start+size]
		if _, err := io.ReadFull(zr, out); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("zlib: payload decodes to fewer than the declared %d bytes", size)
			}
			return nil, fmt.Errorf("zlib: %v", err)
		}
		// One byte more tells a longer stream from an exact one, and reading
		// to the end makes the reader verify the Adler-32 checksum.
		var probe [1]byte
		n, err := io.ReadFull(zr, probe[:])
		switch {
		case n > 0:
			return nil, fmt.Errorf("zlib: payload decodes to more than the declared %d bytes", size)
		case !errors.Is(err, io.EOF):
			return nil, fmt.Errorf("zlib: %v", err)
		case br.Len() != 0:
			return nil, fmt.Errorf("zlib: %d trailing bytes after the stream", br.Len())
		}
		return dst[:start+size], nil
	case CompressorZstd:
		// The output is bounded by dst's capacity (size+1) through
		// WithDecodeAllCapLimit. MaxMemory only bounds the window a frame
		// may declare: no honest encoder declares one above twice the
		// content, and the format's minimum window is 1 KiB. The decoder's
		// own scratch is bounded by the 128 KiB zstd block size.
		dec, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(uint64(max(2*(size+1), zstd.MinWindowSize))),
			zstd.WithDecodeAllCapLimit(true))
		if err != nil {
			return nil, fmt.Errorf("zstd: %v", err)
		}
		defer dec.Close()
		out, err := dec.DecodeAll(src, dst[start:start:start+size+1])
		if err != nil {
			return nil, fmt.Errorf("zstd: %v", err)
		}
		if len(out) != size {
			return nil, fmt.Errorf("zstd: payload decodes to %d bytes, declared %d", len(out), size)
		}
		return dst[:start+size], nil
	default:
		return nil, fmt.Errorf("compressor id %d is unknown", uint8(c))
	}
}
