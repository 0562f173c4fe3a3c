// Package capture records real driver traffic for the wire package's golden
// tests. It has no production code: run
//
//	LOCKGATE_RECORD=1 go test ./tests/capture -run TestRecord -v
//
// to start the embedded FerretDB, relay the Go driver, pymongo and (when npm
// can install it) the Node.js driver through a recording relay, and rewrite
// wire/testdata/captures/<client>/NNN-<dir>-<opcode>.bin, one file per frame,
// where dir is c2s (client to server) or s2c.
package capture
