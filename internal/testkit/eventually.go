package testkit

import (
	"testing"
	"time"
)

// pollEvery is how often Eventually looks again: short against any wait a
// test makes, long enough not to compete with the work it waits for.
const pollEvery = 10 * time.Millisecond

// Eventually waits until cond holds, failing t with what if it does not
// within d. cond reads a state that the awaited event leaves behind (a
// metric, a record, a log line); d bounds a broken run, it is never the
// order of events.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Within is Eventually for a test that reports the failure itself (with
// what it read, or after stopping its workers): it reports whether cond
// held within d.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
