package report

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/stratadb/strata/core/bench/results"
)

// TestHistogramQuantile checks the interpolation against answers worked
// out by hand (Prometheus' histogram_quantile gives the same): 100
// observations, 10 <= 0.1, 30 <= 0.2, 90 <= 0.4.
func TestHistogramQuantile(t *testing.T) {
	bs := []Bucket{{0.1, 10}, {0.2, 30}, {0.4, 90}, {math.Inf(1), 100}}
	for _, c := range []struct{ q, want float64 }{
		{0.05, 0.05},      // rank 5 in the first bucket, which starts at 0
		{0.10, 0.1},       // rank 10: the first bucket's top
		{0.50, 0.2666667}, // rank 50: 0.2 + 0.2 × 20/60
		{0.90, 0.4},       // rank 90: the last finite bound
		{0.99, 0.4},       // rank 99 lies in +Inf: the highest finite bound
	} {
		got, ok := HistogramQuantile(c.q, bs)
		if !ok || math.Abs(got-c.want) > 1e-6 {
			t.Errorf("q=%v: %v (%v), want %v", c.q, got, ok, c.want)
		}
	}
	if _, ok := HistogramQuantile(0.5, bs[:3]); ok {
		t.Error("a histogram without +Inf gave a quantile")
	}
	if _, ok := HistogramQuantile(0.5, []Bucket{{0.1, 0}, {math.Inf(1), 0}}); ok {
		t.Error("an empty histogram gave a quantile")
	}
}

// psMetrics is a pageserver's scrape deltas as the runner stores them
// under prefix: 1000 GetPages (990 <= 1 ms, 1000 <= 2 ms), 400 page
// rebuilds that applied 1000 deltas, 12 CPU seconds.
func psMetrics(prefix string) map[string]float64 {
	h := prefix + "strata_pageserver_getpage_seconds_bucket"
	return map[string]float64{
		h + `{le="0.0005"}`: 500,
		h + `{le="0.001"}`:  990,
		h + `{le="0.002"}`:  1000,
		h + `{le="+Inf"}`:   1000,
		prefix + "strata_pageserver_getpage_seconds_count":      1000,
		prefix + "strata_pageserver_getpage_total":              1000,
		prefix + "strata_pageserver_redo_deltas_per_read_sum":   1000,
		prefix + "strata_pageserver_redo_deltas_per_read_count": 400,
		prefix + "process_cpu_seconds_total":                    12,
		"wal_bytes_per_new_order":                               9000,
	}
}

func TestDerived(t *testing.T) {
	for _, prefix := range []string{"strata.pageserver.", "strata."} {
		r := &results.Run{WindowSec: 60, Metrics: psMetrics(prefix)}
		d := Derived(r)
		// rank 990 is the top of the le=0.001 bucket: 1 ms.
		want := map[string]float64{GetPages: 1000, GetPageP99: 1, DeltasPerGetPage: 2.5, PageserverCPU: 12, PageserverCPUPct: 20}
		for k, w := range want {
			if v, ok := d[k]; !ok || math.Abs(v-w) > 1e-9 {
				t.Errorf("%s: %s = %v (%v), want %v", prefix, k, v, ok, w)
			}
		}
	}
	// Another process's CPU is not the pageserver's.
	d := Derived(&results.Run{WindowSec: 60, Metrics: map[string]float64{"strata.compute.process_cpu_seconds_total": 5, "strata.process_cpu_seconds_total": 5}})
	if len(d) != 0 {
		t.Errorf("figures without pageserver series: %v", d)
	}
}

func TestCompareShowsPageserverFigures(t *testing.T) {
	runs := fakeRuns()[:2]
	var b bytes.Buffer
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "GetPage p99") || strings.Contains(b.String(), "strata config") {
		t.Errorf("stock runs show pageserver rows:\n%s", b.String())
	}
	runs[0].Metrics, runs[0].WindowSec = psMetrics("strata.pageserver."), 60
	runs[0].Settings = map[string]string{results.StrataConfigPrefix + "storage.pushdown_deltas": "3", "shared_buffers": "128MB"}
	b.Reset()
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"GetPages", "GetPage p99 ms", "1.000", "deltas/GetPage", "2.50", "pageserver CPU %", "20", "strata config", "storage.pushdown_deltas=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare output lacks %q:\n%s", want, out)
		}
	}

	d := Aggregate("t", runs, 20, 10)
	var h bytes.Buffer
	if err := WriteHTML(&h, d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.String(), "<th>deltas/GetPage</th>") || !strings.Contains(h.String(), "<td>2.50</td>") {
		t.Error("the HTML report lacks the pageserver columns")
	}
}
