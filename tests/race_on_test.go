//go:build race

package tests

// raceEnabled scales the heaviest workloads down under the race detector,
// which slows the in-process upstream (FerretDB on a Go-translated SQLite)
// by an order of magnitude; the full sizes run in the ordinary test run.
const raceEnabled = true
