#!/usr/bin/env bash
# A bulk load on a new cluster, for each strata binary given, in turn
# (docs/benchmarks.md, "Bulk load"): `strata up` from configs/local.yaml
# with its state in a new temporary folder, `pgbench -i -s SCALE`, a
# CHECKPOINT and 15 s for the pageserver to flush, then what the pageserver
# wrote (its /metrics), the compute's FUSE read and write waits and W
# lookups, and the CPU the pageserver and the compute agent used; the
# cluster is stopped and its folder removed after each binary.
# Run from the repository root as root (FUSE), after
# `go build -o bin/strata ./cmd/strata`:
#
#   scripts/bulkload.sh 20                      # bin/strata
#   scripts/bulkload.sh 20 /tmp/old /tmp/new /tmp/old /tmp/new
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 SCALE [STRATA_BINARY...]" >&2; exit 2; }
scale=$1
shift
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(bin/strata)
export PATH=/usr/lib/postgresql/15/bin:$PATH

# cpu PID: the CPU seconds of the process the supervisor PID runs.
cpu() {
	local child
	child=$(ps -o pid= --ppid "$1" | head -1 | tr -d ' ')
	awk '{ printf "%.2f s", ($14 + $15) / 100 }' "/proc/${child:-$1}/stat"
}

for bin in "${bins[@]}"; do
	dir=$(mktemp -d /tmp/strata-bulkload.XXXXXX)
	chmod 755 "$dir"
	export STRATA_CLUSTER_DATA_DIR=$dir STRATA_OBJECTSTORE_FS_ROOT=$dir/objects
	trap '"$bin" down >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
	echo "== $bin (scale $scale)"
	url=$("$bin" up | tail -1)
	pgbench -i -s "$scale" -q "$url" 2>&1 | grep -a '^done in'
	psql "$url" -qAt -c CHECKPOINT
	sleep 15
	addr=$(grep -o '"addr":"[0-9.:]*"' "$dir/pageserver/pageserver.log" | head -1 | cut -d'"' -f4)
	curl -s "http://$addr/metrics" | grep -E '^strata_pageserver_(flushed_bytes|image_bytes|uploaded_bytes|zero_pages)_total' || true
	"$bin" compute waits | grep -E '^ *fuse_(write|read) ' || true
	caddr=$(grep -o '"addr":"[0-9.:]*"' "$dir/compute/compute.log" | head -1 | cut -d'"' -f4)
	curl -s "http://$caddr/metrics" | grep -E '^strata_compute_wal_lookups_total' || true
	st=$("$bin" status)
	echo "pageserver CPU: $(cpu "$(awk '/^pageserver +[0-9]+ +true/ { print $2 }' <<<"$st")")"
	echo "compute agent CPU: $(cpu "$(awk '/^compute +[0-9]+ +true/ { print $2 }' <<<"$st")")"
	"$bin" down >/dev/null
	rm -rf "$dir"
	trap - EXIT
done
