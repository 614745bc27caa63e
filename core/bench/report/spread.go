package report

import (
	"fmt"
	"math"

	"github.com/stratadb/strata/core/bench/results"
)

// SpreadSlice is the length of the slices of a run's window that Spread
// compares (seconds).
const SpreadSlice = 10

// Spread is the lowest and the highest mean throughput (NOPM, or TPM for
// pgbench) over the whole SpreadSlice-second slices of a run's window,
// from its time series. A wide spread says the run changed pace within
// its window (a noisy host, a checkpoint, a stall): its one figure then
// hides two regimes, and a comparison needs more repeats. ok is false
// when the run has fewer than two whole slices.
func Spread(r *results.Run) (lo, hi float64, ok bool) {
	pts, scale := r.TimeSeries["nopm"], 1.0
	if len(pts) == 0 {
		pts, scale = r.TimeSeries["tps"], 60
	}
	// A point at T covers the interval that ends at T (T drifts a little
	// past whole seconds with the driver's ticks): slice k holds the
	// points whose T rounds into (k*SpreadSlice, (k+1)*SpreadSlice].
	type acc struct {
		sum  float64
		n    int
		last int
	}
	var parts []acc
	for _, p := range pts {
		rt := max(int(math.Round(p.T)), 1)
		k := (rt - 1) / SpreadSlice
		for len(parts) <= k {
			parts = append(parts, acc{})
		}
		parts[k].sum += p.V * scale
		parts[k].n++
		parts[k].last = rt
	}
	whole := 0
	lo, hi = math.Inf(1), math.Inf(-1)
	for k, s := range parts {
		// Every slice but the last is whole (the window went on past it);
		// the last is when its points reach its end.
		if s.n == 0 || (k == len(parts)-1 && s.last < (k+1)*SpreadSlice) {
			continue
		}
		m := s.sum / float64(s.n)
		lo, hi = min(lo, m), max(hi, m)
		whole++
	}
	if whole < 2 {
		return 0, 0, false
	}
	return lo, hi, true
}

// spreadRow formats Spread for strata bench compare: "min–max (x%)",
// x being the range as a share of the run's throughput figure.
func spreadRow(r *results.Run) string {
	lo, hi, ok := Spread(r)
	if !ok {
		return "–"
	}
	mid := throughput(r)
	if mid <= 0 {
		return fmt.Sprintf("%.0f–%.0f", lo, hi)
	}
	return fmt.Sprintf("%.0f–%.0f (%.0f%%)", lo, hi, (hi-lo)/mid*100)
}
