package testkit

import (
	"flag"
	"runtime"
	"strconv"
	"testing"
)

// DefaultParallel sets the testing package's -parallel to n unless the
// command line set it: for a package whose parallel tests mostly wait
// (leases running out, child processes, injected delays), so that more of
// them wait at once than go's default of one per CPU. TestMain calls it
// after flag.Parse and before m.Run.
func DefaultParallel(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			set = true
		}
	})
	if !set && flag.Lookup("test.parallel") != nil {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// Slots bounds how many of a package's parallel cases of one kind run at
// once, below the package's -parallel: DefaultParallel lets the cases that
// wait run together, Slots keeps those that keep a core busy at one per
// CPU (go's default), so that they do not stretch each other's holds
// towards their leases. Each such case calls Take after t.Parallel.
type Slots chan struct{}

// CPUSlots are Slots of one per CPU.
func CPUSlots() Slots { return make(Slots, runtime.GOMAXPROCS(0)) }

// Take holds a slot until t ends, waiting for one first.
func (s Slots) Take(t testing.TB) {
	s <- struct{}{}
	t.Cleanup(func() { <-s })
}
