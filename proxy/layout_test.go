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
	// The heap's size classes of 448 and 512 bytes hold objects at
	// multiples of 64 bytes; other classes near it (416, 480) do not.
	if n := rt.Size(); n <= 416 || n > 512 || n > 448 && n <= 480 {
		t.Errorf("conn is %d bytes: its size class does not keep it 64-aligned", n)
	}
}
