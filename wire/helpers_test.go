package wire

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// frameOf builds a message of opcode op from body parts with a correct
// header, ids 7 and 0.
func frameOf(op OpCode, parts ...[]byte) []byte {
	b := Header{RequestID: 7, OpCode: op}.Append(nil)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func i32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }
func i64(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }
func cstr(s string) []byte {
	return append([]byte(s), 0)
}

// seqSection builds a kind-1 section.
func seqSection(id string, docs ...bsoncore.Document) []byte {
	b := []byte{1}
	body := cstr(id)
	for _, d := range docs {
		body = append(body, d...)
	}
	b = append(b, i32(int32(4+len(body)))...)
	return append(b, body...)
}

func bodySection(d bsoncore.Document) []byte { return append([]byte{0}, d...) }

func doc(build func(b *bsoncore.DocumentBuilder)) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder()
	build(b)
	return b.Build()
}

func cmdDoc(name, coll, db string) bsoncore.Document {
	return doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString(name, coll).AppendString("$db", db)
	})
}

// wantErr checks that err wraps sentinel and mentions reason.
func wantErr(t *testing.T, err, sentinel error, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v containing %q", sentinel, reason)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q does not wrap %v", err, sentinel)
	}
	if !strings.Contains(err.Error(), reason) {
		t.Fatalf("error %q does not mention %q", err, reason)
	}
}

func mustParse(t *testing.T, raw []byte) Message {
	t.Helper()
	m, err := Parse(raw, Limits{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}
