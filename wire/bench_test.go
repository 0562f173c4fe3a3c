package wire

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockgate/lockgate/mongoerr"
)

// BenchmarkHotPath measures what the proxy does for every request: frame
// it, parse it, and extract the command, on a captured Go driver update
// with an lsid and an "updates" document sequence.
func BenchmarkHotPath(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "captures", "go", "019-c2s-op_msg.bin"))
	if err != nil {
		b.Fatal(err)
	}
	pool := NewBufferPool()
	r := bytes.NewReader(raw)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(raw)
		m, err := ReadMessage(r, pool, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		msg, err := Parse(m.Bytes, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		cmd, err := CommandOf(msg)
		if err != nil || cmd.Name != "update" {
			b.Fatal(cmd, err)
		}
		if _, err := cmd.Documents("updates"); err != nil {
			b.Fatal(err)
		}
		if _, ok := cmd.SessionID(); !ok {
			b.Fatal("no session")
		}
		m.Release()
	}
}

// BenchmarkParse isolates Parse+CommandOf of the same message.
func BenchmarkParse(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "captures", "go", "019-c2s-op_msg.bin"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		msg, err := Parse(raw, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := CommandOf(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplyTo measures building a rejection.
func BenchmarkErrorReplyTo(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "captures", "go", "019-c2s-op_msg.bin"))
	if err != nil {
		b.Fatal(err)
	}
	msg, err := Parse(raw, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	e := &mongoerr.Error{Code: mongoerr.LockBusy, Msg: "document is locked"}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ErrorReplyTo(msg, 1, e); !ok {
			b.Fatal("no reply")
		}
	}
}
