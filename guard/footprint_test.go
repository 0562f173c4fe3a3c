package guard

import (
	"reflect"
	"sync"
	"testing"
	"unsafe"

	"github.com/lockgate/lockgate/lockstore"
)

// lineOf is the cache line (64 bytes) of the byte at off in a struct
// that starts on one: the heap's size classes above 64 bytes keep every
// object of connState's, sessionMemo's and verdict's sizes so aligned.
func lineOf(off uintptr) uintptr { return off / 64 }

// spans is the number of cache lines the bytes [off, off+size) touch.
func spans(off, size uintptr) uintptr { return lineOf(off+size-1) - lineOf(off) + 1 }

// TestConnStateHotLines: what the usual allowed write reads and writes
// of its connection's state lies in six cache lines: the fields from mu
// to ts, the first allow series and the first rule memo. Through the
// proxy every other connection's writes run between two of one's, so
// each line touched is a miss (docs/BENCHMARKS.md, "the ninth box's
// footprint"); a field added among the hot ones, or a reorder, that
// spreads them shows here.
func TestConnStateHotLines(t *testing.T) {
	var st connState
	ruleMemoSize := reflect.TypeOf(st.rules).Field(0).Type.Elem().Size() // enforce's, unexported
	hot := []struct {
		name      string
		off, size uintptr
	}{
		{"mu", unsafe.Offsetof(st.mu), unsafe.Sizeof(st.mu)},
		{"deciding", unsafe.Offsetof(st.deciding), unsafe.Sizeof(st.deciding)},
		{"sess", unsafe.Offsetof(st.sess), unsafe.Sizeof(st.sess)},
		{"last", unsafe.Offsetof(st.last), unsafe.Sizeof(st.last)},
		{"line", unsafe.Offsetof(st.line), unsafe.Sizeof(st.line)},
		{"held", unsafe.Offsetof(st.held), unsafe.Sizeof(st.held)},
		{"ts", unsafe.Offsetof(st.ts), unsafe.Sizeof(st.ts)},
		{"allows[0]", unsafe.Offsetof(st.allows), unsafe.Sizeof(st.allows[0])},
		{"rules' first memo", unsafe.Offsetof(st.rules), ruleMemoSize},
	}
	lines := map[uintptr]bool{}
	for _, f := range hot {
		for l := lineOf(f.off); l <= lineOf(f.off+f.size-1); l++ {
			lines[l] = true
		}
	}
	if len(lines) > 6 {
		t.Errorf("the usual write touches %d lines of its connection's state, not 6: %v", len(lines), lines)
	}
	if n := spans(unsafe.Offsetof(st.rules), ruleMemoSize); n != 2 {
		t.Errorf("the first rule memo spans %d lines, not 2", n)
	}
}

// TestMemosHotLines: of a session's memo, the usual allowed write reads
// the memo's own fields (its session, owner key, binding, flights) and
// what its decision line's memo (allowLine.again, allowKey.is, fill)
// compares and copies: together five cache lines, the line's memo right
// after the session's fields, its startAllowed-only slices after that.
func TestMemosHotLines(t *testing.T) {
	var m sessionMemo
	a := unsafe.Offsetof(m.memos) + unsafe.Offsetof(m.memos.allow)
	hot := []struct{ off, size uintptr }{
		{0, unsafe.Offsetof(m.used) + unsafe.Sizeof(m.used)},
		{a + unsafe.Offsetof(m.allow.w), unsafe.Sizeof(m.allow.w)},
		{a + unsafe.Offsetof(m.allow.pol), unsafe.Sizeof(m.allow.pol)},
		{a + unsafe.Offsetof(m.allow.ts), unsafe.Sizeof(m.allow.ts)},
		{a + unsafe.Offsetof(m.allow.gen), unsafe.Sizeof(m.allow.gen)},
		{a + unsafe.Offsetof(m.allow.textGen), unsafe.Sizeof(m.allow.textGen)},
		{a + unsafe.Offsetof(m.allow.keyed), unsafe.Sizeof(m.allow.keyed)},
		{a + unsafe.Offsetof(m.allow.key), unsafe.Sizeof(m.allow.key)},
		{a + unsafe.Offsetof(m.allow.text), unsafe.Sizeof(m.allow.text)},
	}
	lines := map[uintptr]bool{}
	for _, f := range hot {
		for l := lineOf(f.off); l <= lineOf(f.off+f.size-1); l++ {
			lines[l] = true
		}
	}
	if len(lines) > 5 {
		t.Errorf("the usual write reads %d lines of its session's memo and line memo, not 5: %v", len(lines), lines)
	}
}

// TestMessageBufferReleasedOnce: a rewritten message's buffer goes back
// to the guard's pool when the proxy releases it, and only once: were a
// second release of the same message to put it back again, two writes,
// on any two connections, would get the one buffer and encode their
// messages into the same bytes, each sending what the other wrote.
func TestMessageBufferReleasedOnce(t *testing.T) {
	var pool sync.Pool
	m := &msgBuf{spare: &pool}
	b := make([]byte, 0, 64)
	m.out.Store(true) // handed to the proxy (edit)
	m.ReleaseMessage(b)
	m.ReleaseMessage(b)
	got := 0
	for range 2 {
		if pool.Get() == m {
			got++
		}
	}
	if got > 1 {
		t.Fatal("a message released twice went back to the pool twice")
	}
	// Handed out and released, it goes back (tried again until sync.Pool,
	// which drops some of what it is given under the race detector,
	// keeps it).
	for i := 0; ; i++ {
		m.out.Store(true)
		m.ReleaseMessage(b)
		if pool.Get() == m {
			break
		}
		if i == 50 {
			t.Fatal("a released message's buffer never went back to the pool")
		}
	}
	// Not handed out: a release puts nothing back.
	n := &msgBuf{spare: &pool}
	n.ReleaseMessage(b)
	if pool.Get() == n {
		t.Fatal("a buffer the proxy never had went back to the pool")
	}
}

// TestHeldMemosLineAligned: a session memo's held-lock memos start at a
// cache line on the heap (the session memo's size class puts each at a
// line's start, then the runtime's header: checked on a few), so that a
// lookup reads the tags' line and its memo's two lines, not three of
// them (lockstore.HeldMemos).
func TestHeldMemosLineAligned(t *testing.T) {
	var ms lockstore.HeldMemos
	if unsafe.Sizeof(ms) != 64+2*64*4 {
		t.Errorf("lockstore.HeldMemos is %d bytes, not a line of tags and two lines a memo", unsafe.Sizeof(ms))
	}
	keep := make([]*sessionMemo, 8)
	for i := range keep {
		keep[i] = new(sessionMemo)
		if p := uintptr(unsafe.Pointer(&keep[i].held)); p%64 != 0 {
			t.Fatalf("a session memo's held memos are %d bytes into a line (heldPad is off)", p%64)
		}
	}
}
