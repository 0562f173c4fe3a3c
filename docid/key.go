package docid

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unsafe"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
)

// The canonical key is persisted: the lock store names its records by it
// (lockstore's record ids), so a change to this encoding would orphan
// every lock held across an upgrade. TestKeyGolden pins it.

// maxDepth bounds the nesting of documents and arrays inside an _id: the
// server's own limit, so that no _id it stores is one lockgate refuses.
const maxDepth = 200

// Type brackets of the canonical encoding. Values that MongoDB considers
// equal share a bracket (all numbers; string and symbol), as in the server's
// canonical type order; the byte values only need to be distinct.
const (
	tagMinKey    = 0x00
	tagUndefined = 0x01
	tagNull      = 0x05
	tagNumber    = 0x0a
	tagString    = 0x0f
	tagDocument  = 0x14
	tagArray     = 0x19
	tagBinary    = 0x1e
	tagObjectID  = 0x23
	tagBool      = 0x28
	tagDate      = 0x2d
	tagTimestamp = 0x2f
	tagRegex     = 0x32
	tagDBPointer = 0x37
	tagCode      = 0x3c
	tagCodeScope = 0x41
	tagMaxKey    = 0x7f
	tagElemMore  = 0x01
	tagElemEnd   = 0x00
	numNaN       = "nan"
	numPosInf    = "+inf"
	numNegInf    = "-inf"
)

// appendKey appends the canonical key of v to b: two values get the same
// key exactly when MongoDB's _id index considers them equal (simple binary
// collation). Numbers of any type compare by exact value (int32 1, int64 1,
// double 1.0 and decimal128 1 are one key, -0 equals 0, every NaN is one
// key); string and symbol share a bracket; documents compare field by
// field in order, so field order matters; arrays, regular expressions and
// undefined are invalid as a top-level _id, and "$"-prefixed field names
// are invalid anywhere inside it.
// keyBuf is where a canonical key is built: bytes that become the key's
// string without a copy (asString), as strings.Builder's do, and that may
// start in room of the caller's (Copy's single id shares one allocation
// with its value).
type keyBuf struct{ b []byte }

func (k *keyBuf) WriteByte(c byte) error { k.b = append(k.b, c); return nil }

func (k *keyBuf) Write(p []byte) (int, error) { k.b = append(k.b, p...); return len(p), nil }

func (k *keyBuf) WriteString(s string) (int, error) { k.b = append(k.b, s...); return len(s), nil }

func (k *keyBuf) Len() int { return len(k.b) }

// asString is the key built. Its bytes are never written again: k is
// dropped or only appended to past them.
func (k *keyBuf) asString() string {
	if len(k.b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(k.b), len(k.b))
}

func appendKey(b *keyBuf, v bson.RawValue) error {
	if err := v.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch v.Type {
	case bson.TypeArray:
		return fmt.Errorf("%w: an _id cannot be an array", ErrInvalid)
	case bson.TypeRegex:
		return fmt.Errorf("%w: an _id cannot be a regular expression", ErrInvalid)
	case bson.TypeUndefined:
		return fmt.Errorf("%w: an _id cannot be undefined", ErrInvalid)
	case bsontype.Type(0):
		return fmt.Errorf("%w: missing _id value", ErrInvalid)
	}
	return encodeValue(b, v, 0)
}

func encodeValue(b *keyBuf, v bson.RawValue, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: _id nested deeper than %d", ErrInvalid, maxDepth)
	}
	switch v.Type {
	case bson.TypeMinKey:
		b.WriteByte(tagMinKey)
	case bson.TypeMaxKey:
		b.WriteByte(tagMaxKey)
	case bson.TypeUndefined:
		b.WriteByte(tagUndefined)
	case bson.TypeNull:
		b.WriteByte(tagNull)
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
		n, err := canonicalNumber(v)
		if err != nil {
			return err
		}
		b.WriteByte(tagNumber)
		writeString(b, n)
	case bson.TypeString, bson.TypeSymbol:
		// Both are int32 length, bytes, NUL (validated): the bytes are
		// read in place, as converting them to a string would copy them.
		b.WriteByte(tagString)
		writeBytes(b, v.Value[4:len(v.Value)-1])
	case bson.TypeEmbeddedDocument:
		b.WriteByte(tagDocument)
		elems, err := v.Document().Elements()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		for i, e := range elems {
			k := e.Key()
			if strings.HasPrefix(k, "$") && !dbRefField(elems, i) {
				return fmt.Errorf("%w: _id fields may not start with '$' (%q)", ErrInvalid, k)
			}
			b.WriteByte(tagElemMore)
			writeString(b, k)
			if err := encodeValue(b, e.Value(), depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(tagElemEnd)
	case bson.TypeArray:
		b.WriteByte(tagArray)
		vals, err := v.Array().Values()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		for _, e := range vals {
			b.WriteByte(tagElemMore)
			if err := encodeValue(b, e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(tagElemEnd)
	case bson.TypeBinary:
		sub, data := v.Binary()
		b.WriteByte(tagBinary)
		b.WriteByte(sub)
		writeBytes(b, data)
	case bson.TypeObjectID:
		oid := v.ObjectID()
		b.WriteByte(tagObjectID)
		b.Write(oid[:])
	case bson.TypeBoolean:
		b.WriteByte(tagBool)
		if v.Boolean() {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case bson.TypeDateTime:
		b.WriteByte(tagDate)
		// Flip the sign bit so that byte order follows numeric order.
		writeUint64(b, uint64(v.DateTime())^(1<<63))
	case bson.TypeTimestamp:
		t, i := v.Timestamp()
		b.WriteByte(tagTimestamp)
		writeUint64(b, uint64(t)<<32|uint64(i))
	case bson.TypeRegex:
		p, o := v.Regex()
		b.WriteByte(tagRegex)
		writeString(b, p)
		writeString(b, o)
	case bson.TypeDBPointer:
		ns, oid := v.DBPointer()
		b.WriteByte(tagDBPointer)
		writeString(b, ns)
		b.Write(oid[:])
	case bson.TypeJavaScript:
		b.WriteByte(tagCode)
		writeString(b, v.JavaScript())
	case bson.TypeCodeWithScope:
		code, scope := v.CodeWithScope()
		b.WriteByte(tagCodeScope)
		writeString(b, code)
		sv := bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: scope}
		if err := encodeValue(b, sv, depth+1); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: unsupported BSON type %v", ErrInvalid, v.Type)
	}
	return nil
}

// dbRefField reports whether elems[i] is a field of a DBRef ({$ref:
// <string>, $id: <value>} and an optional $db: <string>, in that order, at
// the start of the document): the one place the server stores a
// "$"-prefixed field inside an _id.
func dbRefField(elems []bson.RawElement, i int) bool {
	isString := func(j int) bool { return elems[j].Value().Type == bson.TypeString }
	ref := len(elems) > 1 && elems[0].Key() == "$ref" && isString(0) && elems[1].Key() == "$id"
	switch elems[i].Key() {
	case "$ref", "$id":
		return ref && i <= 1
	case "$db":
		return ref && i == 2 && isString(2)
	}
	return false
}

func writeString(b *keyBuf, s string) {
	var n [binary.MaxVarintLen64]byte
	b.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	b.WriteString(s)
}

func writeUint64(b *keyBuf, n uint64) {
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], n)
	b.Write(p[:])
}

func writeBytes(b *keyBuf, p []byte) {
	var n [binary.MaxVarintLen64]byte
	b.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
	b.Write(p)
}

// canonicalNumber renders a number by its exact value: an integer as its
// decimal digits, any other finite value as the reduced fraction p/q, and the
// special values as "nan", "+inf", "-inf". Values equal in MongoDB's numeric
// comparison get the same text.
func canonicalNumber(v bson.RawValue) (string, error) {
	switch v.Type {
	case bson.TypeInt32:
		return strconv.FormatInt(int64(v.Int32()), 10), nil
	case bson.TypeInt64:
		return strconv.FormatInt(v.Int64(), 10), nil
	case bson.TypeDouble:
		f := v.Double()
		switch {
		case math.IsNaN(f):
			return numNaN, nil
		case math.IsInf(f, 1):
			return numPosInf, nil
		case math.IsInf(f, -1):
			return numNegInf, nil
		case f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63:
			return strconv.FormatInt(int64(f), 10), nil
		}
		// MongoDB compares a double with a decimal after rounding the double
		// to 34 significant digits (Decimal128's precision); the rounded
		// value is injective on doubles, so it is the canonical value.
		r, ok := new(big.Rat).SetString(new(big.Float).SetFloat64(f).Text('e', 33))
		if !ok {
			return "", fmt.Errorf("%w: cannot render %v", ErrInvalid, f)
		}
		return r.RatString(), nil
	case bson.TypeDecimal128:
		d := v.Decimal128()
		if d.IsNaN() {
			return numNaN, nil
		}
		switch d.IsInf() {
		case 1:
			return numPosInf, nil
		case -1:
			return numNegInf, nil
		}
		bi, exp, err := d.BigInt()
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		r := new(big.Rat).SetInt(bi)
		if exp != 0 {
			p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(exp))), nil)
			if exp > 0 {
				r.Mul(r, new(big.Rat).SetInt(p))
			} else {
				r.Quo(r, new(big.Rat).SetInt(p))
			}
		}
		return r.RatString(), nil
	}
	return "", fmt.Errorf("%w: not a number", ErrInvalid)
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
