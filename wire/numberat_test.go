package wire

import (
	"encoding/binary"
	"testing"

	"go.mongodb.org/mongo-driver/bson/bsontype"
)

// TestNumberAtGetAtEveryOffset reads an int64, an int32 and a double at
// every offset of a message, in bounds, across its end and past it:
// Get's fast path for the int64 the proxy caps with must answer as the
// general reading does (get), and never read past the message.
func TestNumberAtGetAtEveryOffset(t *testing.T) {
	b := make([]byte, HeaderSize+24)
	for i := range b {
		b[i] = byte(i * 7)
	}
	for _, typ := range []bsontype.Type{bsontype.Int64, bsontype.Int32, bsontype.Double} {
		for off := -1; off <= len(b)+1; off++ {
			n := NumberAt{Off: off, Type: typ}
			for _, l := range []int{len(b) - 1, len(b)} {
				got, ok := n.Get(b[:l])
				want, wantOK := n.get(b[:l])
				if got != want || ok != wantOK {
					t.Fatalf("%v at %d of %d bytes: Get %d %v, get %d %v", typ, off, l, got, ok, want, wantOK)
				}
				if typ == bsontype.Int64 {
					inside := off >= HeaderSize && off+8 <= l
					if ok != inside || ok && got != int64(binary.LittleEndian.Uint64(b[off:])) {
						t.Fatalf("int64 at %d of %d bytes: %d %v", off, l, got, ok)
					}
				}
			}
		}
	}
}
