// Command devstack runs a complete lockgate on one machine for development:
// an embedded FerretDB (SQLite) as the upstream and the gateway in front of
// it (cmd/lockgate-devstack). It prints the connection string to give
// an application and the admin URL, and runs until SIGINT or SIGTERM;
// SIGHUP reloads the policy of the -config file.
//
//	go run ./cmd/devstack [-config FILE] [-listen ADDR] [-admin ADDR] [-data DIR]
//
// This command is a launcher that imports nothing of the project, so that
// `go run` compiles it in a second and it can say what happens next: it
// builds the dev stack with `go build`, reporting the module downloads and
// the count of packages compiled while a first build takes its two
// minutes, then replaces itself with the built program (same arguments,
// same process, so signals reach the dev stack directly). Later runs reuse
// the build cache and start in seconds.
package main
