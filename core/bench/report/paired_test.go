package report

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/bench/results"
)

func pairRun(id int64, target, cell string, repeat int, nopm, p95 float64, status string) *results.Run {
	return &results.Run{ID: id, Matrix: "m", Target: target, Label: target + " " + cell, Repeat: repeat,
		NOPM: nopm, P95: p95, Status: status}
}

func TestPairs(t *testing.T) {
	const c16, c8 = "full_page_writes=off wh=4 vus=16", "full_page_writes=off wh=4 vus=8"
	runs := []*results.Run{
		pairRun(1, "stock-sync", c16, 1, 40000, 16, "ok"),
		pairRun(2, "strata", c16, 1, 36000, 21, "ok"),
		pairRun(3, "stock-sync", c16, 2, 50000, 17, "ok"),
		pairRun(4, "strata", c16, 2, 40000, 22, "ok"),
		pairRun(5, "strata", c16, 3, 41000, 20, "ok"),        // its baseline failed
		pairRun(6, "stock-sync", c16, 3, 1000, 90, "failed"), // not a baseline
		pairRun(7, "stock-sync", c8, 1, 30000, 9, "ok"),
		pairRun(8, "strata", c8, 1, 33000, 10, "ok"),
		pairRun(9, "strata", c8, 2, 0, 0, "interrupted"), // left out
	}
	// Another matrix's run of the same configuration and repeat is no pair.
	other := pairRun(10, "strata", c8, 1, 1, 1, "ok")
	other.Matrix = "n"
	runs = append(runs, other)

	groups, unpaired := Pairs(runs, "stock-sync")
	if len(groups) != 2 || groups[0].Cell != c16 || groups[1].Cell != c8 {
		t.Fatalf("groups %+v, want the 16-VU and the 8-VU cells of strata", groups)
	}
	if len(unpaired) != 2 || unpaired[0].ID != 5 || unpaired[1].ID != 10 {
		t.Fatalf("unpaired %v, want runs 5 and 10", unpaired)
	}
	g := groups[0]
	if len(g.Pairs) != 2 || g.Pairs[0].Base.ID != 1 || g.Pairs[1].Base.ID != 3 {
		t.Fatalf("pairs of the 16-VU cell: %+v", g.Pairs)
	}
	mean, lo, hi, geo := g.Summary()
	// Ratios 0.9 and 0.8: sd 0.0707, standard error 0.05, t(1) 12.706.
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-3 }
	if !near(mean, 0.85) || !near(lo, 0.85-0.6353) || !near(hi, 0.85+0.6353) || !near(geo, math.Sqrt(0.72)) {
		t.Fatalf("summary %v %v %v %v", mean, lo, hi, geo)
	}
	// Ratios 0.2 and 1.8: the t interval reaches below zero; no ratio can.
	wide := PairGroup{Pairs: []Pair{
		{Run: pairRun(20, "strata", c16, 1, 200, 1, "ok"), Base: pairRun(21, "stock-sync", c16, 1, 1000, 1, "ok")},
		{Run: pairRun(22, "strata", c16, 1, 1800, 1, "ok"), Base: pairRun(23, "stock-sync", c16, 1, 1000, 1, "ok")},
	}}
	if m, lo, hi, _ := wide.Summary(); !near(m, 1) || lo != 0 || !near(hi, 1+12.706*0.8) {
		t.Fatalf("wide summary %v %v-%v, want 1 and 0-%v", m, lo, hi, 1+12.706*0.8)
	}
	if _, lo, _, _ := groups[1].Summary(); !math.IsNaN(lo) {
		t.Fatalf("one pair has a confidence interval: %v", lo)
	}

	var buf bytes.Buffer
	if err := ComparePaired(&buf, runs, "stock-sync"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"0.90 0.80", "0.85x", "0.21-1.49x", "21.0-22.0", "16.0-17.0", "1.10x",
		"run #5 (strata " + c16 + ", repeat 3): no stock-sync run"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if err := ComparePaired(&buf, runs, "stock"); err == nil {
		t.Error("no error for a baseline that has no runs")
	}
}

// TestPairsSameMatrixTwice: a matrix run twice into one results database
// (ids and repeats start again) pairs each run with the baseline run of its
// own pass, the one nearest in time, not the last one stored.
func TestPairsSameMatrixTwice(t *testing.T) {
	const c = "full_page_writes=off wh=4 vus=16"
	t0 := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	at := func(r *results.Run, min int) *results.Run {
		r.StartedAt = t0.Add(time.Duration(min) * time.Minute)
		return r
	}
	runs := []*results.Run{
		at(pairRun(1, "stock-sync", c, 1, 40000, 16, "ok"), 0),
		at(pairRun(2, "strata", c, 1, 36000, 21, "ok"), 2),
		at(pairRun(3, "stock-sync", c, 2, 50000, 17, "ok"), 4),
		at(pairRun(4, "strata", c, 2, 40000, 22, "ok"), 6),
		// The second pass, half an hour later; its strata run ran first.
		at(pairRun(5, "strata", c, 1, 30000, 25, "ok"), 30),
		at(pairRun(6, "stock-sync", c, 1, 20000, 18, "ok"), 32),
		at(pairRun(7, "stock-sync", c, 2, 60000, 15, "ok"), 34),
		at(pairRun(8, "strata", c, 2, 30000, 24, "ok"), 36),
	}
	groups, unpaired := Pairs(runs, "stock-sync")
	if len(groups) != 1 || len(unpaired) != 0 || len(groups[0].Pairs) != 4 {
		t.Fatalf("groups %+v, unpaired %v", groups, unpaired)
	}
	want := map[int64]int64{2: 1, 4: 3, 5: 6, 8: 7}
	for _, p := range groups[0].Pairs {
		if want[p.Run.ID] != p.Base.ID {
			t.Errorf("run %d paired with baseline run %d, want %d", p.Run.ID, p.Base.ID, want[p.Run.ID])
		}
	}
}
