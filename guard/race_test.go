//go:build race

package guard

// raceEnabled: the race detector also instruments the embedded FerretDB,
// which then runs several times slower; load tests scale down.
const raceEnabled = true
