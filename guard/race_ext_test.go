//go:build race

package guard_test

// raceEnabled: see formCases; the package guard's own tests have theirs
// (race_test.go).
const raceEnabled = true
