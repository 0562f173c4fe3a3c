//go:build race

package guard

// raceEnabled: under the race detector the forms generators draw a fifth
// of their cases (all of them run without it, in go test ./...), and the
// allocation tests skip, as the detector allocates on its own.
const raceEnabled = true
