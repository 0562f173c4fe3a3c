// Command devstack runs a complete lockgate on one machine for development:
// an embedded FerretDB (SQLite) as the upstream and the gateway in front of
// it. It prints the connection string to give an application and the admin
// URL, and runs until SIGINT or SIGTERM.
//
//	go run ./cmd/devstack [-config FILE] [-listen ADDR] [-admin ADDR] [-data DIR]
//
// From FILE it takes the lockstore, policy and log sections only: the
// upstream is always the embedded one. It is a development tool and must
// never be what production runs (that is cmd/proxy, which stays free of
// FerretDB).
package main
