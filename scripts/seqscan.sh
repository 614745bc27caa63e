#!/usr/bin/env bash
# A cold sequential scan on `strata up` for each compute.read_ahead value
# given (docs/benchmarks.md, "Read-ahead"): starts the cluster of
# configs/local.yaml with the value, makes the table `seqscan` (2.5 million
# rows, 574 MB) the first time, and times two parallel and one serial
# `SELECT count(*)` after the start (the table is larger than
# shared_buffers, so most of it comes through the mount). The cluster is
# stopped again after each value. Run from the repository root after
# `go build -o bin/strata ./cmd/strata`:
#
#   scripts/seqscan.sh 0 64
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 READ_AHEAD..." >&2; exit 2; }
bin/strata down >/dev/null 2>&1 || true
for ra in "$@"; do
	url=$(STRATA_COMPUTE_READ_AHEAD=$ra bin/strata up | tail -1)
	psql "$url" -qAt -c "SELECT 1 FROM pg_class WHERE relname = 'seqscan'" | grep -q 1 || {
		echo "read_ahead=$ra: making the table seqscan (once)"
		psql "$url" -q -c "CREATE TABLE seqscan AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 2500000) g" -c "VACUUM seqscan" -c CHECKPOINT
		bin/strata down >/dev/null
		url=$(STRATA_COMPUTE_READ_AHEAD=$ra bin/strata up | tail -1)
	}
	sleep 15 # autoprewarm loads shared_buffers after a start
	for run in parallel parallel serial; do
		workers=2
		[ $run = serial ] && workers=0
		s=$(date +%s.%N)
		psql "$url" -qAt -c "SET max_parallel_workers_per_gather = $workers" -c "SELECT count(*) FROM seqscan" >/dev/null
		e=$(date +%s.%N)
		awk -v ra="$ra" -v run="$run" -v s="$s" -v e="$e" 'BEGIN { printf "read_ahead=%s %s scan: %.2f s\n", ra, run, e - s }'
	done
	bin/strata compute waits | grep -E '^read-ahead' || true
	bin/strata down >/dev/null
done
