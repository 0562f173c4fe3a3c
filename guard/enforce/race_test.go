//go:build race

package enforce

// raceEnabled scales TestAllowEveryForm's draw down under the race
// detector, which decides four to five times slower (7 s for its 3,000
// cases, 1.7 s without); the full draw runs without the detector, in go
// test ./..., which this package must stay in (scripts/test.sh).
const raceEnabled = true
