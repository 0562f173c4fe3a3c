// Package testkit is what every test package of lockgate shares: a
// TestMain that checks for leaked goroutines (RunMain), the one poll for an
// observable state (Eventually), and the check for an outside tool
// (RequireTool) that skips on a developer's machine and fails under CI,
// and the limit of a run to the tests the race detector changes
// (OnlyRaceScaled) where scripts/test.sh runs the rest under it only.
//
// It is a leaf: it imports nothing of lockgate, so any package's tests may
// use it. Starting a gateway lives in gateway/gatewaytest, beside what it
// starts. It must never sleep to order events: tests wait on an event or
// poll a state that the event leaves behind.
package testkit
