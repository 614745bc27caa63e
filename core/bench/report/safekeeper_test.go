package report

import (
	"math"
	"testing"

	"github.com/stratadb/strata/core/bench/results"
)

// skSeries adds one safekeeper's flush histogram deltas to m: n flushes,
// of which slow took 8-16 ms and the rest under 0.1 ms.
func skSeries(m map[string]float64, prefix, id string, n, slow float64) {
	h := prefix + skFlush
	l := `safekeeper="` + id + `"`
	m[h+"_count{"+l+"}"] = n
	m[h+"_sum{"+l+"}"] = 1
	m[h+`_bucket{`+l+`,le="0.0001"}`] = n - slow
	m[h+`_bucket{`+l+`,le="0.008"}`] = n - slow
	m[h+`_bucket{`+l+`,le="0.016"}`] = n
	m[h+`_bucket{`+l+`,le="+Inf"}`] = n
}

func TestSafekeeperDerived(t *testing.T) {
	m := map[string]float64{"new_orders": 1000, "xacts": 2500}
	skSeries(m, "strata.sk1.", "sk1", 600, 0)
	skSeries(m, "strata.sk2.", "sk2", 500, 0)
	skSeries(m, "strata.sk3.", "sk3", 700, 20) // 20 of the 1,800: over 1%
	m["strata.pageserver.strata_pageserver_getpage_total"] = 3
	d := Derived(&results.Run{Metrics: m})
	want := map[string]float64{SafekeeperFlushes: 600, SafekeeperFlushesPerNO: 0.6, SafekeeperFlushesPerXact: 0.24}
	for k, v := range want {
		if math.Abs(d[k]-v) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, d[k], v)
		}
	}
	// The 99th percentile of all 1,800 flushes is the 18th slowest: in
	// sk3's 8-16 ms bucket.
	if p := d[SafekeeperFlushP99]; p <= 8 || p > 16 {
		t.Errorf("%s = %v ms, want within 8-16", SafekeeperFlushP99, p)
	}

	// Without the slow ones the percentile stays under 0.1 ms.
	skSeries(m, "strata.sk3.", "sk3", 700, 0)
	if p := Derived(&results.Run{Metrics: m})[SafekeeperFlushP99]; p > 0.1 {
		t.Errorf("%s = %v ms with no slow flush, want at most 0.1", SafekeeperFlushP99, p)
	}

	// A metrics_url pointing at one safekeeper; pgbench has no New-Orders.
	one := map[string]float64{"xacts": 100}
	skSeries(one, "strata.", "sk1", 50, 0)
	d = Derived(&results.Run{Metrics: one})
	if d[SafekeeperFlushes] != 50 || d[SafekeeperFlushesPerXact] != 0.5 {
		t.Errorf("one safekeeper: %v", d)
	}
	if _, ok := d[SafekeeperFlushesPerNO]; ok {
		t.Errorf("flushes per New-Order without New-Orders: %v", d)
	}

	// Stock targets have none of these figures.
	d = Derived(&results.Run{Metrics: map[string]float64{"new_orders": 5}})
	for _, k := range []string{SafekeeperFlushes, SafekeeperFlushesPerNO, SafekeeperFlushP99} {
		if _, ok := d[k]; ok {
			t.Errorf("%s present without safekeeper series", k)
		}
	}
}
