package testkit

import "testing"

// AllocsPerRun is testing.AllocsPerRun for a test process whose other
// goroutines allocate as well: an embedded FerretDB, a lock store's
// timers, what earlier tests left running. testing.AllocsPerRun counts
// the whole process's allocations, so on a loaded machine a burst of
// theirs inside the measured runs lifted a write that allocates nothing
// to "allocates 1 times". It measures up to attempts times and returns
// the least average, ending at the first 0. An allocation of f's own is
// made in every run of every attempt, so it is never measured away; only
// what another goroutine did in some attempts and not in all.
func AllocsPerRun(attempts, runs int, f func()) float64 {
	least := testing.AllocsPerRun(runs, f)
	for i := 1; i < attempts && least > 0; i++ {
		least = min(least, testing.AllocsPerRun(runs, f))
	}
	return least
}
