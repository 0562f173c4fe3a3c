package wire

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/lockgate/lockgate/mongoerr"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func appendInt32(dst []byte, v int32) []byte {
	return binary.LittleEndian.AppendUint32(dst, uint32(v))
}

func appendCString(dst []byte, s string) []byte {
	return append(append(dst, s...), 0)
}

// setLength writes the length of the message that starts at start.
func setLength(dst []byte, start int) []byte {
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst
}

// AppendMsg appends an OP_MSG with body as its kind-0 section followed by
// seqs as kind-1 sections. With ChecksumPresent in flags the CRC-32C is
// computed and appended.
func AppendMsg(dst []byte, requestID, responseTo int32, flags MsgFlags, body bsoncore.Document, seqs ...Sequence) []byte {
	return appendMsg(dst, requestID, responseTo, flags, body, 0, seqs)
}

// msgSize is the length of the OP_MSG that appendMsg makes of its arguments.
func msgSize(flags MsgFlags, body bsoncore.Document, seqs []Sequence) int {
	n := HeaderSize + 4 + 1 + len(body)
	for _, s := range seqs {
		n += 1 + 4 + len(s.Identifier) + 1
		for _, d := range s.Documents {
			n += len(d)
		}
	}
	if flags&ChecksumPresent != 0 {
		n += 4
	}
	return n
}

// appendMsg places the body at section position bodyIndex so that a parsed
// message re-encodes to its original bytes.
func appendMsg(dst []byte, requestID, responseTo int32, flags MsgFlags, body bsoncore.Document, bodyIndex int, seqs []Sequence) []byte {
	return appendMsgExtra(dst, requestID, responseTo, flags, body, nil, bodyIndex, seqs)
}

// appendMsgExtra is appendMsg with extra, encoded elements, added at the
// end of the body.
func appendMsgExtra(dst []byte, requestID, responseTo int32, flags MsgFlags, body bsoncore.Document, extra []byte, bodyIndex int, seqs []Sequence) []byte {
	start := len(dst)
	dst = Header{RequestID: requestID, ResponseTo: responseTo, OpCode: OpCodeMsg}.Append(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(flags))
	appendBody := func(dst []byte) []byte {
		dst = append(dst, sectionBody)
		if len(extra) == 0 || len(body) < 5 {
			return append(dst, body...)
		}
		at := len(dst)
		dst = append(dst, body[:len(body)-1]...)
		dst = append(dst, extra...)
		dst = append(dst, 0)
		binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at))
		return dst
	}
	for i := 0; i <= len(seqs); i++ {
		if i == bodyIndex {
			dst = appendBody(dst)
		}
		if i == len(seqs) {
			break
		}
		s := seqs[i]
		dst = append(dst, sectionSequence)
		at := len(dst)
		dst = appendInt32(dst, 0)
		dst = appendCString(dst, s.Identifier)
		for _, d := range s.Documents {
			dst = append(dst, d...)
		}
		binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at))
	}
	if bodyIndex > len(seqs) {
		dst = appendBody(dst)
	}
	if flags&ChecksumPresent != 0 {
		// The checksum covers the header, so the final length goes in first.
		binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start+4))
		dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
		return dst
	}
	return setLength(dst, start)
}

// AppendReply appends an OP_REPLY carrying docs.
func AppendReply(dst []byte, requestID, responseTo int32, flags int32, cursorID int64, startingFrom int32, docs ...bsoncore.Document) []byte {
	start := len(dst)
	dst = Header{RequestID: requestID, ResponseTo: responseTo, OpCode: OpCodeReply}.Append(dst)
	dst = appendInt32(dst, flags)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(cursorID))
	dst = appendInt32(dst, startingFrom)
	dst = appendInt32(dst, int32(len(docs)))
	for _, d := range docs {
		dst = append(dst, d...)
	}
	return setLength(dst, start)
}

// AppendCompressed appends msg, a whole message, wrapped in OP_COMPRESSED
// with compressor c; the ids are taken from msg's header.
func AppendCompressed(dst []byte, msg []byte, c Compressor) ([]byte, error) {
	h, err := ParseHeader(msg)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	dst = Header{RequestID: h.RequestID, ResponseTo: h.ResponseTo, OpCode: OpCodeCompressed}.Append(dst)
	dst = appendInt32(dst, int32(h.OpCode))
	dst = appendInt32(dst, int32(len(msg)-HeaderSize))
	dst = append(dst, byte(c))
	dst, err = Compress(c, msg[HeaderSize:], dst)
	if err != nil {
		return dst[:start], err
	}
	return setLength(dst, start), nil
}

// ReplyTo builds a reply to req carrying body, in req's opcode family:
// OP_MSG for OP_MSG, OP_REPLY for OP_QUERY and OP_GET_MORE, looking through
// OP_COMPRESSED. Replies are never compressed; drivers accept that. ok is
// false when req expects no reply: the fire-and-forget legacy writes,
// OP_KILL_CURSORS, an OP_MSG with moreToCome, replies and unknown opcodes.
func ReplyTo(req Message, requestID int32, body bsoncore.Document) (reply []byte, ok bool) {
	if req == nil {
		return nil, false
	}
	return replyTo(req, requestID, req.Header().RequestID, body)
}

func replyTo(req Message, requestID, responseTo int32, body bsoncore.Document) ([]byte, bool) {
	switch m := req.(type) {
	case *OpMsg:
		if m.Flags&MoreToCome != 0 {
			return nil, false
		}
		return AppendMsg(nil, requestID, responseTo, 0, body), true
	case *OpQuery, *OpGetMore:
		return AppendReply(nil, requestID, responseTo, 0, 0, 0, body), true
	case *OpCompressed:
		if m.Inner == nil {
			return nil, false
		}
		return replyTo(m.Inner, requestID, responseTo, body)
	default:
		return nil, false
	}
}

// ErrorReplyTo answers req with e in its own family: a command (OP_MSG,
// OP_QUERY on "<db>.$cmd") gets e.Document(extra...); a plain OP_QUERY or
// OP_GET_MORE gets an OP_REPLY with the QueryFailure flag and
// {$err, code, codeName, extra...}, which is how the server failed them.
// ok is false when req expects no reply.
func ErrorReplyTo(req Message, requestID int32, e *mongoerr.Error, extra ...bsoncore.Element) ([]byte, bool) {
	if req == nil {
		return nil, false
	}
	inner := req
	if c, ok := req.(*OpCompressed); ok {
		inner = c.Inner
	}
	legacyFailure := false
	switch m := inner.(type) {
	case *OpQuery:
		legacyFailure = !m.IsCommand()
	case *OpGetMore:
		legacyFailure = true
	}
	if !legacyFailure {
		return ReplyTo(req, requestID, e.Document(extra...))
	}
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "$err", e.Msg)
	doc = e.AppendCode(doc)
	for _, e := range extra {
		doc = append(doc, e...)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return AppendReply(nil, requestID, req.Header().RequestID, QueryFailure, 0, 0, doc), true
}

// WithBody re-encodes m with its command or reply document replaced,
// keeping the header ids; the length is recomputed. OP_MSG keeps its flags,
// sequences and section order (the checksum is recomputed when present);
// OP_REPLY must carry exactly one document; OP_QUERY replaces its query;
// OP_COMPRESSED rewrites its inner message and returns it uncompressed.
func WithBody(m Message, body bsoncore.Document) ([]byte, error) {
	switch m := m.(type) {
	case *OpMsg:
		return m.encode(nil, body), nil
	case *OpQuery:
		return m.encode(nil, body), nil
	case *OpReply:
		if len(m.Documents) != 1 {
			return nil, malformed("OP_REPLY: WithBody needs exactly one document, have %d", len(m.Documents))
		}
		return AppendReply(nil, m.hdr.RequestID, m.hdr.ResponseTo, m.Flags, m.CursorID, m.StartingFrom, body), nil
	case *OpCompressed:
		if m.Inner == nil {
			return nil, malformed("OP_COMPRESSED: no inner message")
		}
		return WithBody(m.Inner, body)
	case nil:
		return nil, fmt.Errorf("wire: WithBody: nil message")
	default:
		return nil, fmt.Errorf("wire: WithBody: %v carries no command or reply document", m.Header().OpCode)
	}
}

// WithBodyElements re-encodes m with elems, encoded BSON elements, added
// at the end of its body, keeping everything else as WithBody does; the
// message is built in one allocation of its final size. The caller makes
// sure that the body has none of the keys already.
func WithBodyElements(m *OpMsg, elems []byte) []byte {
	dst := make([]byte, 0, msgSize(m.Flags, m.Body, m.Sequences)+len(elems))
	return appendMsgExtra(dst, m.hdr.RequestID, m.hdr.ResponseTo, m.Flags, m.Body, elems, m.bodyIndex, m.Sequences)
}

// WithSequences re-encodes m with its body and its kind-1 sections both
// replaced, keeping the header ids, the flags and the body's position among
// the sections; the checksum is recomputed when present. It is the
// supported alternative to copying an OpMsg and editing its fields.
func WithSequences(m *OpMsg, body bsoncore.Document, seqs []Sequence) []byte {
	return appendMsg(nil, m.hdr.RequestID, m.hdr.ResponseTo, m.Flags, body, min(m.bodyIndex, len(seqs)), seqs)
}

// WithEdits re-encodes m with its body replaced, elems (encoded BSON
// elements, possibly none) added at the body's end and its kind-1 sections
// replaced, keeping the header ids, the flags and the body's position among
// the sections (the checksum is recomputed when present), in one
// allocation of the final size. The caller makes sure that the body has
// none of elems' keys already.
func WithEdits(m *OpMsg, body bsoncore.Document, elems []byte, seqs []Sequence) []byte {
	return AppendWithEdits(nil, m, body, elems, seqs)
}

// AppendWithEdits is WithEdits appending the message to dst, a buffer the
// caller reuses: grown at most once, to the final size.
func AppendWithEdits(dst []byte, m *OpMsg, body bsoncore.Document, elems []byte, seqs []Sequence) []byte {
	dst = slices.Grow(dst, msgSize(m.Flags, body, seqs)+len(elems))
	return appendMsgExtra(dst, m.hdr.RequestID, m.hdr.ResponseTo, m.Flags, body, elems, min(m.bodyIndex, len(seqs)), seqs)
}
