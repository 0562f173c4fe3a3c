package audittrail

import (
	"strconv"
	"unsafe"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
)

// arenaBlock is the size of one block of an arena: room for the strings
// of some hundreds of records.
const arenaBlock = 32 << 10

// arena hands the writer the strings of its records (times, hashes,
// formatted ids) without an allocation each: their bytes are copied
// into a large block and the string points there. A block is only ever
// appended to, never written below its length, so the bytes under a
// string handed out never change; a full block is left to the garbage
// collector, which frees it once no string points into it. Only the
// writer goroutine uses it.
type arena struct{ block []byte }

// str is p as a string in the arena.
func (a *arena) str(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	if cap(a.block)-len(a.block) < len(p) {
		a.block = make([]byte, 0, max(arenaBlock, len(p)))
	}
	start := len(a.block)
	a.block = append(a.block, p...)
	return unsafe.String(&a.block[start], len(p))
}

// appendID appends id as docid.Format writes it (the same bytes:
// TestAppendIDMatchesFormat), without a string for the common _id
// types; any other type takes docid.Format.
func appendID(b []byte, id docid.ID) []byte {
	v := id.Raw()
	switch v.Type {
	case bson.TypeInt32:
		if n, ok := v.Int32OK(); ok {
			return strconv.AppendInt(b, int64(n), 10)
		}
	case bson.TypeInt64:
		if n, ok := v.Int64OK(); ok {
			return strconv.AppendInt(b, n, 10)
		}
	case bson.TypeString:
		if s, ok := v.StringValueOK(); ok {
			return strconv.AppendQuote(b, s)
		}
	case bson.TypeObjectID:
		if oid, ok := v.ObjectIDOK(); ok {
			b = append(b, `ObjectId("`...)
			var h [24]byte
			const digits = "0123456789abcdef"
			for i, c := range oid {
				h[2*i], h[2*i+1] = digits[c>>4], digits[c&0xF]
			}
			b = append(b, h[:]...)
			return append(b, `")`...)
		}
	}
	return append(b, id.String()...)
}
