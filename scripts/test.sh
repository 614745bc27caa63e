#!/usr/bin/env bash
# The test command of the README: installs what the tests need on a fresh
# Debian 12 machine (as root), starts nothing by hand (the tests start their
# own Postgres servers and emulators on free loopback ports), and runs every
# Go test, then a one-minute (700,000 runs) fuzz run of the WAL decoder.
#
#   scripts/test.sh            the default run (what .ci/run runs)
#   STRATA_LONG_TESTS=1 scripts/test.sh   also the long soak tests
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo /root/go)/bin:$PATH
export PATH=$(go env GOPATH)/bin:$PATH

scripts/install-deps.sh --tests
scripts/emulators/install.sh

export STRATA_REQUIRE_EMULATORS=1
export STRATA_REQUIRE_BROWSER=1
start=$(date +%s)
echo "== go vet"
go vet ./...
echo "== go test"
# The run prints what a plain go test prints, and then its slowest tests
# (internal/testsum); the whole event stream stays in /tmp/strata-test.json.
testsum=$(mktemp -d)/testsum
go build -o "$testsum" ./internal/testsum
go test -json -p 2 -timeout 20m -count=1 ./... 2>&1 | tee /tmp/strata-test.json | "$testsum" | tee /tmp/strata-test.log
# The WAL decoder must survive a minute of fuzzing (issue 4): 700,000 runs
# take about 60 s on two cores. The budget is a count, not a duration: Go 1.26's
# fuzz coordinator can fail a run that ends by its -fuzztime deadline with a
# bare "context deadline exceeded" and no crashing input (golang/go#75804,
# fixed in Go 1.27); a count has no deadline to race. Go's fuzzer would spend
# the budget minimizing one input without -fuzzminimizetime.
echo "== fuzz FuzzDecode for 700000 runs (about 60s)"
go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 700000x -fuzzminimizetime 2s ./plugins/redo/postgres/wal
echo "== done in $(( $(date +%s) - start ))s"
