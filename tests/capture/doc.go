// Package capture records real driver traffic for the wire package's golden
// tests. It has no production code and no tests of its own: the recorder
// is a tool, built only with the "record" tag. Run
//
//	LOCKGATE_NODE_MODULES=$PWD/tests/compat/node/node_modules \
//	  go test -tags record ./tests/capture -run TestRecord -v
//
// to start the embedded FerretDB, relay the Go driver, pymongo and the
// Node.js driver through a recording relay, and rewrite
// wire/testdata/captures/<client>/NNN-<dir>-<opcode>.bin, one file per frame,
// where dir is c2s (client to server) or s2c.
//
// Then print the new summaries for wire's goldenSummaries with
//
//	go test -tags wiredump -run TestDumpCaptures ./wire
package capture
