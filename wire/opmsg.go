package wire

import (
	"encoding/binary"
	"hash/crc32"
	"slices"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// MsgFlags are the OP_MSG flag bits.
type MsgFlags uint32

// Known OP_MSG flags. Bits 0-15 are "required": a receiver that does not
// know one must refuse the message, as the server does.
const (
	ChecksumPresent MsgFlags = 1 << 0
	MoreToCome      MsgFlags = 1 << 1
	ExhaustAllowed  MsgFlags = 1 << 16

	requiredBits = 0xFFFF
	knownBits    = ChecksumPresent | MoreToCome
)

const (
	sectionBody     = 0
	sectionSequence = 1
)

// castagnoli is the CRC-32C table of the OP_MSG checksum; built once, never
// written after.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sequence is a kind-1 section: documents sent beside the body under a
// field name (e.g. "documents", "updates").
type Sequence struct {
	Identifier string
	Documents  []bsoncore.Document
}

// OpMsg is an OP_MSG message. Flags are kept as received, including the
// optional bits 16-31 this codec does not interpret, so that a rewrite
// preserves them.
type OpMsg struct {
	frame
	Flags     MsgFlags
	Body      bsoncore.Document
	Sequences []Sequence
	Checksum  uint32 // valid only when Flags has ChecksumPresent

	bodyIndex int // position of the kind-0 section among the sections, to re-encode in order

	// Inline room for the common case, one sequence of a few documents, so
	// that parsing it costs a single allocation.
	seqBuf [1]Sequence
	docBuf [4]bsoncore.Document
}

func parseMsg(f frame, lim Limits) (*OpMsg, error) {
	c := f.cursor()
	flags, err := c.int32("flag bits")
	if err != nil {
		return nil, err
	}
	m := &OpMsg{frame: f, Flags: MsgFlags(flags)}
	if unknown := m.Flags & requiredBits &^ knownBits; unknown != 0 {
		return nil, malformed("OP_MSG: unknown required flag bits 0x%04x", uint32(unknown))
	}
	if m.Flags&ChecksumPresent != 0 {
		if c.left() < 4+1+minDocSize {
			return nil, malformed("OP_MSG: checksum flag set but %d bytes left for sections and checksum", c.left())
		}
		c.end -= 4
		m.Checksum = binary.LittleEndian.Uint32(f.raw[c.end:])
		if sum := crc32.Checksum(f.raw[:c.end], castagnoli); sum != m.Checksum {
			return nil, malformed("OP_MSG: checksum 0x%08x does not match the computed 0x%08x", m.Checksum, sum)
		}
	}
	maxBody := lim.maxDocument()
	sections := 0
	for c.left() > 0 {
		at := c.off
		kind := f.raw[c.off]
		c.off++
		switch kind {
		case sectionBody:
			if m.Body != nil {
				return nil, malformed("OP_MSG: second kind-0 section at offset %d", at)
			}
			if m.Body, err = c.document("body", maxBody); err != nil {
				return nil, err
			}
			m.bodyIndex = sections
		case sectionSequence:
			var docs []bsoncore.Document
			if len(m.Sequences) == 0 {
				m.Sequences, docs = m.seqBuf[:0], m.docBuf[:0]
			}
			seq, err := parseSequence(&c, at, lim.maxDocument(), docs)
			if err != nil {
				return nil, err
			}
			for _, s := range m.Sequences {
				if s.Identifier == seq.Identifier {
					return nil, malformed("OP_MSG: duplicate document sequence %q at offset %d", seq.Identifier, at)
				}
			}
			m.Sequences = append(m.Sequences, seq)
		default:
			return nil, malformed("OP_MSG: section kind %d at offset %d is unknown", kind, at)
		}
		sections++
	}
	if m.Body == nil {
		return nil, malformed("OP_MSG: no kind-0 section")
	}
	return m, nil
}

// parseSequence reads a kind-1 section whose size field is at c.off; the
// size covers itself, the identifier and the documents.
func parseSequence(c *cursor, at, maxDoc int, docs []bsoncore.Document) (Sequence, error) {
	start := c.off
	size, err := c.int32("document sequence size")
	if err != nil {
		return Sequence{}, err
	}
	if size < 4+2 || int(size) > c.end-start {
		return Sequence{}, malformed("OP_MSG: kind-1 section at offset %d declares %d bytes, %d available", at, size, c.end-start)
	}
	outer := c.end
	c.end = start + int(size)
	defer func() { c.end = outer }()
	id, err := c.identifier()
	if err != nil {
		return Sequence{}, err
	}
	if id == "" {
		return Sequence{}, malformed("OP_MSG: kind-1 section at offset %d has an empty identifier", at)
	}
	seq := Sequence{Identifier: id, Documents: docs}
	for c.left() > 0 {
		d, err := c.document("kind-1 section document", maxDoc)
		if err != nil {
			return Sequence{}, err
		}
		seq.Documents = append(seq.Documents, d)
	}
	return seq, nil
}

// encode appends m re-encoded with body as its kind-0 section, keeping the
// header ids, the flags, the sequences and the section order; the checksum
// is recomputed when present.
func (m *OpMsg) encode(dst []byte, body bsoncore.Document) []byte {
	// Sized once: a rewrite on the enforced write path is one allocation.
	dst = slices.Grow(dst, msgSize(m.Flags, body, m.Sequences))
	return appendMsg(dst, m.hdr.RequestID, m.hdr.ResponseTo, m.Flags, body, m.bodyIndex, m.Sequences)
}

// PeekMsgFlags returns the flags of an OP_MSG from its raw bytes without
// parsing it, for the reply path that only needs moreToCome; false when raw
// is not an OP_MSG long enough to carry flags.
func PeekMsgFlags(raw []byte) (MsgFlags, bool) {
	if len(raw) < HeaderSize+4 || OpCode(binary.LittleEndian.Uint32(raw[12:])) != OpCodeMsg {
		return 0, false
	}
	return MsgFlags(binary.LittleEndian.Uint32(raw[HeaderSize:])), true
}
