// Package tests holds lockgate's integration and real-client compatibility
// tests. They start the embedded FerretDB upstream (testserver/embedded) in the
// test process, put a lockgate gateway in front of it, and drive both with
// real clients: the Go driver in-process, and pymongo, the Node.js driver and
// mongosh as subprocesses (compat_test.go, scripts under compat/).
//
// The package has no non-test code besides this file. It must never be
// imported by production code.
package tests
