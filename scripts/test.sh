#!/usr/bin/env bash
# The test command of the README: installs what the tests need on a fresh
# Debian 12 machine (as root), starts nothing by hand (the tests start their
# own Postgres servers and emulators on free loopback ports), and runs every
# Go test and, beside them, a one-minute (700,000 runs) fuzz run of the WAL
# decoder.
#
#   scripts/test.sh            the default run (what .ci/run runs)
#   STRATA_LONG_TESTS=1 scripts/test.sh   also the long soak tests
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo /root/go)/bin:$PATH
export PATH=$(go env GOPATH)/bin:$PATH

scripts/install-deps.sh --tests
scripts/emulators/install.sh

# No DWARF tables in the test binaries and in the binaries the tests build
# (strata, the plugins): links take about a third less CPU, and the run is
# CPU-bound. Stack traces do not need DWARF; a debugger does (build without
# this to debug). -trimpath keeps the checkout's folder out of what is
# compiled, so the build cache serves a fresh clone in any folder: without
# it a clone in a new folder compiles every package of the module again
# (core/cluster's test binary started 31 s into go test instead of 10).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-ldflags=-w -trimpath"
export STRATA_REQUIRE_EMULATORS=1
export STRATA_REQUIRE_BROWSER=1
start=$(date +%s)
phase() { echo "== $* ($(( $(date +%s) - start ))s in)"; }

# Where the tests keep their files (STRATA_TEST_TMP): "ram" puts TMPDIR on
# the tmpfs /dev/shm (every test's folders, clusters, object stores and the
# build's work folders), "disk" leaves TMPDIR as it is, and "auto" (the
# default) takes ram when /dev/shm is a tmpfs with 8 GiB free and the machine
# has 8 GiB of memory available. On disk, ext4's journal, writeback and
# fsyncs were 15-20% of the agent tests' CPU on the current machine (a VM
# where every block request is costly): docs/benchmarks.md, "The test
# run". No test depends on a disk surviving a power cut (kill -9 keeps the
# page cache); STRATA_TEST_TMP=disk runs them on the disk.
testtmp=
case "${STRATA_TEST_TMP:-auto}" in
ram | auto)
	shmfree=$(df --output=avail -k /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
	memfree=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
	if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ "${shmfree:-0}" -ge $((8 << 20)) ] && [ "${memfree:-0}" -ge $((8 << 20)) ]; then
		testtmp=$(mktemp -d /dev/shm/strata-test.XXXXXX)
		chmod 1777 "$testtmp" # Postgres runs as its own user, as under /tmp
		export TMPDIR=$testtmp
	elif [ "${STRATA_TEST_TMP:-auto}" = ram ]; then
		echo "STRATA_TEST_TMP=ram: /dev/shm is not a tmpfs with 8 GiB free, or the machine has less than 8 GiB of memory available" >&2
		exit 1
	fi
	;;
disk) ;;
*)
	echo "STRATA_TEST_TMP=$STRATA_TEST_TMP: want auto, ram or disk" >&2
	exit 1
	;;
esac
phase "test files under ${TMPDIR:-/tmp}"

phase "go vet"
go vet ./...

# The WAL decoder must survive a minute of fuzzing (issue 4): 700,000 runs
# take about 60 s on two cores. The budget is a count, not a duration: Go 1.26's
# fuzz coordinator can fail a run that ends by its -fuzztime deadline with a
# bare "context deadline exceeded" and no crashing input (golang/go#75804,
# fixed in Go 1.27); a count has no deadline to race. Go's fuzzer would spend
# the budget minimizing one input without -fuzzminimizetime.
# It runs beside the tests at nice 5, stopped with the script. It is a
# session of its own (setsid), and where the kernel schedules each session
# as a group (autogroup) a group gets its share of the CPUs by the
# session's own nice, whatever the nice of its processes, so that is set
# to 5 too: about a quarter of the CPUs until it is done (six minutes in
# a CI run). Not lower: Go's fuzz worker panics when one input takes 10 s of
# wall time, and at nice 19 a CPU-bound test run starved it that long (a
# CI run failed "fuzzing process hung or terminated unexpectedly" on an
# input that passes in microseconds). It costs the same CPU at any nice;
# the nice decides only when.
fuzzlog=$(mktemp)
phase "fuzz FuzzDecode for 700000 runs, in the background (nice 5; its output follows the tests)"
setsid bash -c 'echo 5 >/proc/self/autogroup 2>/dev/null; exec nice -n 5 go test -run "^$" -fuzz "^FuzzDecode$" -fuzztime 700000x -fuzzminimizetime 2s ./plugins/redo/postgres/wal' >"$fuzzlog" 2>&1 &
fuzzpid=$!
# At exit, whatever happened: the fuzz run stopped, and the tests' tmpfs
# folder removed (without crossing into a FUSE mount a failed test left).
cleanup() {
	if [ -n "$fuzzpid" ]; then kill -- -"$fuzzpid" 2>/dev/null || true; fi
	if [ -n "$testtmp" ]; then rm -rf --one-file-system "$testtmp" 2>/dev/null || true; fi
}
trap cleanup EXIT

phase "go test"
# The run prints what a plain go test prints, and then its slowest tests
# (internal/testsum); the whole event stream stays in /tmp/strata-test.json.
testsum=$(mktemp -d)/testsum
go build -o "$testsum" ./internal/testsum
# The binaries tests start as child processes (strata, the external object
# store plugins), built once for every package that starts them
# (internal/testbin): a link of strata is about 5 CPU-s.
testbins=$(mktemp -d)
go build -o "$testbins/" ./cmd/strata ./plugins/objectstore/s3/cmd/strata-objectstore-s3 \
	./plugins/objectstore/gcs/cmd/strata-objectstore-gcs ./plugins/objectstore/azure/cmd/strata-objectstore-azure
export STRATA_TEST_BIN_DIR=$testbins
# One initdb per set of arguments for the test servers of internal/pgtest,
# copied with a new system identifier for each (initdb took about 1.4
# CPU-s per server).
pgtemplates=$(mktemp -d)
chmod 755 "$pgtemplates"
export STRATA_TEST_PG_TEMPLATES=$pgtemplates
#
# Three test binaries run at once on the two cores: the whole-cluster tests
# spend about half their time waiting on their servers (core/cluster alone
# keeps 48% of two cores busy; its longest tests run two at a time). The
# packages run longest first, as go test starts them in the order given:
# a long one that started late would run alone at the end (in the order
# of their times at aa4f0eb, the rest after them).
set +e
go test -json -p 3 -timeout 20m -count=1 \
	./core/cluster ./cmd/strata ./core/compute/agent ./core/safekeeper ./core/objstore ./core/pageserver/e2e \
	./core/compute/fusefs ./core/bench/runner ./plugins/objectstore/azure ./core/compute/redobackend \
	./plugins/redo/postgres ./core/bench/target ./core/bench/tpcc ./core/compute/psbackend ./core/pluginhost \
	./plugins/objectstore/gcs ./core/pageserver ./core/pageserver/timeline ./core/pageserver/metamorphic \
	./plugins/objectstore/s3 ./core/pageserver/walingest ./core/bench/collect ./core/compute/walpos \
	./... 2>&1 | tee /tmp/strata-test.json | "$testsum" | tee /tmp/strata-test.log
testrc=$?
set -e
rm -rf "$(dirname "$testsum")" "$testbins" "$pgtemplates"

phase "waiting for the fuzz run"
fuzzrc=0
wait "$fuzzpid" || fuzzrc=$?
fuzzpid=
# Its progress lines (one each 3 s of a run as long as the tests) but the
# last are left out.
awk '/^fuzz: elapsed: .*execs:/ {last=$0; next} {if (last!="") {print last; last=""} print} END {if (last!="") print last}' "$fuzzlog"
rm -f "$fuzzlog"
echo "== done in $(( $(date +%s) - start ))s"
if [ "$testrc" -ne 0 ] || [ "$fuzzrc" -ne 0 ]; then
	echo "FAILED: go test exit $testrc, fuzz exit $fuzzrc" >&2
	exit 1
fi
