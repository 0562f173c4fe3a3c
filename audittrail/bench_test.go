package audittrail

import (
	"testing"
	"time"
)

// BenchmarkWriterRecord is the writer's work for one decision record:
// chaining (the canonical encoding and its SHA-256) and the JSON line,
// without the write itself.
//
//	go test ./audittrail -run '^$' -bench WriterRecord -benchmem
func BenchmarkWriterRecord(b *testing.B) {
	w := &writer{opts: &Options{Instance: "bench", Key: testKey, CheckpointEvery: 1 << 30}}
	ev := decision(b, 7)
	ev.Time = time.Now()
	b.ReportAllocs()
	for b.Loop() {
		w.buf, w.ids = w.buf[:0], w.ids[:0]
		r := w.build(&ev)
		if err := w.appendRecord(&r); err != nil {
			b.Fatal(err)
		}
	}
}
