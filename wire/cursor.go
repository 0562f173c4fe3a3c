package wire

import (
	"bytes"
	"encoding/binary"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// cursor walks a message body; every read checks the bytes that remain and
// reports the failing field with its offset from the start of the message.
type cursor struct {
	b   []byte // the whole message
	off int
	end int // reads stop here (before a trailing checksum, a section end)
	op  OpCode
}

func (c *cursor) left() int { return c.end - c.off }

func (c *cursor) int32(what string) (int32, error) {
	if c.left() < 4 {
		return 0, malformed("%v: %s at offset %d truncated (%d bytes left)", c.op, what, c.off, c.left())
	}
	v := int32(binary.LittleEndian.Uint32(c.b[c.off:]))
	c.off += 4
	return v, nil
}

func (c *cursor) int64(what string) (int64, error) {
	if c.left() < 8 {
		return 0, malformed("%v: %s at offset %d truncated (%d bytes left)", c.op, what, c.off, c.left())
	}
	v := int64(binary.LittleEndian.Uint64(c.b[c.off:]))
	c.off += 8
	return v, nil
}

func (c *cursor) cstring(what string) (string, error) {
	i := bytes.IndexByte(c.b[c.off:c.end], 0)
	if i < 0 {
		return "", malformed("%v: %s at offset %d is not terminated", c.op, what, c.off)
	}
	s := string(c.b[c.off : c.off+i])
	c.off += i + 1
	return s, nil
}

// document reads one document of at most max bytes, validated, as a view
// whose capacity ends with it so that appends by callers cannot overwrite
// the bytes that follow.
func (c *cursor) document(what string, max int) (bsoncore.Document, error) {
	if c.left() < 4 {
		return nil, malformed("%v: %s at offset %d truncated (%d bytes left)", c.op, what, c.off, c.left())
	}
	n := int(int32(binary.LittleEndian.Uint32(c.b[c.off:])))
	if n < minDocSize {
		return nil, malformed("%v: %s at offset %d declares %d bytes, below the BSON minimum of %d", c.op, what, c.off, n, minDocSize)
	}
	if n > c.left() {
		return nil, malformed("%v: %s at offset %d declares %d bytes, only %d left", c.op, what, c.off, n, c.left())
	}
	if n > max {
		return nil, tooLarge("%v: %s at offset %d is %d bytes, over the limit of %d", c.op, what, c.off, n, max)
	}
	d := c.b[c.off : c.off+n : c.off+n]
	if err := validateDocument(d); err != nil {
		return nil, malformed("%v: %s at offset %d is invalid BSON: %v", c.op, what, c.off, err)
	}
	c.off += n
	return bsoncore.Document(d), nil
}

// done rejects trailing bytes: every byte must belong to a field.
func (c *cursor) done() error {
	if c.off != c.end {
		return malformed("%v: %d trailing bytes at offset %d", c.op, c.end-c.off, c.off)
	}
	return nil
}

// identifier reads a sequence identifier, interned: drivers only ever send
// a handful of them.
func (c *cursor) identifier() (string, error) {
	i := bytes.IndexByte(c.b[c.off:c.end], 0)
	if i < 0 {
		return "", malformed("%v: document sequence identifier at offset %d is not terminated", c.op, c.off)
	}
	s := internName(c.b[c.off : c.off+i])
	c.off += i + 1
	return s, nil
}
