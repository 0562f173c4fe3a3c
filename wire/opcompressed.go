package wire

import (
	"encoding/binary"
	"fmt"
)

// OpCompressed is an OP_COMPRESSED message. Inner is the decompressed
// message, parsed with the same rules, so that policy always sees what the
// server will execute. Inner's Raw is a reconstructed message (header with
// the same ids and the original opcode) in its own buffer.
type OpCompressed struct {
	frame
	OriginalOpCode   OpCode
	UncompressedSize int32
	CompressorID     Compressor
	Inner            Message
}

func parseCompressed(f frame, lim Limits) (*OpCompressed, error) {
	c := f.cursor()
	m := &OpCompressed{frame: f}
	op, err := c.int32("originalOpcode")
	if err != nil {
		return nil, err
	}
	m.OriginalOpCode = OpCode(op)
	if m.UncompressedSize, err = c.int32("uncompressedSize"); err != nil {
		return nil, err
	}
	if c.left() < 1 {
		return nil, malformed("OP_COMPRESSED: compressorId truncated")
	}
	m.CompressorID = Compressor(f.raw[c.off])
	c.off++
	if m.OriginalOpCode == OpCodeCompressed {
		return nil, malformed("OP_COMPRESSED: nested compression")
	}
	max := lim.maxMessage() - HeaderSize
	if m.UncompressedSize < 0 || int(m.UncompressedSize) > max {
		return nil, tooLarge("OP_COMPRESSED: uncompressed size %d is outside [0, %d]", m.UncompressedSize, max)
	}
	if m.CompressorID > CompressorZstd {
		return nil, malformed("OP_COMPRESSED: compressor id %d is unknown", uint8(m.CompressorID))
	}
	size := int(m.UncompressedSize)
	if min := m.OriginalOpCode.minBody(); size < min {
		return nil, malformed("OP_COMPRESSED: uncompressed size %d is below the %v minimum of %d", size, m.OriginalOpCode, min)
	}
	inner, err := decompress(m.CompressorID, f.raw[c.off:], size, HeaderSize)
	if err != nil {
		return nil, malformed("OP_COMPRESSED: %v", err)
	}
	binary.LittleEndian.PutUint32(inner[0:], uint32(HeaderSize+size))
	binary.LittleEndian.PutUint32(inner[4:], uint32(f.hdr.RequestID))
	binary.LittleEndian.PutUint32(inner[8:], uint32(f.hdr.ResponseTo))
	binary.LittleEndian.PutUint32(inner[12:], uint32(m.OriginalOpCode))
	if m.Inner, err = Parse(inner[:len(inner):len(inner)], lim); err != nil {
		return nil, fmt.Errorf("%w (inside OP_COMPRESSED)", err)
	}
	return m, nil
}
