package audittrail

import (
	"runtime"
	"sync"
	"sync/atomic"
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
	w := &writer{opts: &Options{Instance: "bench", Key: testKey, CheckpointEvery: 1 << 30}, instanceSafe: true}
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

// BenchmarkTrailPaced is the trail's whole cost per record at a rate
// like the proxy's (16 producers, each appending every 1.6 ms: about
// 10 000 records a second), the real writer and file sink included: its
// wake-ups, write and fsync system calls, checkpoints and the runtime's
// work for them. "paced" is the same producers appending nowhere; the
// difference of the two legs' cpu-ns/op (the whole process's CPU time
// per record) is the trail's. b.N is the number of records.
//
//	go test ./audittrail -run '^$' -bench TrailPaced -benchtime 40000x -count 3
func BenchmarkTrailPaced(b *testing.B) {
	const producers, every = 16, 1600 * time.Microsecond
	for _, leg := range []string{"paced", "paced+trail"} {
		b.Run(leg, func(b *testing.B) {
			appendTo := func(Event) bool { return true }
			var tr *Trail
			if leg == "paced+trail" {
				var err error
				tr, err = Open(Options{Dir: b.TempDir(), Instance: "bench", Key: testKey})
				if err != nil {
					b.Fatal(err)
				}
				appendTo = tr.Append
			}
			ev := decision(b, 7)
			var dropped atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for p := range producers {
				n := b.N / producers
				if p < b.N%producers {
					n++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					next := time.Now()
					for range n {
						next = next.Add(every)
						// The pace is the subject: a producer appends at a
						// proxy's rate, not as fast as it can.
						time.Sleep(time.Until(next))
						if !appendTo(ev) {
							dropped.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if tr != nil {
				if err := tr.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(dropped.Load())/float64(b.N), "dropped/op")
		})
	}
}
