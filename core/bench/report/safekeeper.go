package report

import (
	"sort"
	"strings"

	"github.com/stratadb/strata/core/bench/results"
)

// Safekeeper figures derived from a run's scraped Prometheus deltas. A
// strata target stores each safekeeper's series as "strata.<id>.<series>"
// (strata.sk1., ...); a metrics_url that points at one safekeeper stores
// them as "strata.<series>".
const (
	// SafekeeperFlushes is the mean number of WAL flushes (each a write
	// out of the WAL and the device cache flush that makes it durable) a
	// safekeeper made over the window.
	SafekeeperFlushes = "sk_flushes"
	// SafekeeperFlushesPerNO is SafekeeperFlushes per New-Order (TPROC-C)
	// and SafekeeperFlushesPerXact per transaction: how many commits
	// share a flush, inverted.
	SafekeeperFlushesPerNO   = "sk_flushes_per_new_order"
	SafekeeperFlushesPerXact = "sk_flushes_per_xact"
	// SafekeeperFlushP99 is the 99th percentile of the safekeepers' flush
	// time over the window (all of them together), in ms: the part of a
	// commit's wait that is the safekeepers' disk.
	SafekeeperFlushP99 = "sk_flush_p99_ms"
)

const skFlush = "strata_safekeeper_fsync_seconds"

// safekeeperPrefixes are the prefixes under which r stored a safekeeper's
// series, sorted.
func safekeeperPrefixes(r *results.Run) []string {
	seen := map[string]bool{}
	for k := range r.Metrics {
		if i := strings.Index(k, skFlush+"_count"); i > 0 && strings.HasPrefix(k, "strata.") {
			seen[k[:i]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func safekeeperDerived(r *results.Run, out map[string]float64) {
	prefixes := safekeeperPrefixes(r)
	if len(prefixes) == 0 {
		return
	}
	var flushes float64
	names := make([]string, len(prefixes))
	for i, p := range prefixes {
		names[i] = p + skFlush
		for k, v := range r.Metrics {
			if strings.HasPrefix(k, names[i]+"_count") {
				flushes += v
			}
		}
	}
	mean := flushes / float64(len(prefixes))
	out[SafekeeperFlushes] = mean
	if n := r.Metrics["new_orders"]; n > 0 {
		out[SafekeeperFlushesPerNO] = mean / n
	}
	if n := r.Metrics["xacts"]; n > 0 {
		out[SafekeeperFlushesPerXact] = mean / n
	}
	if q, ok := HistogramQuantile(0.99, Buckets(r.Metrics, names...)); ok {
		out[SafekeeperFlushP99] = q * 1000
	}
}
