package audittrail

import (
	"runtime"
	"testing"
	"time"
)

// BenchmarkWriterRecord is the writer's work for one decision record:
// chaining (the canonical encoding and its SHA-256) and the JSON line,
// without the write itself. cpu-ns/op is the thread's CPU time per
// record, which other processes on the machine hardly move (ns/op is
// the wall clock's).
//
//	go test ./audittrail -run '^$' -bench WriterRecord -benchmem
func BenchmarkWriterRecord(b *testing.B) {
	w := &writer{opts: &Options{Instance: "bench", Key: testKey, CheckpointEvery: 1 << 30}}
	ev := decision(b, 7)
	ev.Time = time.Now()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	cpu0 := threadCPU()
	for b.Loop() {
		w.buf, w.ids = w.buf[:0], w.ids[:0]
		r := w.build(&ev)
		if err := w.appendRecord(&r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
