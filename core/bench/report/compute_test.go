package report

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/stratadb/strata/core/bench/results"
)

func computeMetrics(prefix string) map[string]float64 {
	return map[string]float64{
		prefix + "strata_compute_cache_hits_total":                              750,
		prefix + "strata_compute_cache_misses_total":                            250,
		prefix + `strata_compute_fuse_ops_total{kind="rel",op="getpage"}`:       200,
		prefix + `strata_compute_fuse_seconds_total{kind="rel",op="getpage"}`:   0.3,
		prefix + `strata_compute_fuse_ops_total{kind="other",op="getpage"}`:     50,
		prefix + `strata_compute_fuse_seconds_total{kind="other",op="getpage"}`: 0.2,
		prefix + `strata_compute_fuse_ops_total{kind="rel",op="read"}`:          999,
		prefix + `strata_wait_events_total{wait="lfc_lock"}`:                    40,
		prefix + `strata_wait_seconds_total{wait="lfc_lock"}`:                   1.5,
		prefix + `strata_wait_events_total{wait="lfc_read"}`:                    7,
	}
}

// TestDerivedCompute: the cache strategy figures come from the agent's
// series, under either prefix; reads that are not GetPages do not count.
func TestDerivedCompute(t *testing.T) {
	for _, prefix := range []string{"strata.compute.", "strata."} {
		d := Derived(&results.Run{WindowSec: 60, Metrics: computeMetrics(prefix)})
		want := map[string]float64{ComputeHitPct: 75, ComputeGetPages: 250, ComputeGetPageMs: 2, LFCLockWaits: 40, LFCLockWaitSec: 1.5}
		for k, w := range want {
			if v, ok := d[k]; !ok || math.Abs(v-w) > 1e-9 {
				t.Errorf("%s: %s = %v (%v), want %v", prefix, k, v, ok, w)
			}
		}
		if _, ok := d[GetPageP99]; ok {
			t.Errorf("%s: a pageserver figure from compute series", prefix)
		}
	}
	// The shared-buffers strategy has no cache tier: its hit and miss
	// counters stay at 0 and there are no lfc_lock series, so neither
	// figure exists; the GetPages still do.
	m := computeMetrics("strata.compute.")
	delete(m, `strata.compute.strata_wait_events_total{wait="lfc_lock"}`)
	delete(m, `strata.compute.strata_wait_seconds_total{wait="lfc_lock"}`)
	m["strata.compute.strata_compute_cache_hits_total"] = 0
	m["strata.compute.strata_compute_cache_misses_total"] = 0
	d := Derived(&results.Run{Metrics: m})
	if _, ok := d[LFCLockWaits]; ok {
		t.Error("lock figures without lfc_lock series")
	}
	if v, ok := d[ComputeHitPct]; ok {
		t.Errorf("hit share %v without a cache tier", v)
	}
	if d[ComputeGetPages] != 250 {
		t.Errorf("GetPages %v without a cache tier, want 250", d[ComputeGetPages])
	}
	// A tier that missed every read: 0%.
	m["strata.compute.strata_compute_cache_misses_total"] = 10
	if v, ok := Derived(&results.Run{Metrics: m})[ComputeHitPct]; !ok || v != 0 {
		t.Errorf("hit share %v (%v) with only misses, want 0", v, ok)
	}
}

func TestCompareShowsComputeFigures(t *testing.T) {
	runs := fakeRuns()[:2]
	var b bytes.Buffer
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "LFC lock") || strings.Contains(b.String(), "compute cache hit") {
		t.Errorf("stock runs show compute rows:\n%s", b.String())
	}
	runs[0].Metrics, runs[0].WindowSec = computeMetrics("strata.compute."), 60
	b.Reset()
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"compute cache hit %", "75.0", "compute GetPages", "250", "compute GetPage mean ms", "2.000", "LFC lock waits", "40", "LFC lock wait s", "1.50"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare output lacks %q:\n%s", want, out)
		}
	}
	var h bytes.Buffer
	if err := WriteHTML(&h, Aggregate("t", runs, 20, 10)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.String(), "<th>LFC lock wait s</th>") || !strings.Contains(h.String(), "<td>75.0</td>") {
		t.Error("the HTML report lacks the compute columns")
	}
}
