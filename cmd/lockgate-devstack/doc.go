// Command lockgate-devstack runs a complete lockgate on one machine for
// development: an embedded FerretDB (SQLite) as the upstream and the
// gateway in front of it. It prints the connection string to give an application and the admin
// URL, and runs until its context ends.
//
// From a config file it takes the lockstore, policy, log and adminAuth
// sections only, and reloads the policy on SIGHUP and file changes:
// the upstream is always the embedded one. It is a development tool and
// must never be what production runs (that is cmd/proxy, which stays free
// of FerretDB). Users start it with `go run ./cmd/devstack`, a small
// launcher that builds this command with visible progress and then runs
// it; running it directly works too.
package main
