package testkit

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// allocSink is what the measured functions allocate into.
var allocSink []*[64]byte

// noise allocates in bursts, yielding between them (testing.AllocsPerRun
// runs with GOMAXPROCS 1), until calls passes upTo: another goroutine of
// the process busy during a first attempt only. The channel is closed
// when it has stopped.
func noise(calls *atomic.Int64, upTo int64) <-chan struct{} {
	done := make(chan struct{})
	sink := new([]*[64]byte)
	go func() {
		defer close(done)
		for calls.Load() <= upTo {
			for range 10 {
				*sink = append((*sink)[:0], new([64]byte))
			}
			runtime.Gosched()
		}
	}()
	return done
}

// TestAllocsPerRunSeesOnlyItsOwn: f allocating nothing while another
// goroutine allocates during the first attempt's runs reads 0, where one
// attempt (testing.AllocsPerRun) reads the other goroutine's
// allocations; f allocating once a run reads 1 however many attempts.
func TestAllocsPerRunSeesOnlyItsOwn(t *testing.T) {
	const runs = 50
	var calls atomic.Int64
	quiet := func() {
		calls.Add(1)
		runtime.Gosched()
	}
	// The first attempt is the warm-up call and runs calls: runs+1.
	done := noise(&calls, runs)
	if n := AllocsPerRun(1, runs, quiet); n == 0 {
		t.Error("one attempt did not count the other goroutine's burst: this test shows nothing")
	}
	<-done
	calls.Store(0)
	done = noise(&calls, runs)
	if n := AllocsPerRun(5, runs, quiet); n != 0 {
		t.Errorf("f allocates nothing, measured %v a run", n)
	}
	<-done
	allocating := func() { allocSink = append(allocSink[:0], new([64]byte)) }
	if n := AllocsPerRun(5, runs, allocating); n != 1 {
		t.Errorf("f allocates once a run, measured %v", n)
	}
}
