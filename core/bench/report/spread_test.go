package report

import (
	"testing"

	"github.com/stratadb/strata/core/bench/results"
)

func series(n int, v func(t int) float64) []results.Point {
	var pts []results.Point
	for t := 1; t <= n; t++ {
		pts = append(pts, results.Point{T: float64(t) + 0.003*float64(t), V: v(t)})
	}
	return pts
}

func TestSpread(t *testing.T) {
	// Two regimes: 40,000 NOPM for 30 s, then 20,000; the last five
	// seconds make a slice that is not whole and is left out (their
	// 90,000 would otherwise be the top).
	two := &results.Run{NOPM: 30000, TimeSeries: map[string][]results.Point{"nopm": series(65, func(t int) float64 {
		switch {
		case t > 60:
			return 90000
		case t > 30:
			return 20000
		}
		return 40000
	})}}
	lo, hi, ok := Spread(two)
	if !ok || lo != 20000 || hi != 40000 {
		t.Fatalf("Spread = %v, %v, %v; want 20000, 40000, true", lo, hi, ok)
	}
	if got, want := spreadRow(two), "20000–40000 (67%)"; got != want {
		t.Fatalf("spreadRow = %q, want %q", got, want)
	}

	// A slice mixing the two is its mean; pgbench's tps is shown per minute.
	pg := &results.Run{TPM: 60 * 150, TimeSeries: map[string][]results.Point{"tps": series(20, func(t int) float64 {
		if t <= 15 {
			return 100
		}
		return 200
	})}}
	lo, hi, ok = Spread(pg)
	if !ok || lo != 6000 || hi != 9000 {
		t.Fatalf("pgbench Spread = %v, %v, %v; want 6000, 9000, true", lo, hi, ok)
	}

	// One whole slice, or none, has no spread to show.
	for _, n := range []int{0, 9, 15} {
		r := &results.Run{NOPM: 1, TimeSeries: map[string][]results.Point{"nopm": series(n, func(int) float64 { return 1 })}}
		if _, _, ok := Spread(r); ok {
			t.Fatalf("%d points: Spread ok, want no spread", n)
		}
		if got := spreadRow(r); got != "–" {
			t.Fatalf("%d points: spreadRow = %q, want –", n, got)
		}
	}
}
