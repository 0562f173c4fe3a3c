#!/usr/bin/env bash
# lockgate's test command (README: `bash scripts/test.sh`), also what CI
# runs. On a fresh Debian machine with Go at /usr/local/go and Node.js +
# npm, it installs the real clients the compatibility suites drive
# (pymongo from Debian's packages, the Node.js driver and mongosh from npm),
# then runs: gofmt, the module downloads, go vet (in CI also once from
# empty Go caches), then beside each other go test ./... and, one after
# the other, the race detector on the packages with concurrency (the Go
# client helper among them) and a fuzz smoke run of every fuzz target,
# then alone a short hostile-client load test and a smoke run of the
# enforced-write and audit benchmarks, the packaging and monitoring
# checks. Every failure ends with a "==== FAILED: <step>" line that names
# the step.
#
# With CI set (CI does), a missing client runtime fails the compatibility
# suites instead of skipping them. Installing needs root (or sudo) the first
# time only.
set -Eeuo pipefail
PATH=/usr/local/go/bin:$PATH
export PATH
# Every go command here, and those the tests run (go build of FerretDB's
# process, of lockgate's binaries), builds with -trimpath. Without it a
# package's build cache key holds its directory, so a fresh clone (CI
# clones into a new directory each run) compiled every lockgate package
# again, for go vet, go test, -race and the fuzz smoke's instrumented
# builds, however warm the cache: about 160 s of CPU of the test command
# on 2 cores (docs/TESTING.md, thirteenth round). With it, a clone builds
# from the cache whatever a clone before it built of the same sources.
# The first run on a machine compiles the standard library and the
# modules once more under the new keys.
#
# -pgo=off: `go build ./cmd/proxy` optimizes with the profile in
# cmd/proxy/default.pgo (scripts/pgo.sh), and so would go test and go vet
# of cmd/proxy, which would compile every package the proxy imports a
# second time under that profile: about 3 minutes of CPU on a cold cache,
# and again after each change below the proxy. The profile changes which
# calls are inlined, never what the code does; the tests run the code
# without it, and cmd/proxy's TestDefaultProfileIsCurrent checks that the
# profile still names the code's hot functions.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -pgo=off"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
NODE_COMPAT=tests/compat/node
# Executions per fuzz target in the smoke run. A count, not a duration: Go
# 1.26's fuzzer can end a short timed run with "context deadline exceeded"
# (golang/go#75804). The long runs are in docs/RELIABILITY.md. 5,000 new
# inputs per target, on top of its seed corpus (and any corpus the
# machine's fuzz cache kept), which every run replays first: at 20,000
# the 13 targets took about 83 s of CPU, a third of it guard's
# FuzzIntercept (docs/TESTING.md, seventh round).
FUZZ_EXECS="${FUZZ_EXECS:-5000}"

start_all=$SECONDS
current=""
section_start=$SECONDS
section() {
	if [ -n "$current" ]; then
		printf '==== ok: %s (%ds)\n' "$current" "$((SECONDS - section_start))"
	fi
	current=$1
	section_start=$SECONDS
	printf '\n==== %s\n' "$1"
}
trap 'printf "\n==== FAILED: %s (after %ds)\n" "$current" "$((SECONDS - section_start))" >&2' ERR

# fail ends the run with the section and the reason; a bare `exit 1` would
# skip the ERR trap and leave a reader with no idea what failed.
fail() {
	trap - ERR
	printf '\n==== FAILED: %s (after %ds): %s\n' "$current" "$((SECONDS - section_start))" "$*" >&2
	exit 1
}

# run_vet runs every analyzer but composites, judged by go vet's exit
# status alone: the go command also writes progress ("go: downloading ...")
# to stderr, so its output says nothing about findings. composites is off
# because its only findings are bson.D{{"k", v}}, the Go driver's
# documented idiom for ordered documents.
run_vet() {
	go vet -composites=false ./...
}

# beside runs steps (pairs of a name and a function) at the same time,
# each in a subshell with its output in a file, then prints each step's
# output in the order given, with its own "==== <step>" and
# "==== ok: <step> (<seconds>s)" lines (or "==== FAILED: <step>"), and
# ends the run if any failed. A step function fails as a section does
# (set -e, fail).
beside() {
	if [ -n "$current" ]; then
		printf '==== ok: %s (%ds)\n' "$current" "$((SECONDS - section_start))"
	fi
	current=""
	local dir names=() pids=() i=0 failed=0 name
	dir=$(mktemp -d)
	printf '\n==== beside each other:'
	while [ $# -gt 0 ]; do
		names+=("$1")
		printf ' [%s]' "$1"
		# The step runs in a subshell of its own, waited on, so that set -e
		# holds inside it (a function called as a condition runs without).
		(
			trap - ERR
			start=$SECONDS
			(
				current=$1
				section_start=$SECONDS
				"$2"
			) &
			if wait $!; then rc=0; else rc=$?; fi
			echo $((SECONDS - start)) >"$dir/$i.seconds"
			exit "$rc"
		) >"$dir/$i.log" 2>&1 &
		pids+=($!)
		i=$((i + 1))
		shift 2
	done
	printf '\n'
	for i in "${!names[@]}"; do
		name=${names[$i]}
		if wait "${pids[$i]}"; then
			printf '\n==== %s\n' "$name"
			cat "$dir/$i.log"
			printf '==== ok: %s (%ds)\n' "$name" "$(cat "$dir/$i.seconds")"
		else
			printf '\n==== %s\n' "$name"
			cat "$dir/$i.log"
			printf '\n==== FAILED: %s (after %ds)\n' "$name" "$(cat "$dir/$i.seconds" 2>/dev/null || echo 0)" >&2
			failed=1
		fi
	done
	rm -rf "$dir"
	if [ "$failed" = 1 ]; then
		trap - ERR
		exit 1
	fi
	section_start=$SECONDS
}

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

section "environment"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
go version
node --version
npm --version
nproc

section "install: python3-pymongo (apt)"
if /usr/bin/python3 -c 'import pymongo' 2>/dev/null; then
	echo "already installed"
else
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends python3-pymongo >/dev/null
fi
/usr/bin/python3 -c 'import pymongo; print("pymongo", pymongo.version)'

section "install: chromium (apt), for the operator console test"
# tests/console drives the console in Debian's headless chromium; with CI
# set, a missing browser fails that test instead of skipping it.
if [ -x /usr/bin/chromium ]; then
	echo "already installed"
else
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null || { [ -z "${CI:-}" ] || fail "apt-get install chromium failed"; }
fi
if [ -x /usr/bin/chromium ]; then
	/usr/bin/chromium --version 2>/dev/null
elif [ -n "${CI:-}" ]; then
	fail "/usr/bin/chromium is missing"
fi

section "install: openssl (apt), for the audit trail's key-file test"
# audittrail TestKeyFromOpenSSL reads the Ed25519 key files openssl writes;
# with CI set, a missing openssl fails it instead of skipping it.
if command -v openssl >/dev/null; then
	echo "already installed"
else
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends openssl >/dev/null || fail "apt-get install openssl failed"
fi
openssl version

section "install: Node.js driver and mongosh (npm ci in $NODE_COMPAT)"
# npm ci is skipped when node_modules holds what package-lock.json names:
# the stamp, written after a successful npm ci, is the sha256 of the
# package-lock.json it installed. A fresh clone has no node_modules, a
# changed lock file another hash, and either installs. The check it
# replaces compared modification times, which git sets at checkout: every
# new clone or worktree, and every branch switch that touched the lock
# file, made node_modules look older than it, and npm ci ran each time,
# 17 s on a warm machine (docs/TESTING.md, issue 25).
npm_stamp=$NODE_COMPAT/node_modules/.lockgate-package-lock.sha256
lock_sum=$(sha256sum "$NODE_COMPAT/package-lock.json" | cut -d' ' -f1)
if [ -x "$NODE_COMPAT/node_modules/.bin/mongosh" ] && [ -f "$npm_stamp" ] && [ "$(cat "$npm_stamp")" = "$lock_sum" ]; then
	echo "up to date: node_modules was installed by npm ci from this package-lock.json (sha256 $lock_sum)"
else
	rm -f "$npm_stamp"
	# --ignore-scripts: only optional native add-ons of mongosh have install
	# scripts (kerberos, OS DNS, ssh); the suites need none, and skipping
	# them keeps the install free of a compiler toolchain.
	(cd "$NODE_COMPAT" && npm ci --ignore-scripts --no-audit --no-fund)
	echo "$lock_sum" >"$npm_stamp"
fi
"$NODE_COMPAT/node_modules/.bin/mongosh" --version

section "gofmt"
unformatted=$(git ls-files '*.go' | xargs gofmt -l)
if [ -n "$unformatted" ]; then
	echo "$unformatted" >&2
	fail "gofmt would change the files above (run gofmt -w on them)"
fi

section "go mod download"
# Modules first, so that a fresh machine's downloads are a step of their
# own with their own failure, not noise inside the steps after it.
go mod download
go mod verify

if [ -n "${CI:-}" ] || [ -n "${FRESH_CACHE_CHECK:-}" ]; then
	section "fresh caches: go vet with empty GOMODCACHE and GOCACHE"
	# CI's own machine may have warm caches left by an earlier run, which
	# hid a failure that only a fresh machine shows. This step starts from
	# nothing, so it cannot pass on a warm cache only.
	fresh=$(mktemp -d)
	(
		export GOMODCACHE="$fresh/mod" GOCACHE="$fresh/build" GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw"
		run_vet
	) || fail "go vet failed from empty module and build caches"
	rm -rf "$fresh"
fi

section "go vet ./..."
run_vet || fail "go vet reported the findings above"

# The packages the race detector runs (step "go test -race" below), among
# them the Go client helper, which renews from its own goroutine while
# the caller writes in the same session: the detector checks that they
# never share the driver's Session value. Those of RACE_ONLY run the same
# tests with and without the detector, so they run under it only: running
# them in "go test ./..." too tested nothing more and cost about a minute
# (docs/TESTING.md). A package that scales its tests down under the
# detector (raceEnabled, a race build tag) must also run without it, which
# step_plain enforces. The others, lockstore and guard, run in both, but
# without the detector only their tests that differ under it: step_plain
# sets LOCKGATE_TEST_RACE_COVERED, and their TestMain
# (testkit.OnlyRaceScaled) then runs the tests declared in a race-tagged
# file or reaching raceEnabled through any helper; the rest, run
# unchanged by the detector, cost the plain run 26 to 32 s of CPU for
# nothing (docs/TESTING.md, twelfth round).
# client/lockgate comes last: it ran in a go test -race of its own after
# the others, whose last package had run alone with a slot idle.
RACE_PKGS="./lockstore ./guard/... ./tests ./proxy ./upstream ./gateway ./audittrail ./tests/enforcement ./client/lockgate"
RACE_ONLY="proxy upstream gateway audittrail tests tests/enforcement client/lockgate"
# A package's time-out in go test ./...: under load, with its leases
# scaled (docs/TESTING.md), tests/schemes took 555 s of go's default of
# 10 minutes; twice that still ends a hung package.
PLAIN_TIMEOUT="${PLAIN_TIMEOUT:-20m}"
# The packages go test ./... starts first: go runs packages in the order
# given, and these three take the longest (mostly waiting for leases, the
# upstream and child processes; about 60 to 100 s each on a quiet machine
# since the eighth round of docs/TESTING.md, 95 to 150 s before). Last in
# go list's order, they ran two at a time after everything else, the
# third alone at the end; first, the other packages fill the slot the
# shortest of them frees. tests/reliability comes third: its soak's
# memory check is the most sensitive to load, and started first it ran
# beside the race step's lockstore and guard (its soak failed that way
# once, docs/TESTING.md).
PLAIN_FIRST="tests/schemes tests/schemes/libs tests/reliability"

# go test ./... runs beside one stream of the race step and the fuzz
# smoke (beside), go's default packages at
# a time each. Most of go test ./...'s time is its three longest packages
# waiting (leases running out, child processes), which leaves CPU to the
# other stream. Two schedules of this kind were tried before and not kept
# (docs/TESTING.md): beside the whole race step, go test ./... ran guard
# and lockstore twice at once, and on a loaded machine their lock store
# calls timed out; four packages at a time passed only with the leases of
# tests/schemes scaled for the script's own load. What changed since: the
# race step's FerretDB runs outside the detector (testserver/ferretdb),
# which took most of its CPU away, and the two runs take their packages
# in opposite orders (PLAIN_FIRST, RACE_PKGS), so that guard and
# lockstore run under the detector while go test ./... runs its three
# waiting suites. Each step's output is printed whole when it ends.
step_plain() {
	for pkg in $RACE_ONLY; do
		if grep -lE 'raceEnabled|go:build.*race' "$pkg"/*_test.go >/dev/null 2>&1; then
			fail "$pkg scales its tests under -race; it must run in \"go test ./...\" too (remove it from RACE_ONLY)"
		fi
	done
	local module plain first
	module=$(go list -m)
	first=$(for pkg in $PLAIN_FIRST; do echo "$module/$pkg"; done)
	plain=$(go list ./... | grep -vxF -f <(for pkg in $RACE_ONLY; do echo "$module/$pkg"; done) | grep -vxF -f <(echo "$first"))
	# The suites that scale their leases with the load (testkit.LeaseScale)
	# read it as they start, before the race step beside them loads the
	# machine: a run started on an idle machine read 1 and failed
	# tests/schemes' takeovers and workloads a minute later
	# (docs/TESTING.md, the eleventh box). Beside that step they take
	# at least twice the idle machine's leases.
	# shellcheck disable=SC2086 # one argument per package
	LOCKGATE_TEST_LEASE_SCALE_MIN="${LOCKGATE_TEST_LEASE_SCALE_MIN:-2}" LOCKGATE_TEST_RACE_COVERED=1 go test -count=1 -timeout "$PLAIN_TIMEOUT" $first $plain
}

# The integration suites run here too: the proxy under the race detector
# with real drivers. tests/reliability is left to the plain run: its soak
# and crash tests load the machine so much under the detector that the
# lock store's own time-outs, not lockgate, decide the outcome.
step_race() {
	# shellcheck disable=SC2086 # one argument per package
	LOCKGATE_TEST_FERRETDB=$FERRETDB_BIN go test -count=1 -race $RACE_PKGS
}

# Every fuzz target of every package, found with the test binary's -list,
# so a new target is covered without editing this script. Each package is
# built once, instrumented for fuzzing (go test -c with -fuzz set; which
# target -fuzz names matters only when the binary runs), and that binary
# lists and fuzzes each of its targets, from the package's directory and
# with go test's fuzz cache, as go test -fuzz would run it. go test -fuzz
# per target linked a binary per target and go test -list another per
# package: most of the smoke's time was building (docs/TESTING.md, tenth
# round).
step_fuzz() {
	local fuzzed=0 pkg importpath listed target bin cache
	bin=$(mktemp -d)
	cache=$(go env GOCACHE)/fuzz
	for pkg in $(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' | xargs -n1 dirname | sort -u); do
		importpath=$(go list "./$pkg")
		go test -c -fuzz . -o "$bin/fuzz.test" "./$pkg"
		listed=$(cd "$pkg" && "$bin/fuzz.test" -test.list '^Fuzz')
		for target in $(echo "$listed" | grep '^Fuzz' || true); do
			echo "--- $pkg $target"
			(cd "$pkg" && "$bin/fuzz.test" -test.paniconexit0 -test.timeout 10m -test.fuzzcachedir "$cache/$importpath" \
				-test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "${FUZZ_EXECS}x" -test.parallel 2) 2>&1 | tee "$bin/out"
			# A binary built without the instrumentation still fuzzes,
			# blind, saying so only in this warning.
			if grep -q 'not built with coverage instrumentation' "$bin/out"; then
				fail "$pkg: the test binary fuzzed $target without coverage guidance"
			fi
			fuzzed=$((fuzzed + 1))
		done
	done
	rm -rf "$bin"
	echo "fuzzed $fuzzed targets"
}

# The race step and the fuzz smoke, one after the other: one stream
# beside go test ./..., so that at most two
# packages run under the detector at a time and the fuzzer's two workers,
# which use all the CPU they get, do not start beside the race step and
# the sub-second leases of tests/reliability's first tests.
step_race_fuzz() {
	local start=$SECONDS
	step_race
	printf '==== ok: go test -race (packages with concurrency) (%ds)\n\n' "$((SECONDS - start))"
	start=$SECONDS
	echo "==== fuzz smoke ($FUZZ_EXECS executions per target)"
	step_fuzz
	printf '==== ok: fuzz smoke (%ds)\n' "$((SECONDS - start))"
}

section "the race steps' upstream: go build ./testserver/ferretdb"
# The race steps' embedded FerretDB runs in a process of its own, built
# without the detector (LOCKGATE_TEST_FERRETDB, testserver/embedded): in
# the test binary the detector instrumented FerretDB and SQLite too, which
# are not lockgate's code and were most of the race step's CPU. lockgate's
# code is instrumented as before; it talks to its upstream over TCP either
# way. go test ./... keeps FerretDB in the test process.
ferretdb_dir=$(mktemp -d)
trap 'rm -rf "$ferretdb_dir"' EXIT
FERRETDB_BIN=$ferretdb_dir/ferretdb
go build -o "$FERRETDB_BIN" ./testserver/ferretdb

beside \
	"go test ./... (but the race-only packages: $RACE_ONLY)" step_plain \
	"go test -race (packages with concurrency), then the fuzz smoke" step_race_fuzz

section "hostile load test (short form)"
# Well-behaved lock-write-release clients alone, then beside 1000 idle
# connections, slow-filter floods and pipelined junk lock commands, then
# alone again (docs/RELIABILITY.md). It fails if the gateway stops serving,
# the well-behaved clients complete nothing under attack, or the process
# grows by over 1 GiB; the throughput and p99 ratios are reported, not
# asserted, since a shared 2-core machine makes timings noisy. It runs
# alone, after the steps above, so that its ratios are not theirs.
go run ./bench/cmd/lockgate-bench -families hostile -hostile-short

section "benchmark smoke: the enforced write and the audit trail"
# The benchmarks issue 24 and 25 measure, in a short form that checks what
# they check (an update without the lock refused with LockBusy, every
# acknowledged update in the documents, every trail verified with one
# allow record per write) and prints its ratios without asserting them:
# one round of each cell is no measurement on a shared 2-core machine
# (docs/BENCHMARKS.md has the measured figures and their commands).
go test ./guard -run '^$' -bench 'EnforcedPinnedUpdate' -benchtime 2000x -benchmem
go run ./bench/cmd/lockgate-bench -families enforce,audit -enforce-clients 16 -enforce-rounds 1 -audit-rounds 1 -audit-clients 16

section "client helpers: the Python and Node.js packages build"
# They are tested through client/conformance (go test above); here they
# are packaged as a release would be, offline.
if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get install -y -qq --no-install-recommends python3-pip python3-setuptools python3-wheel >/dev/null || fail "cannot install pip to build client/python"
fi
whl=$(mktemp -d)
/usr/bin/python3 -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$whl" ./client/python
ls "$whl"/lockgate_client-*.whl
# The offline install that docs/CLIENTS.md gives, command for command.
if ! /usr/bin/python3 -m venv --system-site-packages "$whl/.venv" >/dev/null 2>&1; then
	# Debian's python3 makes venvs only with python3-venv.
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get install -y -qq --no-install-recommends python3-venv >/dev/null || fail "cannot install python3-venv for the offline install of client/python"
	rm -rf "$whl/.venv"
	/usr/bin/python3 -m venv --system-site-packages "$whl/.venv"
fi
"$whl/.venv/bin/pip" install --quiet --no-build-isolation --no-index --no-deps ./client/python
(cd "$whl" && .venv/bin/python -c 'import lockgate, pymongo; assert lockgate.__file__.startswith("'"$whl"'/.venv/"), lockgate.__file__; print("offline install:", lockgate.__file__)')
rm -rf "$whl" client/python/build client/python/*.egg-info
(cd client/node && npm pack --dry-run --silent)

section "monitoring assets: promtool check rules / test rules"
# promtool comes with Debian's prometheus package. The Go side of the
# check (every metric a query names is exported) ran in go test above.
if ! command -v promtool >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null || true
fi
if command -v promtool >/dev/null; then
	(cd deploy/monitoring && promtool check rules alerts.yml && promtool test rules alerts_test.yml)
	python3 -m json.tool deploy/monitoring/grafana-dashboard.json >/dev/null
elif [ -n "${CI:-}" ]; then
	fail "promtool is missing (apt-get install prometheus)"
else
	echo "promtool missing: skipped (CI would fail)"
fi

section "packaging: yamllint deploy"
# No Docker engine or cluster here: go test ./deploy (above) checks the
# manifests against lockgate's own configuration; yamllint checks the YAML.
if ! command -v yamllint >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq
	as_root apt-get install -y -qq --no-install-recommends yamllint >/dev/null || true
fi
if command -v yamllint >/dev/null; then
	yamllint -c deploy/.yamllint deploy
elif [ -n "${CI:-}" ]; then
	fail "yamllint is missing (apt-get install yamllint)"
else
	echo "yamllint missing: skipped (CI would fail)"
fi

section "summary"
echo "all checks passed in $((SECONDS - start_all))s"
