//go:build race

package lockstore

// raceEnabled: the detector slows the store's own code several times,
// and the embedded FerretDB too unless LOCKGATE_TEST_FERRETDB runs it in a
// process of its own (scripts/test.sh does); load tests scale down. The
// tests that reach it also run without the detector (testkit.OnlyRaceScaled).
const raceEnabled = true
