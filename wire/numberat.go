package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math"

	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// NumberAt is where a number lies in an encoded message: the offset of its
// value from the message's first byte, and its BSON type (an int32, an
// int64 or a double). The zero NumberAt locates nothing: no value starts
// inside a header.
//
// It lets the one who sends a message change the number in place, at the
// last moment, without encoding the message again: the proxy lowers an
// enforced write's maxTimeMS to what is left of its lease when it reads
// the clock just before the bytes leave.
type NumberAt struct {
	Off  int
	Type bsontype.Type
}

// Located reports whether n locates a value.
func (n NumberAt) Located() bool { return n.Off >= HeaderSize }

// width is the size of n's value, 0 for a type it cannot hold.
func (n NumberAt) width() int {
	switch n.Type {
	case bsontype.Int32:
		return 4
	case bsontype.Int64, bsontype.Double:
		return 8
	}
	return 0
}

// Get reads the number in b, the message; false when n does not fit in b,
// or the value is a double that is not a whole number: a server may round
// such a maxTimeMS up, or down to 0 (no limit), so it bounds nothing.
func (n NumberAt) Get(b []byte) (int64, bool) {
	// The int64 the proxy's own cap is, read where it is called
	// (inlined) on every capped write.
	if n.Type == bsontype.Int64 && n.Off >= HeaderSize && n.Off <= len(b)-8 {
		return int64(binary.LittleEndian.Uint64(b[n.Off:])), true
	}
	return n.get(b)
}

// get is Get for every type.
func (n NumberAt) get(b []byte) (int64, bool) {
	w := n.width()
	if !n.Located() || w == 0 || n.Off+w > len(b) {
		return 0, false
	}
	v := b[n.Off : n.Off+w]
	switch n.Type {
	case bsontype.Int32:
		return int64(int32(binary.LittleEndian.Uint32(v))), true
	case bsontype.Int64:
		return int64(binary.LittleEndian.Uint64(v)), true
	default:
		f := math.Float64frombits(binary.LittleEndian.Uint64(v))
		if math.IsNaN(f) || f >= math.MaxInt64 || f < math.MinInt64 || f != math.Trunc(f) {
			return 0, false
		}
		return int64(f), true
	}
}

// Set writes v, which must fit n's type (an int32 takes what an int32
// holds), into b, the whole message, in place; an OP_MSG's checksum is
// computed again when it carries one. It reports false, changing nothing,
// when n does not fit in b or v does not fit n.
func (n NumberAt) Set(b []byte, v int64) bool {
	w := n.width()
	if !n.Located() || w == 0 || n.Off+w > len(b) {
		return false
	}
	p := b[n.Off : n.Off+w]
	switch n.Type {
	case bsontype.Int32:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return false
		}
		binary.LittleEndian.PutUint32(p, uint32(int32(v)))
	case bsontype.Int64:
		binary.LittleEndian.PutUint64(p, uint64(v))
	default:
		binary.LittleEndian.PutUint64(p, math.Float64bits(float64(v)))
	}
	if OpCode(binary.LittleEndian.Uint32(b[12:])) == OpCodeMsg && len(b) >= HeaderSize+8 &&
		MsgFlags(binary.LittleEndian.Uint32(b[HeaderSize:]))&ChecksumPresent != 0 {
		end := len(b) - 4
		binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
	}
	return true
}

// LocateCommandNumber finds the first top-level field key of the command
// document in b, an encoded OP_MSG (its body section) or OP_QUERY (its
// query, inside a $query or query wrapper if it has one, as CommandOf
// reads it), and returns where its value lies. false when b is neither,
// is malformed, or has no such field holding an int32, an int64 or a
// double.
func LocateCommandNumber(b []byte, key string) (NumberAt, bool) {
	if len(b) < HeaderSize+4 || int(binary.LittleEndian.Uint32(b)) != len(b) {
		return NumberAt{}, false
	}
	switch OpCode(binary.LittleEndian.Uint32(b[12:])) {
	case OpCodeMsg:
		end := len(b)
		if MsgFlags(binary.LittleEndian.Uint32(b[HeaderSize:]))&ChecksumPresent != 0 {
			end -= 4
		}
		for at := HeaderSize + 4; at < end; {
			kind := b[at]
			at++
			if at+4 > end {
				return NumberAt{}, false
			}
			size := int(int32(binary.LittleEndian.Uint32(b[at:])))
			if size < 5 || at+size > end {
				return NumberAt{}, false
			}
			switch kind {
			case sectionBody:
				return locateNumber(b, at, size, key)
			case sectionSequence:
				at += size
			default:
				return NumberAt{}, false
			}
		}
	case OpCodeQuery:
		at := HeaderSize + 4
		for at < len(b) && b[at] != 0 {
			at++
		}
		at += 1 + 8 // the name's 0, numberToSkip, numberToReturn
		if at+4 > len(b) {
			return NumberAt{}, false
		}
		size := int(int32(binary.LittleEndian.Uint32(b[at:])))
		if size < 5 || at+size > len(b) {
			return NumberAt{}, false
		}
		q := bsoncore.Document(b[at : at+size])
		if e, err := q.IndexErr(0); err == nil {
			if k := e.KeyBytes(); string(k) == "$query" || string(k) == "query" {
				if v := e.Value(); v.Type == bsontype.EmbeddedDocument {
					// The wrapped command's document is the value's data,
					// which ends the first element.
					inner := at + 4 + 1 + len(k) + 1
					return locateNumber(b, inner, len(v.Data), key)
				}
			}
		}
		return locateNumber(b, at, size, key)
	}
	return NumberAt{}, false
}

// locateNumber finds key among the top-level fields of the document of
// size bytes at b[at:].
func locateNumber(b []byte, at, size int, key string) (NumberAt, bool) {
	doc := b[at : at+size]
	rest := doc[4 : len(doc)-1]
	for len(rest) > 0 {
		e, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return NumberAt{}, false
		}
		if string(e.KeyBytes()) == key {
			t := bsontype.Type(e[0])
			// rest starts at the element; doc ends with a 0 that rest has not.
			off := at + (len(doc) - 1 - len(rest)) + 1 + len(key) + 1
			n := NumberAt{Off: off, Type: t}
			if n.width() == 0 {
				return NumberAt{}, false
			}
			return n, true
		}
		rest = r
	}
	return NumberAt{}, false
}
