package report

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stratadb/strata/core/bench/results"
)

// Pair is one run of a target beside the baseline's run of the same
// matrix, configuration and repeat (targets that alternate in a matrix
// run side by side in time, so a pair shares the machine's state).
type Pair struct {
	Run, Base *results.Run
}

// Ratio is the run's throughput over the baseline's (NOPM, or TPM for
// pgbench).
func (p Pair) Ratio() float64 {
	a, b := throughput(p.Run), throughput(p.Base)
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

func throughput(r *results.Run) float64 {
	if r.NOPM > 0 {
		return r.NOPM
	}
	return r.TPM
}

// cell is a run's configuration without its target: what its pair must
// share, with the matrix.
func cell(r *results.Run) string {
	return strings.TrimPrefix(r.Label, r.Target+" ")
}

// PairGroup is every pair of one target in one configuration.
type PairGroup struct {
	Target, Cell string
	Pairs        []Pair
}

// Summary is the mean of the ratios, its 95% confidence interval (t
// distribution; NaN for a single pair; a lower bound below zero, which
// two scattered pairs can give, is 0: no ratio is negative) and the
// geometric mean.
func (g PairGroup) Summary() (mean, lo, hi, geo float64) {
	n := float64(len(g.Pairs))
	var sum, logSum float64
	for _, p := range g.Pairs {
		sum += p.Ratio()
		logSum += math.Log(p.Ratio())
	}
	mean, geo = sum/n, math.Exp(logSum/n)
	if len(g.Pairs) < 2 {
		return mean, math.NaN(), math.NaN(), geo
	}
	var ss float64
	for _, p := range g.Pairs {
		ss += (p.Ratio() - mean) * (p.Ratio() - mean)
	}
	half := tQuantile975(len(g.Pairs)-1) * math.Sqrt(ss/(n-1)/n)
	return mean, max(mean-half, 0), mean + half, geo
}

// tQuantile975 is the 97.5th percentile of Student's t distribution with
// df degrees of freedom.
func tQuantile975(df int) float64 {
	t := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df >= 1 && df <= len(t) {
		return t[df-1]
	}
	return 1.960
}

// Pairs matches each completed run of a target other than baseline with
// the baseline's completed run of the same matrix, configuration and
// repeat, grouped by target and configuration (sorted). unpaired are the
// runs that have no such baseline run. When a matrix ran more than once
// into the same results database, a run pairs with the baseline run that
// started nearest to it in time: the one of its own pass.
func Pairs(runs []*results.Run, baseline string) (groups []PairGroup, unpaired []*results.Run) {
	type key struct {
		matrix, cell string
		repeat       int
	}
	base := map[key][]*results.Run{}
	for _, r := range runs {
		if r.Target == baseline && r.Status == "ok" && throughput(r) > 0 {
			k := key{r.Matrix, cell(r), r.Repeat}
			base[k] = append(base[k], r)
		}
	}
	byGroup := map[[2]string]*PairGroup{}
	for _, r := range runs {
		if r.Target == baseline || r.Status != "ok" {
			continue
		}
		b := nearest(r, base[key{r.Matrix, cell(r), r.Repeat}])
		if b == nil {
			unpaired = append(unpaired, r)
			continue
		}
		k := [2]string{r.Target, cell(r)}
		g := byGroup[k]
		if g == nil {
			g = &PairGroup{Target: r.Target, Cell: cell(r)}
			byGroup[k] = g
		}
		g.Pairs = append(g.Pairs, Pair{Run: r, Base: b})
	}
	for _, g := range byGroup {
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(i, j int) bool {
		if groups[i].Target != groups[j].Target {
			return groups[i].Target < groups[j].Target
		}
		return groups[i].Cell < groups[j].Cell
	})
	return groups, unpaired
}

// nearest returns the candidate that started nearest in time to r (the
// nearest id on a tie), or nil when there is none.
func nearest(r *results.Run, candidates []*results.Run) *results.Run {
	var best *results.Run
	var bestDT time.Duration
	var bestDID int64
	for _, c := range candidates {
		dt, did := r.StartedAt.Sub(c.StartedAt).Abs(), r.ID-c.ID
		if did < 0 {
			did = -did
		}
		if best == nil || dt < bestDT || (dt == bestDT && did < bestDID) {
			best, bestDT, bestDID = c, dt, did
		}
	}
	return best
}

// ComparePaired writes, for each target and configuration, its runs'
// throughput as ratios to the baseline's run of the same matrix,
// configuration and repeat: each ratio, their mean with its 95% confidence
// interval, the geometric mean, and the p95 latencies of both sides.
func ComparePaired(w io.Writer, runs []*results.Run, baseline string) error {
	groups, unpaired := Pairs(runs, baseline)
	if len(groups) == 0 {
		return fmt.Errorf("bench compare: no run pairs with baseline %q (same matrix, configuration and repeat, status ok)", baseline)
	}
	fmt.Fprintf(w, "\nPaired against %s (the same matrix, configuration and repeat):\n", baseline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "target\tconfiguration\tpairs\tratios\tmean\t95%% CI\tgeo mean\tp95 ms\t%s p95 ms\n", baseline)
	for _, g := range groups {
		var ratios []string
		var p95, bp95 []float64
		for _, p := range g.Pairs {
			ratios = append(ratios, fmt.Sprintf("%.2f", p.Ratio()))
			p95, bp95 = append(p95, p.Run.P95), append(bp95, p.Base.P95)
		}
		mean, lo, hi, geo := g.Summary()
		ci := "–"
		if !math.IsNaN(lo) {
			ci = fmt.Sprintf("%.2f-%.2fx", lo, hi)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2fx\t%s\t%.2fx\t%s\t%s\n", g.Target, g.Cell, len(g.Pairs),
			strings.Join(ratios, " "), mean, ci, geo, span(p95), span(bp95))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range unpaired {
		fmt.Fprintf(w, "run #%d (%s, repeat %d): no %s run of the same matrix, configuration and repeat\n", r.ID, r.Label, r.Repeat, baseline)
	}
	return nil
}

// span renders the range of vs, "a-b" (or "a" when all are equal).
func span(vs []float64) string {
	lo, hi := vs[0], vs[0]
	for _, v := range vs {
		lo, hi = min(lo, v), max(hi, v)
	}
	if fmt.Sprintf("%.1f", lo) == fmt.Sprintf("%.1f", hi) {
		return fmt.Sprintf("%.1f", lo)
	}
	return fmt.Sprintf("%.1f-%.1f", lo, hi)
}
