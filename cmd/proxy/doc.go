// Command proxy is lockgate's production binary: it reads the configuration
// (file, then LOCKGATE_* environment, then flags), starts a gateway in
// front of the real MongoDB deployment, and shuts it down gracefully on
// SIGTERM or SIGINT. SIGHUP is reserved for reloading the policy.
//
// It must never link FerretDB, SQLite or testserver/embedded (a test checks
// the dependency graph): the production image talks to a real deployment.
package main
