package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/stratadb/strata/core/bench/results"
)

// compareRows are the figures strata bench compare puts side by side.
var compareRows = []struct {
	name string
	get  func(r *results.Run) string
}{
	{"configuration", func(r *results.Run) string { return r.Label }},
	{"status", func(r *results.Run) string { return r.Status }},
	{"repeat", func(r *results.Run) string { return fmt.Sprint(r.Repeat) }},
	{"started", func(r *results.Run) string { return r.StartedAt.UTC().Format("2006-01-02 15:04") }},
	{"git", func(r *results.Run) string { return r.GitRev }},
	{"window s", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.WindowSec) }},
	{"NOPM", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.NOPM) }},
	{"TPM", func(r *results.Run) string { return fmt.Sprintf("%.0f", r.TPM) }},
	{"p95 ms (NO / pgbench)", func(r *results.Run) string { return fmt.Sprintf("%.2f", r.P95) }},
	{"WAL/NO KB", metric("wal_bytes_per_new_order", 1.0/1024, "%.1f")},
	{"WAL/xact KB", metric("wal_bytes_per_xact", 1.0/1024, "%.1f")},
	{"FPI share %", metric("fpi_bytes_share", 100, "%.1f")},
	{"FPI per record", metric("fpi_per_record", 1, "%.3f")},
	{"cache hit %", metric("cache_hit_ratio", 100, "%.2f")},
	{"ping p95 ms", metric("ping_p95_ms", 1, "%.2f")},
	{"CPU busy %", metric("cpu_busy_pct", 1, "%.0f")},
	{"CPU target %", metric("cpu_target_pct", 1, "%.0f")},
	{"CPU driver %", metric("cpu_driver_pct", 1, "%.0f")},
	{"CPU other %", metric("cpu_other_pct", 1, "%.0f")},
	{"checkpoints", func(r *results.Run) string {
		return fmt.Sprintf("%.0f", r.Metrics["pg.bgwriter.checkpoints_timed"]+r.Metrics["pg.bgwriter.checkpoints_req"])
	}},
	{"top wait", func(r *results.Run) string {
		best, bv := "", int64(0)
		for k, v := range r.Waits {
			if !strings.HasPrefix(k, "Client:") && v > bv {
				best, bv = k, v
			}
		}
		return best
	}},
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
		fmt.Fprint(tw, row.name)
		for _, r := range runs {
			fmt.Fprintf(tw, "\t%s", row.get(r))
		}
		fmt.Fprintln(tw)
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
