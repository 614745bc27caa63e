package report

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/stratadb/strata/core/bench/results"
)

// CPUParts are the parts a target's CPU is split into (the keys of
// target.ProcessParts): "postgres" (the postmaster and its backends),
// "receivers" (stock-sync's pg_receivewal), "safekeepers", "pageserver"
// and "agent" (the compute agent, without its Postgres). A run records
// cpu_<part>_pct and cpu_<part>_ms_per_new_order or cpu_<part>_us_per_xact
// for each part its target has.
var CPUParts = []string{"postgres", "receivers", "safekeepers", "pageserver", "agent"}

// PGKinds are the roles a target's Postgres CPU is split into
// (collect.CPU.PGKinds), recorded as cpu_pg_<kind>_pct and per unit of
// work like the parts.
var PGKinds = []string{"backends", "walsenders", "background"}

type compareRow struct {
	name     string
	get      func(r *results.Run) string
	optional bool
}

// wrapRows put each space-separated word of a cell on a line of its own,
// so that a long configuration label ("stock-sync full_page_writes=off
// wh=4 vus=16") does not widen its run's column to the label's length.
var wrapRows = map[string]bool{"configuration": true, "strata config": true}

// compareRows are the figures strata bench compare puts side by side:
// the run's figures, the CPU of each part, then its checkpoints and top
// wait. Rows marked optional are left out when no run has the figure.
var compareRows = slices.Concat(runRows, cpuPartRows(), tailRows)

var runRows = []compareRow{
	{"configuration", func(r *results.Run) string { return r.Label }, false},
	{"strata config", strataConfig, true},
	{"status", func(r *results.Run) string { return r.Status }, false},
	{"repeat", func(r *results.Run) string { return fmt.Sprint(r.Repeat) }, false},
	{"started", func(r *results.Run) string { return r.StartedAt.UTC().Format("2006-01-02 15:04") }, false},
	{"git", func(r *results.Run) string { return r.GitRev }, false},
	{"window s", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.WindowSec) }, false},
	{"NOPM", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.NOPM) }, false},
	{"TPM", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.TPM) }, false},
	{"per 10 s min–max (NOPM / TPM)", spreadRow, true},
	{"p95 ms (NO / pgbench)", func(r *results.Run) string { return fmt.Sprintf("%.2f", r.P95) }, false},
	{"WAL/NO KB", metric("wal_bytes_per_new_order", 1.0/1024, "%.1f"), false},
	{"WAL/xact KB", metric("wal_bytes_per_xact", 1.0/1024, "%.1f"), false},
	{"FPI share %", metric("fpi_bytes_share", 100, "%.1f"), false},
	{"FPI per record", metric("fpi_per_record", 1, "%.3f"), false},
	{"cache hit %", metric("cache_hit_ratio", 100, "%.2f"), false},
	{"GetPages", derived(GetPages, "%.0f"), true},
	{"GetPage p99 ms", derived(GetPageP99, "%.3f"), true},
	{"deltas/GetPage", derived(DeltasPerGetPage, "%.2f"), true},
	{"pageserver CPU s", derived(PageserverCPU, "%.1f"), true},
	{"pageserver CPU %", derived(PageserverCPUPct, "%.0f"), true},
	{"compute cache hit %", derived(ComputeHitPct, "%.1f"), true},
	{"compute GetPages", derived(ComputeGetPages, "%.0f"), true},
	{"compute GetPage mean ms", derived(ComputeGetPageMs, "%.3f"), true},
	{"LFC lock waits", derived(LFCLockWaits, "%.0f"), true},
	{"LFC lock wait s", derived(LFCLockWaitSec, "%.2f"), true},
	{"safekeeper flushes/NO", derived(SafekeeperFlushesPerNO, "%.2f"), true},
	{"safekeeper flushes/xact", derived(SafekeeperFlushesPerXact, "%.2f"), true},
	{"safekeeper flush p99 ms", derived(SafekeeperFlushP99, "%.2f"), true},
	{"ping p95 ms", metric("ping_p95_ms", 1, "%.2f"), false},
	{"CPU busy %", metric("cpu_busy_pct", 1, "%.0f"), false},
	{"CPU target %", metric("cpu_target_pct", 1, "%.0f"), false},
	{"CPU driver %", metric("cpu_driver_pct", 1, "%.0f"), false},
	{"CPU other %", metric("cpu_other_pct", 1, "%.0f"), false},
	{"CPU steal %", metric("cpu_steal_pct", 1, "%.0f"), false},
}

var tailRows = []compareRow{
	{"checkpoint before window s", metric("checkpoint_before_window_seconds", 1, "%.1f"), false},
	{"checkpoints", func(r *results.Run) string {
		return fmt.Sprintf("%.0f", r.Metrics["pg.bgwriter.checkpoints_timed"]+r.Metrics["pg.bgwriter.checkpoints_req"])
	}, false},
	{"top wait", func(r *results.Run) string {
		best, bv := "", int64(0)
		for k, v := range r.Waits {
			if !strings.HasPrefix(k, "Client:") && v > bv {
				best, bv = k, v
			}
		}
		return best
	}, false},
}

// cpuPartRows are each part's share of the machine, then the core time per
// New-Order and per transaction of the target and of each part (optional
// rows: a run has only its target's parts).
func cpuPartRows() []compareRow {
	var out []compareRow
	for _, p := range CPUParts {
		out = append(out, compareRow{"CPU " + p + " %", metric("cpu_"+p+"_pct", 1, "%.0f"), true})
	}
	withTarget := append([]string{"target"}, CPUParts...)
	for _, k := range PGKinds {
		withTarget = append(withTarget, "pg_"+k)
	}
	for _, p := range withTarget {
		out = append(out, compareRow{"CPU ms/NO " + p, metric("cpu_"+p+"_ms_per_new_order", 1, "%.2f"), true})
	}
	for _, p := range withTarget {
		out = append(out, compareRow{"CPU us/xact " + p, metric("cpu_"+p+"_us_per_xact", 1, "%.0f"), true})
	}
	return out
}

// derived formats one of the figures Derived computes.
func derived(key string, f string) func(*results.Run) string {
	return func(r *results.Run) string {
		v, ok := Derived(r)[key]
		if !ok {
			return "–"
		}
		return fmt.Sprintf(f, v)
	}
}

// strataConfig renders the strata config keys of a strata target's run.
func strataConfig(r *results.Run) string {
	var parts []string
	for k, v := range r.Settings {
		if name, ok := strings.CutPrefix(k, results.StrataConfigPrefix); ok {
			parts = append(parts, name+"="+v)
		}
	}
	if len(parts) == 0 {
		return "–"
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func metric(key string, scale float64, f string) func(*results.Run) string {
	return func(r *results.Run) string {
		v, ok := r.Metrics[key]
		if !ok {
			return "–"
		}
		return fmt.Sprintf(f, v*scale)
	}
}

// Compare writes runs side by side as a text table, one column per run.
func Compare(w io.Writer, runs []*results.Run) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "run")
	for _, r := range runs {
		fmt.Fprintf(tw, "\t#%d", r.ID)
	}
	fmt.Fprintln(tw)
	for _, row := range compareRows {
		if row.optional {
			present := false
			for _, r := range runs {
				present = present || row.get(r) != "–"
			}
			if !present {
				continue
			}
		}
		cells := make([][]string, len(runs))
		lines := 1
		for i, r := range runs {
			cells[i] = []string{row.get(r)}
			if wrapRows[row.name] {
				cells[i] = strings.Fields(cells[i][0])
			}
			lines = max(lines, len(cells[i]))
		}
		for l := 0; l < lines; l++ {
			if l == 0 {
				fmt.Fprint(tw, row.name)
			}
			for _, c := range cells {
				cell := ""
				if l < len(c) {
					cell = c[l]
				}
				fmt.Fprintf(tw, "\t%s", cell)
			}
			fmt.Fprintln(tw)
		}
	}
	for _, tx := range []string{"new_order", "payment", "delivery", "stock_level", "order_status", "pgbench"} {
		present := false
		for _, r := range runs {
			for _, l := range r.Latency {
				if l.Tx == tx && l.Count > 0 {
					present = true
				}
			}
		}
		if !present {
			continue
		}
		fmt.Fprintf(tw, "%s p50/p95/p99 ms", tx)
		for _, r := range runs {
			s := "–"
			for _, l := range r.Latency {
				if l.Tx == tx {
					s = fmt.Sprintf("%.2f/%.2f/%.2f", l.P50, l.P95, l.P99)
				}
			}
			fmt.Fprintf(tw, "\t%s", s)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
