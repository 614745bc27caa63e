package report

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/stratadb/strata/core/bench/results"
)

// Pageserver figures derived from a run's scraped Prometheus deltas (see
// Derived). A strata target without metrics_url stores its pageserver's
// series as "strata.pageserver.<series>"; a metrics_url that points at a
// pageserver stores them as "strata.<series>".
const (
	// GetPageP99 is the 99th percentile of the pageserver's GetPage
	// latency over the window, in ms.
	GetPageP99 = "getpage_p99_ms"
	// DeltasPerGetPage is the mean number of WAL records applied per
	// uncached page rebuild (strata_pageserver_redo_deltas_per_read).
	DeltasPerGetPage = "deltas_per_getpage"
	// PageserverCPU is the pageserver's CPU time over the window, in
	// seconds; PageserverCPUPct the same as a share of one core.
	PageserverCPU    = "pageserver_cpu_s"
	PageserverCPUPct = "pageserver_cpu_pct"
	// GetPages is the number of pages the pageserver served with GetPage
	// over the window (0: the compute's caches answered every read, and
	// there is no GetPage p99).
	GetPages = "getpages"
)

// Derived computes the pageserver, compute agent and safekeeper figures of
// r from its stored metric deltas; a figure whose series are missing is
// left out.
func Derived(r *results.Run) map[string]float64 {
	out := map[string]float64{}
	computeDerived(r, out)
	safekeeperDerived(r, out)
	prefix, ok := seriesPrefix(r.Metrics, "pageserver", "strata_pageserver_")
	if !ok {
		return out
	}
	if n, ok := r.Metrics[prefix+"strata_pageserver_getpage_total"]; ok {
		out[GetPages] = n
	}
	if q, ok := HistogramQuantile(0.99, Buckets(r.Metrics, prefix+"strata_pageserver_getpage_seconds")); ok {
		out[GetPageP99] = q * 1000
	}
	if n := r.Metrics[prefix+"strata_pageserver_redo_deltas_per_read_count"]; n > 0 {
		out[DeltasPerGetPage] = r.Metrics[prefix+"strata_pageserver_redo_deltas_per_read_sum"] / n
	}
	if cpu, ok := r.Metrics[prefix+"process_cpu_seconds_total"]; ok {
		out[PageserverCPU] = cpu
		if r.WindowSec > 0 {
			out[PageserverCPUPct] = cpu / r.WindowSec * 100
		}
	}
	return out
}

// seriesPrefix finds where a run stored one process's series: under
// "strata.<process>." when the bench scraped a strata target's processes
// itself, under "strata." when the target's metrics_url points at that
// process. family is a series name prefix only that process exports.
func seriesPrefix(m map[string]float64, process, family string) (string, bool) {
	for _, p := range []string{"strata." + process + ".", "strata."} {
		if hasSeries(m, p+family) {
			return p, true
		}
	}
	return "", false
}

func hasSeries(m map[string]float64, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// Bucket is one cumulative histogram bucket: observations <= UpperBound.
type Bucket struct {
	UpperBound, Count float64
}

// Buckets collects the buckets of the histograms names (each
// name_bucket{le="..."}) from metrics, sorted by upper bound. Series of
// several names, or with labels other than le, are summed per bound.
func Buckets(metrics map[string]float64, names ...string) []Bucket {
	byLE := map[float64]float64{}
	for k, v := range metrics {
		var rest string
		ok := false
		for _, name := range names {
			if rest, ok = strings.CutPrefix(k, name+"_bucket{"); ok {
				break
			}
		}
		if !ok {
			continue
		}
		_, le, ok := strings.Cut(rest, `le="`)
		if !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		ub, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		byLE[ub] += v
	}
	out := make([]Bucket, 0, len(byLE))
	for ub, c := range byLE {
		out = append(out, Bucket{UpperBound: ub, Count: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UpperBound < out[j].UpperBound })
	return out
}

// HistogramQuantile estimates quantile q (0..1) from cumulative buckets the
// way Prometheus' histogram_quantile does: find the bucket holding rank
// q×total and interpolate linearly inside it (the first bucket starts at
// 0; a rank in the +Inf bucket answers the highest finite bound). It
// reports false without a +Inf bucket or observations.
func HistogramQuantile(q float64, buckets []Bucket) (float64, bool) {
	n := len(buckets)
	if n < 2 || !math.IsInf(buckets[n-1].UpperBound, 1) || q < 0 || q > 1 {
		return 0, false
	}
	// Deltas of separately scraped counters can dip; keep the counts
	// monotonic as Prometheus does.
	cum := make([]float64, n)
	for i, b := range buckets {
		cum[i] = b.Count
		if i > 0 && cum[i] < cum[i-1] {
			cum[i] = cum[i-1]
		}
	}
	total := cum[n-1]
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	b := sort.Search(n, func(i int) bool { return cum[i] >= rank })
	if b == n-1 {
		return buckets[n-2].UpperBound, true
	}
	if b == 0 && buckets[0].UpperBound <= 0 {
		return buckets[0].UpperBound, true
	}
	start, below := 0.0, 0.0
	if b > 0 {
		start, below = buckets[b-1].UpperBound, cum[b-1]
	}
	end, in := buckets[b].UpperBound, cum[b]-below
	if in <= 0 {
		return end, true
	}
	return start + (end-start)*(rank-below)/in, true
}
