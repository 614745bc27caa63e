package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func rgb(i int) color.Color {
	h := palette[i%len(palette)]
	v, _ := strconv.ParseUint(h[1:], 16, 32)
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 255}
}

// WritePNGs writes the report's plots into dir and returns their paths.
func WritePNGs(dir string, d *Data) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	thr := d.ThroughputName()
	var out []string
	figs := []struct {
		file, title, y string
		fig            func(*Point) Stat
		rule           float64
	}{
		{"throughput.png", thr + " vs virtual users", thr, func(p *Point) Stat { return p.Throughput }, 0},
		{"p95.png", "p95 latency vs virtual users", "ms", func(p *Point) Stat { return p.P95 }, d.P95Limit},
		{"wal_per_tx.png", "WAL per transaction", "KB", func(p *Point) Stat { return p.WALPerTx }, 0},
		{"fpi_share.png", "FPI share of WAL bytes", "%", func(p *Point) Stat { return p.FPIShare }, 0},
		{"cache_hit.png", "Cache hit rate", "%", func(p *Point) Stat { return p.HitRatio }, 0},
	}
	for _, f := range figs {
		p := plot.New()
		p.Title.Text = f.title
		p.X.Label.Text = "virtual users"
		p.Y.Label.Text = f.y
		p.Y.Min = 0
		p.Legend.Top = true
		p.Legend.Left = true
		maxX := 1.0
		for i, s := range d.Series {
			var xys plotter.XYs
			var errs plotter.YErrors
			for _, pt := range s.Points {
				st := f.fig(pt)
				if st.N == 0 || math.IsNaN(st.Median) {
					continue
				}
				xys = append(xys, plotter.XY{X: float64(pt.VUs), Y: st.Median})
				errs = append(errs, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
				maxX = math.Max(maxX, float64(pt.VUs))
			}
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return out, err
			}
			l.Color, pts.Color = rgb(i), rgb(i)
			p.Add(l, pts)
			eb, err := plotter.NewYErrorBars(struct {
				plotter.XYer
				plotter.YErrorer
			}{xys, errs})
			if err == nil {
				eb.Color = rgb(i)
				p.Add(eb)
			}
			p.Legend.Add(s.Name, l, pts)
		}
		if f.rule > 0 {
			r, err := plotter.NewLine(plotter.XYs{{X: 0, Y: f.rule}, {X: maxX, Y: f.rule}})
			if err == nil {
				r.Color = color.RGBA{R: 200, A: 255}
				r.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				p.Add(r)
				p.Legend.Add(fmt.Sprintf("limit %.0f ms", f.rule), r)
			}
		}
		path := filepath.Join(dir, f.file)
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	keys := d.WaitKeys(9)
	for si, s := range d.Series {
		p := plot.New()
		p.Title.Text = "Wait events: " + s.Name
		p.Y.Label.Text = "avg active sessions"
		p.Legend.Top = true
		var names []string
		for _, pt := range s.Points {
			names = append(names, fmt.Sprintf("%d VU", pt.VUs))
		}
		var below *plotter.BarChart
		for k, key := range keys {
			vals := make(plotter.Values, len(s.Points))
			for i, pt := range s.Points {
				vals[i] = pt.WaitStack(keys)[k]
			}
			bc, err := plotter.NewBarChart(vals, vg.Points(24))
			if err != nil {
				return out, err
			}
			bc.Color = rgb(k)
			bc.LineStyle.Width = 0
			if below != nil {
				bc.StackOn(below)
			}
			below = bc
			p.Add(bc)
			p.Legend.Add(key, bc)
		}
		p.NominalX(names...)
		// Room on the left of the first bar and, on the right, for the legend.
		p.X.Min, p.X.Max = -0.7, float64(len(names))+1.2
		path := filepath.Join(dir, fmt.Sprintf("waits-%d.png", si+1))
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	return out, nil
}
