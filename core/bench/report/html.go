package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/stratadb/strata/core/bench/results"
)

// runLabel is the run's configuration with its strata config keys.
func runLabel(r *results.Run) string {
	if c := strataConfig(r); c != "–" {
		return r.Label + " [" + c + "]"
	}
	return r.Label
}

func (s Stat) text(f string) string {
	if s.N == 0 || math.IsNaN(s.Median) {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmt.Sprintf(f, s.Median)
	}
	return fmt.Sprintf(f+" <span class=\"rng\">["+f+"–"+f+"]</span>", s.Median, s.Min, s.Max)
}

// lines builds one Line per series from a figure of each point.
func (d *Data) lines(fig func(*Point) Stat, hollowInvalid bool) []Line {
	var out []Line
	for _, s := range d.Series {
		l := Line{Name: s.Name}
		for _, p := range s.Points {
			st := fig(p)
			if st.N == 0 {
				continue
			}
			l.Points = append(l.Points, XY{X: float64(p.VUs), Y: st.Median, Lo: st.Min, Hi: st.Max, Hollow: hollowInvalid && !p.Valid})
		}
		out = append(out, l)
	}
	return out
}

// Charts returns the report's SVG charts in order, keyed by id.
func (d *Data) Charts() [][2]string {
	thr := d.ThroughputName()
	tx := "New-Order"
	if d.Workload == "pgbench" {
		tx = "transaction"
	}
	var out [][2]string
	add := func(id, svg string) { out = append(out, [2]string{id, svg}) }
	add("throughput", LineChart("throughput", thr+" vs virtual users (median, range over repeats; hollow: p95 over the limit)",
		"virtual users", thr, d.lines(func(p *Point) Stat { return p.Throughput }, true), 0))
	add("p95", LineChart("p95", "p95 "+tx+" latency (ms) vs virtual users", "virtual users", "p95 ms",
		d.lines(func(p *Point) Stat { return p.P95 }, false), d.P95Limit))
	add("wal", LineChart("wal", "WAL per "+tx+" (KB)", "virtual users", "KB",
		d.lines(func(p *Point) Stat { return p.WALPerTx }, false), 0))
	add("fpi", LineChart("fpi", "Full-page-image share of WAL bytes (%)", "virtual users", "% of WAL bytes",
		d.lines(func(p *Point) Stat { return p.FPIShare }, false), 0))
	add("hit", LineChart("hit", "Shared-buffer cache hit rate (%)", "virtual users", "% hits",
		d.lines(func(p *Point) Stat { return p.HitRatio }, false), 0))
	keys := d.WaitKeys(9)
	for i, s := range d.Series {
		var bars []Bar
		for _, p := range s.Points {
			bars = append(bars, Bar{Label: fmt.Sprintf("%d VU", p.VUs), Values: p.WaitStack(keys)})
		}
		id := fmt.Sprintf("waits-%d", i+1)
		add(id, StackedBars(id, "Wait events by virtual users: "+s.Name, "avg active sessions", keys, bars))
	}
	return out
}

// WriteHTML writes the self-contained report page.
func WriteHTML(w io.Writer, d *Data) error {
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>%s</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.rng{color:#777;font-size:11px}
.bad{color:#b00;font-weight:bold}.warn{color:#a60}.charts{display:flex;flex-wrap:wrap;gap:12px}
.charts svg{border:1px solid #eee}
</style></head><body>`, esc(d.Title))
	fmt.Fprintf(&b, `<h1>%s</h1><p>%d runs. Generated %s. Latency rule: a configuration counts only with p95 ≤ %.0f ms. Runs where other processes, or the hypervisor's steal, took more than %.0f%% of the machine are flagged <span class="warn">noisy</span>.</p>`,
		esc(d.Title), len(d.Runs), time.Now().UTC().Format(time.RFC3339), d.P95Limit, d.NoisePct)

	b.WriteString(`<h2>Best configuration per series (within the latency rule)</h2><table><tr><th class="l">series</th><th>VUs</th><th>` + d.ThroughputName() + `</th><th>p95 ms</th></tr>`)
	for _, s := range d.Series {
		if p := s.Best(); p != nil {
			fmt.Fprintf(&b, `<tr><td class="l">%s</td><td>%d</td><td>%s</td><td>%s</td></tr>`, esc(s.Name), p.VUs, p.Throughput.text("%.0f"), p.P95.text("%.2f"))
		} else {
			fmt.Fprintf(&b, `<tr><td class="l">%s</td><td colspan="3" class="bad">no configuration within the p95 rule</td></tr>`, esc(s.Name))
		}
	}
	b.WriteString(`</table>`)

	b.WriteString(`<h2>Charts</h2><div class="charts">`)
	for _, c := range d.Charts() {
		b.WriteString(c[1])
	}
	b.WriteString(`</div>`)

	ps := d.HasPageserver()
	psHead := ""
	if ps {
		psHead = `<th>GetPage p99 ms</th><th>deltas/GetPage</th><th>pageserver CPU %</th>`
	}
	cs := d.HasCompute()
	if cs {
		psHead += `<th>compute hit %</th><th>LFC lock wait s</th>`
	}
	fmt.Fprintf(&b, `<h2>Configurations (median [min–max] over repeats)</h2><table><tr><th class="l">series</th><th>VUs</th><th>repeats</th><th>%s</th><th>TPM</th><th>p95 ms</th><th>WAL/tx KB</th><th>FPI %%</th><th>hit %%</th>%s<th>ping p95 ms</th><th>other CPU %%</th><th>steal %%</th><th class="l">flags</th></tr>`, d.ThroughputName(), psHead)
	for _, s := range d.Series {
		for _, p := range s.Points {
			var flags []string
			if !p.Valid {
				flags = append(flags, `<span class="bad">p95 over limit</span>`)
			}
			if p.Noisy > 0 {
				flags = append(flags, fmt.Sprintf(`<span class="warn">noisy ×%d</span>`, p.Noisy))
			}
			if p.Incomplete > 0 {
				flags = append(flags, fmt.Sprintf(`<span class="warn">incomplete ×%d</span>`, p.Incomplete))
			}
			psCells := ""
			if ps {
				psCells = fmt.Sprintf(`<td>%s</td><td>%s</td><td>%s</td>`, p.GetPageP99.text("%.3f"), p.DeltasPerGetPage.text("%.2f"), p.PageserverCPUPct.text("%.0f"))
			}
			if cs {
				psCells += fmt.Sprintf(`<td>%s</td><td>%s</td>`, p.ComputeHitPct.text("%.1f"), p.LFCLockWaitSec.text("%.2f"))
			}
			fmt.Fprintf(&b, `<tr><td class="l">%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>%s<td>%s</td><td>%s</td><td>%s</td><td class="l">%s</td></tr>`,
				esc(s.Name), p.VUs, len(p.Runs), p.Throughput.text("%.0f"), p.TPM.text("%.0f"), p.P95.text("%.2f"),
				p.WALPerTx.text("%.1f"), p.FPIShare.text("%.1f"), p.HitRatio.text("%.2f"), psCells, p.PingP95.text("%.2f"),
				p.OtherCPU.text("%.1f"), p.StealCPU.text("%.1f"), strings.Join(flags, " "))
		}
	}
	b.WriteString(`</table>`)

	b.WriteString(`<h2>Runs</h2><table><tr><th>id</th><th class="l">configuration</th><th>rep</th><th class="l">started</th><th>status</th><th>NOPM</th><th>TPM</th><th>p95 ms</th><th class="l">git</th><th class="l">notes</th></tr>`)
	runs := append(d.Runs[:0:0], d.Runs...)
	sort.Slice(runs, func(i, j int) bool { return runs[i].ID < runs[j].ID })
	for _, r := range runs {
		fmt.Fprintf(&b, `<tr><td>%d</td><td class="l">%s</td><td>%d</td><td class="l">%s</td><td>%s</td><td>%.0f</td><td>%.0f</td><td>%.2f</td><td class="l">%s</td><td class="l">%s</td></tr>`,
			r.ID, esc(runLabel(r)), r.Repeat, r.StartedAt.UTC().Format("2006-01-02 15:04:05"), esc(r.Status), r.NOPM, r.TPM, r.P95, esc(r.GitRev), esc(strings.Join(r.Notes, "; ")))
	}
	b.WriteString(`</table>`)
	if len(d.Runs) > 0 {
		m := d.Runs[0].Machine
		b.WriteString(`<h2>Machine</h2><table>`)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, `<tr><th class="l">%s</th><td class="l">%s</td></tr>`, esc(k), esc(m[k]))
		}
		b.WriteString(`</table>`)
	}
	b.WriteString(`</body></html>`)
	_, err := io.WriteString(w, b.String())
	return err
}
