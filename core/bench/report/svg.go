package report

import (
	"fmt"
	"html"
	"math"
	"strings"
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"}

func seriesColor(i int) string { return palette[i%len(palette)] }

// XY is one point of a line, with an optional range (Lo..Hi) and a hollow
// marker for points that break a rule.
type XY struct {
	X, Y, Lo, Hi float64
	Hollow       bool
}

// Line is one named curve.
type Line struct {
	Name   string
	Points []XY
}

const (
	chartW, chartH         = 640, 340
	padL, padR, padT, padB = 70, 20, 36, 90
)

func niceMax(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func fmtNum(v float64) string {
	switch {
	case v >= 10000:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1000), ".0") + "k"
	case v == math.Trunc(v) || v >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	}
}

func svgOpen(b *strings.Builder, id, title string) {
	fmt.Fprintf(b, `<svg class="chart" id="%s" data-title="%s" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img">`,
		id, html.EscapeString(title), chartW, chartH, chartW, chartH)
	fmt.Fprintf(b, `<title>%s</title><rect width="100%%" height="100%%" fill="#fff"/>`, html.EscapeString(title))
	fmt.Fprintf(b, `<text x="%d" y="20" font-size="14" font-weight="bold" font-family="sans-serif">%s</text>`, padL, html.EscapeString(title))
}

func axes(b *strings.Builder, ymax float64, ylabel, xlabel string) {
	pw, ph := chartW-padL-padR, chartH-padT-padB
	for i := 0; i <= 4; i++ {
		y := padT + ph - ph*i/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`, padL, y, padL+pw, y)
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11" text-anchor="end" font-family="sans-serif">%s</text>`, padL-6, y+4, fmtNum(ymax*float64(i)/4))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT+ph, padL+pw, padT+ph)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT, padL, padT+ph)
	fmt.Fprintf(b, `<text x="14" y="%d" font-size="12" font-family="sans-serif" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`, padT+ph/2, padT+ph/2, html.EscapeString(ylabel))
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" font-family="sans-serif" text-anchor="middle">%s</text>`, padL+pw/2, padT+ph+32, html.EscapeString(xlabel))
}

func legend(b *strings.Builder, names []string) {
	y := chartH - padB + 48
	x := padL
	for i, n := range names {
		w := 16 + 7*len(n)
		if x+w > chartW-padR && x > padL {
			x = padL
			y += 16
		}
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" font-size="11" font-family="sans-serif">%s</text>`,
			x, y-9, seriesColor(i), x+14, y, html.EscapeString(n))
		x += w + 10
	}
}

// LineChart draws lines over a shared categorical x axis (the distinct X
// values, in order), with range whiskers and an optional horizontal rule.
// A title ending in "(%)" gets a y axis capped at 100.
func LineChart(id, title, xlabel, ylabel string, lines []Line, rule float64) string {
	var b strings.Builder
	svgOpen(&b, id, title)
	xsSet := map[float64]bool{}
	ymax := rule
	for _, l := range lines {
		for _, p := range l.Points {
			xsSet[p.X] = true
			ymax = math.Max(ymax, math.Max(p.Y, p.Hi))
		}
	}
	var xs []float64
	for x := range xsSet {
		xs = append(xs, x)
	}
	sortFloats(xs)
	ymax = niceMax(ymax * 1.05)
	if strings.HasSuffix(title, "(%)") && ymax > 100 {
		ymax = 100
	}
	axes(&b, ymax, ylabel, xlabel)
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	xpos := func(x float64) float64 {
		for i, v := range xs {
			if v == x {
				if len(xs) == 1 {
					return padL + pw/2
				}
				return padL + 20 + (pw-40)*float64(i)/float64(len(xs)-1)
			}
		}
		return padL
	}
	ypos := func(y float64) float64 { return padT + ph - ph*y/ymax }
	for _, x := range xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" font-family="sans-serif">%s</text>`, xpos(x), padT+ph+15, fmtNum(x))
	}
	if rule > 0 {
		fmt.Fprintf(&b, `<line class="rule" x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="6 4"/>`, padL, ypos(rule), padL+pw, ypos(rule))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="#c00" text-anchor="end" font-family="sans-serif">limit %s</text>`, padL+pw-2, ypos(rule)-3, fmtNum(rule))
	}
	var names []string
	for i, l := range lines {
		names = append(names, l.Name)
		var path []string
		for _, p := range l.Points {
			if math.IsNaN(p.Y) {
				continue
			}
			path = append(path, fmt.Sprintf("%.1f,%.1f", xpos(p.X), ypos(p.Y)))
		}
		fmt.Fprintf(&b, `<g class="series" data-series="%s">`, html.EscapeString(l.Name))
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, seriesColor(i), strings.Join(path, " "))
		}
		for _, p := range l.Points {
			if math.IsNaN(p.Y) {
				continue
			}
			x := xpos(p.X)
			if p.Hi > p.Lo {
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, x, ypos(p.Lo), x, ypos(p.Hi), seriesColor(i))
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`,
					x-4, ypos(p.Lo), x+4, ypos(p.Lo), seriesColor(i), x-4, ypos(p.Hi), x+4, ypos(p.Hi), seriesColor(i))
			}
			fill := seriesColor(i)
			if p.Hollow {
				fill = "#fff"
			}
			fmt.Fprintf(&b, `<circle class="point" cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s" stroke-width="2"><title>%s: %s = %s</title></circle>`,
				x, ypos(p.Y), fill, seriesColor(i), html.EscapeString(l.Name), fmtNum(p.X), fmtNum(p.Y))
		}
		b.WriteString(`</g>`)
	}
	legend(&b, names)
	b.WriteString(`</svg>`)
	return b.String()
}

// Bar is one stacked bar.
type Bar struct {
	Label  string
	Values []float64 // one per key
}

// StackedBars draws one stacked bar per entry, segments per key.
func StackedBars(id, title, ylabel string, keys []string, bars []Bar) string {
	var b strings.Builder
	svgOpen(&b, id, title)
	ymax := 0.0
	for _, br := range bars {
		t := 0.0
		for _, v := range br.Values {
			t += v
		}
		ymax = math.Max(ymax, t)
	}
	ymax = niceMax(ymax * 1.05)
	axes(&b, ymax, ylabel, "")
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	n := float64(len(bars))
	slot := pw / math.Max(n, 1)
	bw := math.Min(40, slot*0.7)
	for i, br := range bars {
		x := padL + slot*float64(i) + (slot-bw)/2
		y := padT + ph
		fmt.Fprintf(&b, `<g class="bar" data-label="%s">`, html.EscapeString(br.Label))
		for k, v := range br.Values {
			if v <= 0 {
				continue
			}
			h := ph * v / ymax
			y -= h
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.2f</title></rect>`,
				x, y, bw, h, seriesColor(k), html.EscapeString(br.Label), html.EscapeString(keys[k]), v)
		}
		b.WriteString(`</g>`)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="end" font-family="sans-serif" transform="rotate(-35 %.1f %.1f)">%s</text>`,
			x+bw/2, padT+ph+12, x+bw/2, padT+ph+12, html.EscapeString(br.Label))
	}
	legend(&b, keys)
	b.WriteString(`</svg>`)
	return b.String()
}

func sortFloats(xs []float64) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}
