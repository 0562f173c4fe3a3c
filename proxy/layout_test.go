package proxy

import (
	"reflect"
	"testing"
)

// TestConnHotFieldsFirst holds the fields every request touches to the
// connection's first four cache lines (256 bytes, the struct's size
// class keeping it 64-aligned): a field added among them, or one of them
// moved below the cold ones, spreads a request over more lines, each a
// cache miss once the other connections' work has evicted them.
func TestConnHotFieldsFirst(t *testing.T) {
	hot := []string{"srv", "info", "client", "upstream", "ctx", "inflight", "draining",
		"nHellos", "nUnacked", "nAuth", "nQuiet", "nAsks", "nHooks", "rttID", "hookID", "rttAt",
		"readSince", "writeSince", "hook", "wmu", "mu", "pumpDone", "spoke", "req"}
	rt := reflect.TypeOf(conn{})
	for _, name := range hot {
		f, ok := rt.FieldByName(name)
		if !ok {
			t.Fatalf("conn has no field %s", name)
		}
		if end := f.Offset + f.Type.Size(); end > 256 {
			t.Errorf("conn.%s ends at byte %d, past the first four cache lines", name, end)
		}
	}
	// The heap's size classes near it, from internal/runtime/gc/sizeclasses.go: an
	// object of a class that is a multiple of 64 bytes starts on a line
	// (its span starts on a page).
	n := rt.Size()
	for _, class := range []uintptr{288, 320, 352, 384, 416, 448, 480, 512} {
		if n <= class {
			if class%64 != 0 {
				t.Errorf("conn is %d bytes, in the %d-byte size class: it does not start on a cache line", n, class)
			}
			return
		}
	}
	t.Errorf("conn is %d bytes: see which size class it falls in", n)
}
