//go:build race

package reliability

// raceEnabled scales the heaviest workloads of this package down under the
// race detector, which slows the in-process FerretDB (a Go-translated
// SQLite) by an order of magnitude: fewer workers and increments in the
// lost-update test, 100 instead of 500 connections and a shorter run in
// the soak. The full sizes run in the ordinary `go test`.
const raceEnabled = true
