package wire

// Message is a decoded view over the raw bytes of one wire message. Its
// documents are bsoncore views into those bytes, not copies: they are valid
// exactly as long as the raw bytes are. The set of implementations is closed
// (OpMsg, OpQuery, OpReply, OpCompressed, OpUpdate, OpInsert, OpDelete,
// OpGetMore, OpKillCursors, OpUnknown) so a type switch over it is complete.
type Message interface {
	Header() Header
	// Raw is the message exactly as received, header included; forward it
	// unchanged when nothing is rewritten.
	Raw() []byte
	message()
}

// frame is embedded by every message type to carry its header and bytes.
type frame struct {
	hdr Header
	raw []byte
}

func (f *frame) Header() Header { return f.hdr }
func (f *frame) Raw() []byte    { return f.raw }
func (f *frame) message()       {}

// OpUnknown is any opcode the codec does not decode (OP_RESERVED included).
// It is not an error: the caller decides whether to pass it through.
type OpUnknown struct {
	frame
}

// Parse decodes one whole message, header included, without copying it. The
// header's length must equal len(raw); every byte must be accounted for.
// Failures wrap ErrMalformed or ErrTooLarge with the precise reason.
func Parse(raw []byte, lim Limits) (Message, error) {
	h, err := ParseHeader(raw)
	if err != nil {
		return nil, err
	}
	if err := lim.checkLength(h); err != nil {
		return nil, err
	}
	if int(h.MessageLength) != len(raw) {
		return nil, malformed("%v: header declares %d bytes, message has %d", h.OpCode, h.MessageLength, len(raw))
	}
	f := frame{hdr: h, raw: raw}
	switch h.OpCode {
	case OpCodeMsg:
		return checked(parseMsg(f, lim))
	case OpCodeQuery:
		return checked(parseQuery(f, lim))
	case OpCodeReply:
		return checked(parseReply(f, lim))
	case OpCodeCompressed:
		return checked(parseCompressed(f, lim))
	case OpCodeUpdate:
		return checked(parseUpdate(f, lim))
	case OpCodeInsert:
		return checked(parseInsert(f, lim))
	case OpCodeDelete:
		return checked(parseDelete(f, lim))
	case OpCodeGetMore:
		return checked(parseGetMore(f))
	case OpCodeKillCursors:
		return checked(parseKillCursors(f))
	default:
		return &OpUnknown{frame: f}, nil
	}
}

func (f frame) cursor() cursor {
	return cursor{b: f.raw, off: HeaderSize, end: len(f.raw), op: f.hdr.OpCode}
}

// checked keeps a typed nil pointer out of the Message interface when a
// decoder fails, so that callers can test the message against nil.
func checked[T Message](m T, err error) (Message, error) {
	if err != nil {
		return nil, err
	}
	return m, nil
}
