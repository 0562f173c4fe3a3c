// Package bench measures what lockgate costs: the same driver workload run
// directly against an upstream, through a plain TCP relay that parses
// nothing, and through the lockgate proxy, interleaved in one run so that
// the ratios between the legs survive a noisy machine (Run). Two more
// families use the full gateway: the cost of enforcement, an _id-pinned
// update under held locks against the same update on an unprotected
// collection (RunEnforce), and the lock commands' throughput and handoff
// latency on one gateway and across two, against a client that retries
// every 100 ms (RunLocks).
//
// Everything runs in one process: the Go driver clients, the relay, the
// proxy and either upstream (the embedded FerretDB, or an instant upstream
// that answers from memory so that the proxy's own cost is visible). The
// figures are for comparing legs within one run, never absolute times to
// assert on; the package's tests check that the harness works and that its
// answers are right, not how fast anything is.
//
// Run it with `go run ./bench/cmd/lockgate-bench` (see docs/BENCHMARKS.md).
package bench
