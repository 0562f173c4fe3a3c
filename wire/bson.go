package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// maxDepth matches the server's default nesting limit; it also bounds the
// validator's recursion.
const maxDepth = 200

// validateDocument checks that d is exactly one well-formed BSON document,
// recursively. bsoncore's own Validate trusts nested lengths and can index
// out of range on hostile input, so the codec keeps its own strict walk.
func validateDocument(d []byte) error {
	return validateDoc(d, 0)
}

func validateDoc(d []byte, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	if len(d) < minDocSize {
		return fmt.Errorf("document of %d bytes is shorter than %d", len(d), minDocSize)
	}
	n := int(int32(binary.LittleEndian.Uint32(d)))
	if n != len(d) {
		return fmt.Errorf("document declares %d bytes, has %d", n, len(d))
	}
	if d[n-1] != 0 {
		return fmt.Errorf("document does not end with 0x00")
	}
	off := 4
	end := n - 1
	for off < end {
		t := d[off]
		off++
		k := bytes.IndexByte(d[off:end], 0)
		if k < 0 {
			return fmt.Errorf("element key at offset %d is not terminated", off)
		}
		off += k + 1
		size, err := valueSize(d[off:end], t, depth)
		if err != nil {
			return fmt.Errorf("element %q: %w", d[off-k-1:off-1], err)
		}
		off += size
	}
	return nil
}

// valueSize returns the length of the value of type t at the start of b,
// validating it.
func valueSize(b []byte, t byte, depth int) (int, error) {
	fixed := func(n int) (int, error) {
		if len(b) < n {
			return 0, fmt.Errorf("type 0x%02x needs %d bytes, %d left", t, n, len(b))
		}
		return n, nil
	}
	switch bsontype.Type(t) {
	case bson.TypeDouble, bson.TypeDateTime, bson.TypeTimestamp, bson.TypeInt64:
		return fixed(8)
	case bson.TypeInt32:
		return fixed(4)
	case bson.TypeDecimal128:
		return fixed(16)
	case bson.TypeObjectID:
		return fixed(12)
	case bson.TypeBoolean:
		if len(b) < 1 {
			return fixed(1)
		}
		if b[0] > 1 {
			return 0, fmt.Errorf("boolean byte 0x%02x is neither 0 nor 1", b[0])
		}
		return 1, nil
	case bson.TypeUndefined, bson.TypeNull, bson.TypeMinKey, bson.TypeMaxKey:
		return 0, nil
	case bson.TypeString, bson.TypeJavaScript, bson.TypeSymbol:
		return stringSize(b)
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		n, err := docSize(b)
		if err != nil {
			return 0, err
		}
		return n, validateDoc(b[:n], depth+1)
	case bson.TypeBinary:
		if len(b) < 5 {
			return fixed(5)
		}
		n := int(int32(binary.LittleEndian.Uint32(b)))
		if n < 0 || n > len(b)-5 {
			return 0, fmt.Errorf("binary length %d out of bounds (%d left)", n, len(b)-5)
		}
		return 5 + n, nil
	case bson.TypeRegex:
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return 0, fmt.Errorf("regex pattern not terminated")
		}
		j := bytes.IndexByte(b[i+1:], 0)
		if j < 0 {
			return 0, fmt.Errorf("regex options not terminated")
		}
		return i + 1 + j + 1, nil
	case bson.TypeDBPointer:
		n, err := stringSize(b)
		if err != nil {
			return 0, err
		}
		if len(b)-n < 12 {
			return 0, fmt.Errorf("dbpointer id truncated")
		}
		return n + 12, nil
	case bson.TypeCodeWithScope:
		if len(b) < 4 {
			return fixed(4)
		}
		total := int(int32(binary.LittleEndian.Uint32(b)))
		if total < 4+5+5 || total > len(b) {
			return 0, fmt.Errorf("code with scope length %d out of bounds", total)
		}
		s, err := stringSize(b[4:total])
		if err != nil {
			return 0, err
		}
		scope := b[4+s : total]
		n, err := docSize(scope)
		if err != nil {
			return 0, err
		}
		if n != len(scope) {
			return 0, fmt.Errorf("code with scope length %d disagrees with its parts", total)
		}
		return total, validateDoc(scope, depth+1)
	default:
		return 0, fmt.Errorf("unknown BSON type 0x%02x", t)
	}
}

// stringSize validates a BSON string (int32 length including the NUL, bytes,
// NUL) at the start of b.
func stringSize(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, fmt.Errorf("string length truncated")
	}
	n := int(int32(binary.LittleEndian.Uint32(b)))
	if n < 1 || n > len(b)-4 {
		return 0, fmt.Errorf("string length %d out of bounds (%d left)", n, len(b)-4)
	}
	if b[4+n-1] != 0 {
		return 0, fmt.Errorf("string does not end with 0x00")
	}
	return 4 + n, nil
}

// docSize reads a document's declared length and bounds it by b.
func docSize(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, fmt.Errorf("document length truncated")
	}
	n := int(int32(binary.LittleEndian.Uint32(b)))
	if n < minDocSize || n > len(b) {
		return 0, fmt.Errorf("document length %d out of bounds (%d left)", n, len(b))
	}
	return n, nil
}

// Integral returns the value of an int32, an int64 or a double that holds
// a whole number exactly (at most 2^53 away from zero): how the server
// reads a count or a number of milliseconds that a driver may send as any
// numeric type.
func Integral(v bsoncore.Value) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32()), true
	case bson.TypeInt64:
		return v.Int64(), true
	case bson.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || math.IsInf(f, 0) || math.Abs(f) > 1<<53 {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}
