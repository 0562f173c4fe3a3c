//go:build race

package policy

// raceEnabled: the race detector's instrumentation allocates, so the
// tests that count allocations do not run under it.
const raceEnabled = true
