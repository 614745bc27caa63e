// Package report turns stored strata bench runs into something to read: a
// self-contained HTML page (inline SVG charts, no scripts, no network) and
// PNG plots (gonum/plot) that put configurations side by side: throughput
// and p95 latency over virtual users, the wait-event profile by number of
// users, WAL per transaction and full-page-image share, cache hit rates.
// Repeats are summarized as median and range; a configuration counts only
// when its p95 is within the latency rule; runs where other processes, or
// the hypervisor's steal, took more than the noise share of the machine
// (runner.CPUNoisePct) are flagged.
package report

import (
	"math"
	"sort"
	"strings"

	"github.com/stratadb/strata/core/bench/results"
)

// Stat is the median and range of one figure over repeats.
type Stat struct {
	Median, Min, Max float64
	N                int
}

func stat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Point is one configuration (a series at a number of virtual users),
// aggregated over its repeats.
type Point struct {
	Series string
	VUs    int
	Runs   []*results.Run
	// Throughput is NOPM (tpcc) or TPS (pgbench).
	Throughput, TPM, P95, WALPerTx, FPIShare, HitRatio, OtherCPU, StealCPU, PingP95 Stat
	// Pageserver figures of strata targets (see Derived).
	GetPageP99, DeltasPerGetPage, PageserverCPUPct Stat
	// Compute agent figures of strata targets (see Derived): its cache
	// tier's hit share and the time spent waiting for LFC locks.
	ComputeHitPct, LFCLockWaitSec Stat
	// Waits is the average number of sessions in each wait (samples per
	// sampling round), summed over repeats and divided by them.
	Waits map[string]float64
	// Noisy counts repeats flagged for CPU noise (other processes or the
	// hypervisor's steal above the noise share); Valid is false when the
	// median p95 breaks the latency rule.
	Noisy int
	Valid bool
	// Interrupted or failed repeats.
	Incomplete int
}

// Series is one curve: configurations that differ only in virtual users.
type Series struct {
	Name   string
	Points []*Point
}

// Data is everything a report draws.
type Data struct {
	Title    string
	Workload string // tpcc, pgbench or mixed
	P95Limit float64
	// NoisePct is the share of the machine that other processes or the
	// hypervisor's steal may take before a run counts as noisy.
	NoisePct float64
	Series   []*Series
	Runs     []*results.Run
}

// ThroughputName names the throughput figure.
func (d *Data) ThroughputName() string {
	if d.Workload == "pgbench" {
		return "TPS"
	}
	return "NOPM"
}

// Noisy reports whether other processes or the hypervisor's steal took
// more than pct percent of the machine during the run's window: its
// figures are lower than the machine's, and comparing it with a quiet run
// says more about the host than about the configurations.
func Noisy(r *results.Run, pct float64) bool {
	return r.Metrics["cpu_other_pct"] > pct || r.Metrics["cpu_steal_pct"] > pct
}

// Aggregate groups runs into series and points. p95Limit is in ms.
func Aggregate(title string, runs []*results.Run, p95Limit float64, noisePct float64) *Data {
	d := &Data{Title: title, P95Limit: p95Limit, NoisePct: noisePct, Runs: runs}
	kinds := map[string]bool{}
	bySeries := map[string]map[int]*Point{}
	var order []string
	for _, r := range runs {
		kinds[r.Workload] = true
		m := bySeries[r.Series]
		if m == nil {
			m = map[int]*Point{}
			bySeries[r.Series] = m
			order = append(order, r.Series)
		}
		p := m[r.VUs]
		if p == nil {
			p = &Point{Series: r.Series, VUs: r.VUs, Waits: map[string]float64{}}
			m[r.VUs] = p
		}
		p.Runs = append(p.Runs, r)
	}
	switch {
	case len(kinds) == 1 && kinds["pgbench"]:
		d.Workload = "pgbench"
	case len(kinds) == 1:
		d.Workload = "tpcc"
	default:
		d.Workload = "mixed"
	}
	for _, name := range order {
		s := &Series{Name: name}
		for _, p := range bySeries[name] {
			p.fill(d.Workload, p95Limit, noisePct)
			s.Points = append(s.Points, p)
		}
		sort.Slice(s.Points, func(i, j int) bool { return s.Points[i].VUs < s.Points[j].VUs })
		d.Series = append(d.Series, s)
	}
	return d
}

func (p *Point) fill(workload string, p95Limit, noisePct float64) {
	var thr, tpm, p95, wal, fpi, hit, cpu, steal, ping, gp99, deltas, pscpu, chit, lfclock []float64
	n := 0
	for _, r := range p.Runs {
		if r.Status != "ok" {
			p.Incomplete++
			if r.Status == "failed" {
				continue
			}
		}
		n++
		if r.Workload == "pgbench" {
			thr = append(thr, r.TPM/60)
		} else {
			thr = append(thr, r.NOPM)
		}
		tpm = append(tpm, r.TPM)
		p95 = append(p95, r.P95)
		add := func(dst *[]float64, key string, scale float64) {
			if v, ok := r.Metrics[key]; ok {
				*dst = append(*dst, v*scale)
			}
		}
		if r.Workload == "pgbench" {
			add(&wal, "wal_bytes_per_xact", 1.0/1024)
		} else {
			add(&wal, "wal_bytes_per_new_order", 1.0/1024)
		}
		add(&fpi, "fpi_bytes_share", 100)
		add(&hit, "cache_hit_ratio", 100)
		add(&cpu, "cpu_other_pct", 1)
		add(&steal, "cpu_steal_pct", 1)
		add(&ping, "ping_p95_ms", 1)
		dv := Derived(r)
		for key, dst := range map[string]*[]float64{GetPageP99: &gp99, DeltasPerGetPage: &deltas, PageserverCPUPct: &pscpu, ComputeHitPct: &chit, LFCLockWaitSec: &lfclock} {
			if v, ok := dv[key]; ok {
				*dst = append(*dst, v)
			}
		}
		if Noisy(r, noisePct) {
			p.Noisy++
		}
		if ticks := r.Metrics["wait_ticks"]; ticks > 0 {
			for k, v := range r.Waits {
				p.Waits[k] += float64(v) / ticks
			}
		}
	}
	if n > 0 {
		for k := range p.Waits {
			p.Waits[k] /= float64(n)
		}
	}
	p.Throughput, p.TPM, p.P95 = stat(thr), stat(tpm), stat(p95)
	p.WALPerTx, p.FPIShare, p.HitRatio, p.OtherCPU, p.StealCPU, p.PingP95 = stat(wal), stat(fpi), stat(hit), stat(cpu), stat(steal), stat(ping)
	p.GetPageP99, p.DeltasPerGetPage, p.PageserverCPUPct = stat(gp99), stat(deltas), stat(pscpu)
	p.ComputeHitPct, p.LFCLockWaitSec = stat(chit), stat(lfclock)
	p.Valid = n > 0 && p.P95.Median <= p95Limit
}

// HasPageserver reports whether any point has pageserver figures.
func (d *Data) HasPageserver() bool {
	for _, s := range d.Series {
		for _, p := range s.Points {
			if p.GetPageP99.N+p.DeltasPerGetPage.N+p.PageserverCPUPct.N > 0 {
				return true
			}
		}
	}
	return false
}

// HasCompute reports whether any point has compute agent figures.
func (d *Data) HasCompute() bool {
	for _, s := range d.Series {
		for _, p := range s.Points {
			if p.ComputeHitPct.N+p.LFCLockWaitSec.N > 0 {
				return true
			}
		}
	}
	return false
}

// Best returns the series' highest median throughput among points that
// satisfy the latency rule, or nil.
func (s *Series) Best() *Point {
	var best *Point
	for _, p := range s.Points {
		if p.Valid && (best == nil || p.Throughput.Median > best.Throughput.Median) {
			best = p
		}
	}
	return best
}

// WaitKeys returns the wait events that matter most over all points
// (at most n, by total), and whether others were folded into "other".
func (d *Data) WaitKeys(n int) []string {
	tot := map[string]float64{}
	for _, s := range d.Series {
		for _, p := range s.Points {
			for k, v := range p.Waits {
				if k == "Client:Idle" || strings.HasPrefix(k, "Client:") {
					continue
				}
				tot[k] += v
			}
		}
	}
	keys := make([]string, 0, len(tot))
	for k := range tot {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if tot[keys[i]] != tot[keys[j]] {
			return tot[keys[i]] > tot[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) > n {
		keys = append(keys[:n], "other")
	}
	return keys
}

// WaitStack returns p's average sessions per key (client-side waits left
// out; "other" collects the rest).
func (p *Point) WaitStack(keys []string) []float64 {
	out := make([]float64, len(keys))
	idx := map[string]int{}
	for i, k := range keys {
		idx[k] = i
	}
	for k, v := range p.Waits {
		if strings.HasPrefix(k, "Client:") {
			continue
		}
		if i, ok := idx[k]; ok {
			out[i] += v
		} else if i, ok := idx["other"]; ok {
			out[i] += v
		}
	}
	return out
}
