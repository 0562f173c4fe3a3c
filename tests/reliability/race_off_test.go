//go:build !race

package reliability

// raceEnabled: see race_on_test.go.
const raceEnabled = false
