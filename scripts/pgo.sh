#!/usr/bin/env bash
# Makes cmd/proxy/default.pgo, the CPU profile the Go compiler optimizes
# the proxy with (profile-guided optimization: `go build ./cmd/proxy`
# reads it by itself, as the Dockerfile's build does; docs/BENCHMARKS.md,
# "Issue 25: the twelfth box's profile-guided build").
#
# The profile is of the proxy's own goroutines while lockgate-bench's
# default families run (proxy: reads and writes passed through; enforce:
# enforced and unprotected writes on the instant and the embedded
# upstream; locks: acquire, release and handoffs), from a binary built
# without a profile. The benchmark's clients, its instant upstream and
# FerretDB run in the same process; their samples are dropped, so that
# what the compiler treats as hot is what a proxy runs.
#
# Run it again when the write path changes much (cmd/proxy's
# TestDefaultProfileIsCurrent fails when the profile's hottest functions
# no longer exist): bash scripts/pgo.sh [output file, by default
# cmd/proxy/default.pgo]
set -Eeuo pipefail
PATH=/usr/local/go/bin:$PATH
out=$(realpath -m "${1:-$(dirname "${BASH_SOURCE[0]}")/../cmd/proxy/default.pgo}")
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -trimpath -pgo=off -o "$dir/lockgate-bench" ./bench/cmd/lockgate-bench
# More enforce rounds than by default, fewer of the others: the enforced
# write is the path lockgate adds; plain reads and writes are the most
# common one; lock commands mostly wait on the lock store.
"$dir/lockgate-bench" -families proxy,enforce,locks -rounds 3 -enforce-rounds 20 -locks-rounds 2 \
	-cpuprofile "$dir/cpu.prof" >"$dir/bench.out" 2>&1
# -focus keeps the samples with a frame in the proxy's packages; -ignore
# then drops those of the benchmark's own code (its clients and instant
# upstream) and of FerretDB.
go tool pprof -proto \
	-focus='^github\.com/lockgate/lockgate/(proxy|guard|policy|lockstore|gateway|upstream|wire|audittrail|docid|namespace|mongoerr|admin)[./]' \
	-ignore='^github\.com/lockgate/lockgate/bench[./]|^github\.com/FerretDB/' \
	"$dir/lockgate-bench" "$dir/cpu.prof" >"$out"
echo "$out: $(wc -c <"$out") bytes"
