package wire

import (
	"encoding/binary"
	"strconv"
)

// OpCode identifies the kind of a wire message.
type OpCode int32

// Opcodes of the MongoDB wire protocol. The legacy ones are still parsed so
// that old clients cannot slip a write past a proxy that only knows OP_MSG.
// The constants carry the OpCode prefix because the decoded message types
// own the short names (*OpMsg is a parsed OP_MSG, OpCodeMsg its opcode).
const (
	OpCodeReply       OpCode = 1
	OpCodeUpdate      OpCode = 2001
	OpCodeInsert      OpCode = 2002
	OpCodeReserved    OpCode = 2003
	OpCodeQuery       OpCode = 2004
	OpCodeGetMore     OpCode = 2005
	OpCodeDelete      OpCode = 2006
	OpCodeKillCursors OpCode = 2007
	OpCodeCompressed  OpCode = 2012
	OpCodeMsg         OpCode = 2013
)

// String returns the protocol name, e.g. "OP_MSG"; unknown codes print as
// "OP_UNKNOWN(n)" so they stay bounded when used in logs.
func (o OpCode) String() string {
	switch o {
	case OpCodeReply:
		return "OP_REPLY"
	case OpCodeUpdate:
		return "OP_UPDATE"
	case OpCodeInsert:
		return "OP_INSERT"
	case OpCodeReserved:
		return "OP_RESERVED"
	case OpCodeQuery:
		return "OP_QUERY"
	case OpCodeGetMore:
		return "OP_GET_MORE"
	case OpCodeDelete:
		return "OP_DELETE"
	case OpCodeKillCursors:
		return "OP_KILL_CURSORS"
	case OpCodeCompressed:
		return "OP_COMPRESSED"
	case OpCodeMsg:
		return "OP_MSG"
	default:
		return "OP_UNKNOWN(" + strconv.Itoa(int(o)) + ")"
	}
}

// minBody is the smallest body a well-formed message of the opcode can have,
// so that ReadMessage refuses an impossible length before reading the body.
func (o OpCode) minBody() int {
	switch o {
	case OpCodeMsg:
		return 4 + 1 + minDocSize // flags, kind 0, empty document
	case OpCodeQuery:
		return 4 + 1 + 4 + 4 + minDocSize
	case OpCodeReply:
		return 4 + 8 + 4 + 4
	case OpCodeCompressed:
		return 4 + 4 + 1
	case OpCodeUpdate:
		return 4 + 1 + 4 + minDocSize + minDocSize
	case OpCodeInsert:
		return 4 + 1 + minDocSize
	case OpCodeDelete:
		return 4 + 1 + 4 + minDocSize
	case OpCodeGetMore:
		return 4 + 1 + 4 + 8
	case OpCodeKillCursors:
		return 4 + 4
	default:
		return 0
	}
}

// Sizes defined by the protocol and by MongoDB's defaults.
const (
	HeaderSize            = 16
	DefaultMaxMessageSize = 48_000_000       // maxMessageSizeBytes
	DefaultMaxBSONSize    = 16 * 1024 * 1024 // maxBsonObjectSize
	commandOverhead       = 16 * 1024        // MongoDB lets a command body exceed maxBsonObjectSize by this much
	minDocSize            = 5
)

// Header is the 16-byte prefix of every wire message.
type Header struct {
	MessageLength int32
	RequestID     int32
	ResponseTo    int32
	OpCode        OpCode
}

// ParseHeader decodes the first 16 bytes of b. It does not judge the length;
// ReadMessage and Parse do, because only they know the limits.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, malformed("header needs %d bytes, have %d", HeaderSize, len(b))
	}
	return Header{
		MessageLength: int32(binary.LittleEndian.Uint32(b[0:])),
		RequestID:     int32(binary.LittleEndian.Uint32(b[4:])),
		ResponseTo:    int32(binary.LittleEndian.Uint32(b[8:])),
		OpCode:        OpCode(binary.LittleEndian.Uint32(b[12:])),
	}, nil
}

// Append appends the 16 encoded bytes of h to dst.
func (h Header) Append(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.MessageLength))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.RequestID))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.ResponseTo))
	return binary.LittleEndian.AppendUint32(dst, uint32(h.OpCode))
}

// Limits bound what Parse and ReadMessage accept. Zero fields mean the
// defaults; the proxy sets them from the upstream's hello.
type Limits struct {
	MaxMessageSize int
	MaxBSONSize    int
}

func (l Limits) maxMessage() int {
	if l.MaxMessageSize <= 0 {
		return DefaultMaxMessageSize
	}
	return l.MaxMessageSize
}

// maxDocument bounds every document on the wire, whatever section or
// opcode carries it: maxBsonObjectSize plus MongoDB's 16 KiB allowance
// (BSONObjMaxInternalSize), which the server applies when it reads any
// document of a message. The 16 MiB user limit is the server's to enforce
// on what it stores; a statement document in a kind-1 section (an upsert's
// full replacement plus q) legitimately exceeds it.
func (l Limits) maxDocument() int {
	if l.MaxBSONSize <= 0 {
		return DefaultMaxBSONSize + commandOverhead
	}
	return l.MaxBSONSize + commandOverhead
}

// checkLength judges a declared message length against the opcode's minimum
// and the limit, before anything is allocated for it.
func (l Limits) checkLength(h Header) error {
	n := int(h.MessageLength)
	if n < 0 {
		return malformed("%v: declared length %d is negative", h.OpCode, n)
	}
	if n > l.maxMessage() {
		return tooLarge("%v: declared length %d exceeds the limit of %d bytes", h.OpCode, n, l.maxMessage())
	}
	if min := HeaderSize + h.OpCode.minBody(); n < min {
		return malformed("%v: declared length %d is below the minimum of %d bytes", h.OpCode, n, min)
	}
	return nil
}
