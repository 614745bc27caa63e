package report

import (
	"strings"

	"github.com/stratadb/strata/core/bench/results"
)

// Compute agent figures derived from a run's scraped Prometheus deltas (see
// Derived): what a cache strategy A/B compares. A strata target without
// metrics_url stores the agent's series as "strata.compute.<series>"; a
// metrics_url that points at the agent stores them as "strata.<series>".
const (
	// ComputeHitPct is the share of the compute's page reads (FUSE reads
	// of relation pages that shared_buffers missed) that its cache tier
	// answered, in percent; absent under the shared-buffers strategy,
	// which has no cache tier (its hit and miss counters stay at 0).
	ComputeHitPct = "compute_cache_hit_pct"
	// ComputeGetPages is the number of pages the compute read from the
	// pageserver (its cache tier missed); ComputeGetPageMs their mean
	// wait as the agent saw it, round trip included, in ms.
	ComputeGetPages  = "compute_getpages"
	ComputeGetPageMs = "compute_getpage_mean_ms"
	// LFCLockWaits and LFCLockWaitSec are the contended acquisitions of an
	// LFC partition lock and the time spent waiting for them (the wait
	// accounting's lfc_lock).
	LFCLockWaits   = "lfc_lock_waits"
	LFCLockWaitSec = "lfc_lock_wait_s"
)

// computeDerived adds the compute agent's figures of r to out.
func computeDerived(r *results.Run, out map[string]float64) {
	prefix, ok := seriesPrefix(r.Metrics, "compute", "strata_compute_")
	if !ok {
		return
	}
	hits, hok := r.Metrics[prefix+"strata_compute_cache_hits_total"]
	miss, mok := r.Metrics[prefix+"strata_compute_cache_misses_total"]
	if hok && mok && hits+miss > 0 {
		out[ComputeHitPct] = hits / (hits + miss) * 100
	}
	var n, secs float64
	found := false
	for k, v := range r.Metrics {
		rest, ok := strings.CutPrefix(k, prefix+"strata_compute_fuse_")
		if !ok || !strings.Contains(rest, `op="getpage"`) {
			continue
		}
		switch {
		case strings.HasPrefix(rest, "ops_total{"):
			n += v
			found = true
		case strings.HasPrefix(rest, "seconds_total{"):
			secs += v
		}
	}
	if found {
		out[ComputeGetPages] = n
		if n > 0 {
			out[ComputeGetPageMs] = secs / n * 1000
		}
	}
	if v, ok := r.Metrics[prefix+`strata_wait_events_total{wait="lfc_lock"}`]; ok {
		out[LFCLockWaits] = v
		out[LFCLockWaitSec] = r.Metrics[prefix+`strata_wait_seconds_total{wait="lfc_lock"}`]
	}
}
