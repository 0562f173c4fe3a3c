// Package conformance runs the Python and Node.js client helpers
// (client/python, client/node) against a real lockgate in front of the
// embedded FerretDB, from go test, so that they run wherever the Go tests
// run. Each helper's scenario script prints what it observed, one JSON line
// per scenario; the tests here judge. It has no code of its own.
package conformance
