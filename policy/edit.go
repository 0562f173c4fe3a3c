package policy

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Edit is every change the proxy makes to a command it forwards: pinned
// statements, fenced statements and the maxTimeMS cap. EditMessage applies
// them all in one pass and encodes the message once, so that the edits
// cannot disagree on what the message is and a write pays one copy.
type Edit struct {
	Pins   []Pin
	Fences []Fence
	// MaxTimeMS, when positive, caps the command's maxTimeMS: it is set
	// unless the command already carries a positive value no greater.
	MaxTimeMS int64
	// Buf, when set, is room of the caller's that an edited OP_MSG is
	// encoded into (from Buf[:0]; grown if it is too small). The result
	// then shares it: the caller must not reuse Buf while it reads the
	// result.
	Buf []byte
}

// EditMessage returns msg with e applied, or nil when e changes nothing
// (forward the original bytes), and the limit the command runs under when
// e caps it (0 otherwise).
//
// Pins restrict a statement's filter to its verified ids: {$and: [{_id:
// {$in: ids}}, <filter>]}, the filter's own top-level fields kept in place
// (pinnedFilter), or {_id: {$in: ids}} for an empty filter (an absent
// findAndModify query is added as such). Fences are applied as Fence
// describes. Everything else keeps its meaning: the header ids, the OP_MSG
// flags (a checksum is recomputed), every other field and statement in
// order, document sequences stay sequences, an OP_QUERY keeps its $query
// wrapper and other fields. OP_COMPRESSED yields the edited inner message,
// uncompressed.
//
// Which statements a command has, and which of their fields are the
// filter and the update, is read from the command table
// (wire.CommandSpec.Statement and Ops): update, delete, findAndModify
// (List "", Index 0), insert (fences only) and bulkWrite ops (the update
// and delete ops pinned, every kind fenced), over OP_MSG and OP_QUERY
// "<db>.$cmd". Legacy OP_UPDATE and OP_DELETE, collection writes, a pin or
// fence that names no statement or one statement twice, a pinned value that
// is a regex or an array (in $in they would match by pattern or by element,
// widening the statement), and a statement whose filter is not a single
// document are errors: the engine then refuses the write. Pinning an empty
// IDs list is allowed: the statement then matches nothing.
//
// Note for upserts: a pinned upsert that no longer matches inserts a
// document whose _id the server copies from a one-element $in; the engine
// should only pin an upsert whose UpsertID it has checked, or pin more than
// one id, or refuse it.
//
// The result may exceed the size limits the message was read under; the
// caller checks it against the upstream's limits before sending it.
func EditMessage(msg wire.Message, cmd *wire.Command, e Edit) ([]byte, time.Duration, error) {
	b, maxTime, _, err := EditMessageAt(msg, cmd, e)
	return b, maxTime, err
}

// EditMessageAt is EditMessage telling also, when e caps the command,
// where the value of its maxTimeMS lies in the bytes to send (the result,
// or msg's own bytes when the result is nil), so that the sender can
// lower it in place at the last moment (wire.NumberAt.Set) instead of the
// cap counting from before the message was even built. The value is then
// e.MaxTimeMS, or the command's own if it is positive and no greater. So
// that it can always be lowered in place, an OP_COMPRESSED message is
// returned uncompressed (a copy of its inner message) when it carries a
// value of its own that is kept.
func EditMessageAt(msg wire.Message, cmd *wire.Command, e Edit) ([]byte, time.Duration, wire.NumberAt, error) {
	return e.MessageAt(msg, cmd)
}

// MessageAt is EditMessageAt(msg, cmd, *e), for a caller that holds its
// edit already: an Edit (ten words) passed by value was copied twice on
// every enforced write's way in.
func (e *Edit) MessageAt(msg wire.Message, cmd *wire.Command) ([]byte, time.Duration, wire.NumberAt, error) {
	// The usual enforced write's only edit: the cap, to an OP_MSG that
	// carries none, appended (what editMessage does, without its other
	// cases' checks).
	if len(e.Pins) == 0 && len(e.Fences) == 0 && e.MaxTimeMS > 0 && cmd != nil {
		if om, ok := msg.(*wire.OpMsg); ok {
			if _, has := cmd.Kept(wire.KeyMaxTimeMS); !has {
				if b, at, ok := appendCap(e.Buf[:0], om, cmd.Body, e.MaxTimeMS, cmd.Sequences); ok {
					return b, time.Duration(e.MaxTimeMS) * time.Millisecond, wire.NumberAt{Off: at, Type: bson.TypeInt64}, nil
				}
			}
		}
	}
	b, maxTime, at, err := editMessage(msg, cmd, *e)
	if err != nil || e.MaxTimeMS <= 0 || at.Located() {
		return b, maxTime, at, err
	}
	if b != nil {
		if at, ok := wire.LocateCommandNumber(b, "maxTimeMS"); ok {
			return b, maxTime, at, nil
		}
		return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: EditMessage: the capped message's maxTimeMS cannot be found")
	}
	raw := msg.Raw()
	if c, ok := msg.(*wire.OpCompressed); ok {
		// Its bytes are compressed: the inner message is sent instead.
		raw = append(e.Buf[:0], c.Inner.Raw()...)
		b = raw
	}
	if at, ok := wire.LocateCommandNumber(raw, "maxTimeMS"); ok {
		return b, maxTime, at, nil
	}
	return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: EditMessage: the command's own maxTimeMS cannot be found")
}

// editMessage is EditMessageAt, locating the cap only where it knows its
// place without a search (appendCap).
func editMessage(msg wire.Message, cmd *wire.Command, e Edit) ([]byte, time.Duration, wire.NumberAt, error) {
	if len(e.Pins) == 0 && len(e.Fences) == 0 && e.MaxTimeMS <= 0 {
		return nil, 0, wire.NumberAt{}, nil
	}
	const op = "EditMessage"
	if c, ok := msg.(*wire.OpCompressed); ok {
		if c.Inner == nil {
			return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: OP_COMPRESSED without an inner message", op)
		}
		msg = c.Inner
	}
	switch msg.(type) {
	case *wire.OpMsg, *wire.OpQuery:
	default:
		verb := "capped"
		switch {
		case len(e.Fences) > 0:
			verb = "fenced"
		case len(e.Pins) > 0:
			verb = "pinned"
		}
		return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: %v statements cannot be %s", op, msg.Header().OpCode, verb)
	}
	if cmd == nil {
		c, err := wire.CommandOf(msg)
		if err != nil {
			return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: %w", op, err)
		}
		if c == nil {
			return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: not a command", op)
		}
		cmd = c
	}
	for _, p := range e.Pins {
		for _, id := range p.IDs {
			// In $in a regex matches by pattern and an array by element:
			// either would widen the statement instead of pinning it.
			if !docid.ValidType(id.Type) {
				return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: statement %q[%d]: a %v cannot be a pinned _id", op, p.List, p.Index, id.Type)
			}
		}
	}
	body, seqs := cmd.Body, cmd.Sequences
	edited := false
	if len(e.Pins) > 0 || len(e.Fences) > 0 {
		var err error
		if body, seqs, err = editStatements(cmd, e.Pins, e.Fences); err != nil {
			return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: %s: %w", op, cmd.Name, err)
		}
		edited = true
	}
	// The cap reads the body as it will be sent; no statement edit touches
	// maxTimeMS.
	var appendMS bool // the cap is a new field at the body's end
	var maxTime time.Duration
	if e.MaxTimeMS > 0 {
		// Unedited, the body is the command's, whose walk kept the value.
		var v bsoncore.Value
		var err error
		if edited {
			v, err = body.LookupErr("maxTimeMS")
		} else if cv, ok := cmd.Kept(wire.KeyMaxTimeMS); ok {
			v = cv
		} else {
			err = bsoncore.ErrElementNotFound
		}
		var cur int64
		ok := false
		if err == nil {
			cur, ok = wholeMS(v)
		}
		switch {
		case err == nil && ok && cur > 0 && cur <= e.MaxTimeMS:
			maxTime = time.Duration(cur) * time.Millisecond
		case err != nil:
			// The usual case, no maxTimeMS yet: the field is appended
			// while the message is encoded, one copy of its final size.
			appendMS = true
			maxTime = time.Duration(e.MaxTimeMS) * time.Millisecond
		default:
			if body, err = replaceField(body, "maxTimeMS", bsoncore.Value{Type: bson.TypeInt64, Data: bsoncore.AppendInt64(nil, e.MaxTimeMS)}, true); err != nil {
				return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: maxTimeMS: %w", op, err)
			}
			edited = true
			maxTime = time.Duration(e.MaxTimeMS) * time.Millisecond
		}
	}
	if !edited && !appendMS {
		return nil, maxTime, wire.NumberAt{}, nil
	}
	if !edited && appendMS {
		if om, ok := msg.(*wire.OpMsg); ok {
			if b, at, ok := appendCap(e.Buf[:0], om, body, e.MaxTimeMS, seqs); ok {
				return b, maxTime, wire.NumberAt{Off: at, Type: bson.TypeInt64}, nil
			}
		}
	}
	var extra []byte
	if appendMS {
		var b [24]byte
		extra = bsoncore.AppendInt64Element(b[:0], "maxTimeMS", e.MaxTimeMS)
	}
	switch m := msg.(type) {
	case *wire.OpQuery:
		if extra != nil {
			body = appendElements(body, extra)
		}
		query, err := rewrapQuery(m.Query, body)
		if err != nil {
			return nil, 0, wire.NumberAt{}, fmt.Errorf("policy: %s: OP_QUERY: %w", op, err)
		}
		b, err := wire.WithBody(m, query)
		return b, maxTime, wire.NumberAt{}, err
	default:
		return wire.AppendWithEdits(e.Buf[:0], msg.(*wire.OpMsg), body, extra, seqs), maxTime, wire.NumberAt{}, nil
	}
}

// appendCap is the message m with the cap, maxTimeMS: ms as an int64,
// added at the end of its body, when only the cap changes and m has the
// usual layout: its body, which body is, as its first section and no
// checksum. The message's bytes are copied around the new element, which
// is written in place, and its two lengths set (what
// wire.AppendWithEdits yields with the element encoded, byte for byte,
// without encoding each section again), and where the cap's value lies
// in it; false otherwise. dst must be empty: the offset is the message's.
func appendCap(dst []byte, m *wire.OpMsg, body bsoncore.Document, ms int64, seqs []wire.Sequence) ([]byte, int, bool) {
	const at = wire.HeaderSize + 4 + 1 // header, flags, section kind 0
	raw := m.Raw()
	if m.Flags&wire.ChecksumPresent != 0 || len(body) < 5 || len(raw) < at+len(body) || raw[at-1] != 0 ||
		&raw[at] != &body[0] || len(seqs) != len(m.Sequences) || (len(seqs) > 0 && &seqs[0] != &m.Sequences[0]) {
		return nil, 0, false
	}
	end := at + len(body) - 1 // the body's terminating 0
	n := len(raw) + len(capElement) + 8
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	dst = dst[:n]
	copy(dst, raw[:end])
	// The element, 11 bytes before its 8-byte value, as four stores into
	// a window whose bounds are checked once.
	el := (*[len(capElement) + 8]byte)(dst[end:])
	binary.LittleEndian.PutUint64(el[:], capHead8)
	binary.LittleEndian.PutUint16(el[8:], capHead2)
	el[10] = 0
	binary.LittleEndian.PutUint64(el[len(capElement):], uint64(ms))
	copy(dst[end+len(el):], raw[end:])
	binary.LittleEndian.PutUint32(dst, uint32(n))
	binary.LittleEndian.PutUint32(dst[at:], uint32(len(body)+len(el)))
	val := end + len(capElement)
	return dst, val, true
}

// capElement is the cap's element before its value: an int64 (type
// 0x12) under the key maxTimeMS; capHead8 and capHead2 are its first 8
// and next 2 bytes as little-endian words (TestCapHeadIsTheElement).
const (
	capElement = "\x12maxTimeMS\x00"
	capHead8   = uint64(0x12) | 'm'<<8 | 'a'<<16 | 'x'<<24 | 'T'<<32 | 'i'<<40 | 'm'<<48 | 'e'<<56
	capHead2   = uint16('M') | 'S'<<8
)

// appendElements is d with elems, encoded elements, added at its end.
func appendElements(d bsoncore.Document, elems []byte) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+len(elems)))
	out = append(out, d[4:len(d)-1]...)
	out = append(out, elems...)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// statementEdit is what happens to one statement.
type statementEdit struct {
	pin   *Pin
	fence *Fence
}

// editStatements returns the new body and sequences of cmd, reading its
// statements' shape from the command table.
func editStatements(cmd *wire.Command, pins []Pin, fences []Fence) (bsoncore.Document, []wire.Sequence, error) {
	spec := cmd.Spec()
	if spec == nil || (spec.Statements == "" && spec.Writes != wire.WritesFindAndModify) {
		return nil, nil, fmt.Errorf("command has no statements to edit")
	}
	list := spec.Statements
	inserts := spec.Writes == wire.WritesInsert
	edits := make(map[int]*statementEdit, len(pins)+len(fences))
	at := func(l string, i int) (*statementEdit, error) {
		if l != list {
			return nil, fmt.Errorf("no statement list %q", l)
		}
		if spec.Writes == wire.WritesFindAndModify && i != 0 {
			return nil, fmt.Errorf("no statement %q[%d]: findAndModify has one statement", l, i)
		}
		s := edits[i]
		if s == nil {
			s = &statementEdit{}
			edits[i] = s
		}
		return s, nil
	}
	for i := range pins {
		p := &pins[i]
		if inserts {
			return nil, nil, fmt.Errorf("statement %q[%d] cannot be pinned: inserts have no statements to pin", p.List, p.Index)
		}
		s, err := at(p.List, p.Index)
		if err != nil {
			return nil, nil, err
		}
		if s.pin != nil {
			return nil, nil, fmt.Errorf("statement %q[%d] pinned twice", p.List, p.Index)
		}
		s.pin = p
	}
	for i := range fences {
		f := &fences[i]
		s, err := at(f.List, f.Index)
		if err != nil {
			return nil, nil, err
		}
		if s.fence != nil {
			return nil, nil, fmt.Errorf("statement %q[%d] fenced twice", f.List, f.Index)
		}
		if len(f.IDs) != len(f.Tokens) {
			return nil, nil, fmt.Errorf("statement %q[%d]: %d ids, %d tokens", f.List, f.Index, len(f.IDs), len(f.Tokens))
		}
		s.fence = f
	}
	if spec.Writes == wire.WritesFindAndModify {
		if len(edits) == 0 {
			return cmd.Body, cmd.Sequences, nil
		}
		k := spec.Statement
		body, err := editStatement(cmd.Body, k.Filter, k.Update, edits[0], true)
		return body, cmd.Sequences, err
	}
	docs, err := cmd.Documents(list)
	if err != nil {
		return nil, nil, err
	}
	for i := range edits {
		if i < 0 || i >= len(docs) {
			return nil, nil, fmt.Errorf("no statement %q[%d] among %d", list, i, len(docs))
		}
	}
	rewritten := make([]bsoncore.Document, len(docs))
	for i, d := range docs {
		s, ok := edits[i]
		switch {
		case !ok:
			rewritten[i] = d
			continue
		case inserts:
			rewritten[i], err = stampDocument(d, s.fence)
		case spec.Ops != nil:
			rewritten[i], err = editOp(spec, d, s)
		default:
			rewritten[i], err = editStatement(d, spec.Statement.Filter, spec.Statement.Update, s, false)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", list, i, err)
		}
	}
	for si, sq := range cmd.Sequences {
		if sq.Identifier != list {
			continue
		}
		seqs := append([]wire.Sequence(nil), cmd.Sequences...)
		seqs[si] = wire.Sequence{Identifier: list, Documents: rewritten}
		return cmd.Body, seqs, nil
	}
	body, err := replaceField(cmd.Body, list, bsoncore.Value{Type: bson.TypeArray, Data: buildArray(rewritten)}, false)
	return body, cmd.Sequences, err
}

// editOp edits one bulkWrite op, of the kind its first key names.
func editOp(spec *wire.CommandSpec, op bsoncore.Document, s *statementEdit) (bsoncore.Document, error) {
	it := iterate(op)
	k, _, _ := it.next()
	kind := spec.Op(string(k))
	if kind == nil || (kind.Keys.Filter == "" && s.pin != nil) {
		return nil, fmt.Errorf("a %q op has no filter to pin", k)
	}
	if kind.Keys.Filter != "" {
		return editStatement(op, kind.Keys.Filter, kind.Keys.Update, s, false)
	}
	f, err := fieldsOf(op, kind.Keys.Document)
	if err != nil {
		return nil, err
	}
	doc, err := requiredDoc(f[0], kind.Keys.Document)
	if err != nil {
		return nil, err
	}
	if doc, err = stampDocument(doc, s.fence); err != nil {
		return nil, err
	}
	return replaceField(op, kind.Keys.Document, bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: doc}, false)
}

// editStatement pins and fences one update, delete or findAndModify
// statement whose filter and update sit under filterKey and updateKey (""
// for a delete).
func editStatement(stmt bsoncore.Document, filterKey, updateKey string, s *statementEdit, addIfMissing bool) (bsoncore.Document, error) {
	f, err := fieldsOf(stmt, filterKey, updateKey)
	if err != nil {
		return nil, err
	}
	filter := emptyDoc
	if f[0].Type != 0 || !addIfMissing {
		if filter, err = requiredDoc(f[0], filterKey); err != nil {
			return nil, err
		}
	}
	if s.pin != nil {
		filter = pinnedFilter(filter, s.pin.IDs)
	}
	if s.fence != nil {
		filter = joinClause(filter, fenceClause(s.fence))
	}
	out, err := replaceField(stmt, filterKey, bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: filter}, addIfMissing)
	if err != nil || s.fence == nil || updateKey == "" || f[1].Type == 0 {
		return out, err
	}
	u, err := fenceUpdate(f[1], s.fence)
	if err != nil {
		return nil, err
	}
	return replaceField(out, updateKey, u, false)
}

// wholeMS is a maxTimeMS value as the milliseconds it surely bounds a run
// to: an int32, an int64, or a double that is a whole number. A double
// with a fraction is not one: MongoDB refuses it, and a server that takes
// it may round it up past the cap (5.5 under a cap of 5), or down to 0,
// which is no limit at all; it is replaced by the cap.
func wholeMS(v bsoncore.Value) (int64, bool) {
	if f, ok := v.DoubleOK(); ok && (f != math.Trunc(f) || math.IsNaN(f)) {
		return 0, false
	}
	return v.AsInt64OK()
}
