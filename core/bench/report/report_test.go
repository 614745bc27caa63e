package report

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/bench/results"
)

// fakeRuns builds runs for two series (FPW on/off) at 1, 4 and 8 VUs with
// three repeats; throughput grows with VUs, p95 breaks 20 ms at 8 VUs for
// FPW on, and one repeat is noisy.
func fakeRuns() []*results.Run {
	var out []*results.Run
	id := int64(0)
	for _, fpw := range []string{"on", "off"} {
		for _, vus := range []int{1, 4, 8} {
			for rep := 1; rep <= 3; rep++ {
				id++
				nopm := float64(1000*vus + 100*rep)
				p95 := float64(3 * vus)
				if fpw == "off" {
					nopm *= 1.2
					p95 = float64(2 * vus)
				}
				other, steal := 1.0, 0.5
				if rep == 2 && vus == 4 {
					other = 25
				}
				if rep == 3 && vus == 8 {
					steal = 30 // the hypervisor's, not a process's
				}
				fpi := 0.0
				if fpw == "on" {
					fpi = 0.38
				}
				out = append(out, &results.Run{ID: id, Matrix: "m", Workload: "tpcc",
					Series: "stock full_page_writes=" + fpw + " wh=4", Label: fmt.Sprintf("stock fpw=%s vus=%d", fpw, vus),
					VUs: vus, Repeat: rep, Status: "ok", NOPM: nopm, TPM: nopm * 2.3, P95: p95,
					StartedAt: time.Unix(1700000000+id*60, 0),
					Metrics: map[string]float64{"wal_bytes_per_new_order": 15000 - 5400*(1-fpi/0.38),
						"fpi_bytes_share": fpi, "cache_hit_ratio": 0.99, "cpu_other_pct": other, "cpu_steal_pct": steal, "wait_ticks": 100,
						"ping_p95_ms": 0.3},
					Waits:   map[string]int64{"CPU": int64(80 * vus), "IO:WALSync": int64(10 * vus), "LWLock:WALWrite": 5, "Client:ClientRead": 50},
					Latency: []results.Latency{{Tx: "new_order", Count: 100, P50: 1, P95: p95, P99: p95 * 2}},
					Machine: map[string]string{"cores": "2"}})
			}
		}
	}
	return out
}

func TestAggregate(t *testing.T) {
	d := Aggregate("t", fakeRuns(), 20, 10)
	if len(d.Series) != 2 || len(d.Series[0].Points) != 3 {
		t.Fatalf("series %+v", d.Series)
	}
	p := d.Series[0].Points[1] // FPW on, 4 VUs
	if p.VUs != 4 || p.Throughput.Median != 4200 || p.Throughput.Min != 4100 || p.Throughput.Max != 4300 || p.Throughput.N != 3 {
		t.Fatalf("point %+v", p.Throughput)
	}
	if p.Noisy != 1 || !p.Valid {
		t.Fatalf("noisy %d valid %v", p.Noisy, p.Valid)
	}
	if last := d.Series[0].Points[2]; last.Valid {
		t.Fatal("p95 24 ms accepted under a 20 ms rule")
	} else if last.Noisy != 1 || last.StealCPU.Max != 30 || last.StealCPU.Median != 0.5 {
		t.Fatalf("a repeat with 30%% steal: noisy %d, steal %+v", last.Noisy, last.StealCPU)
	}
	if b := d.Series[0].Best(); b == nil || b.VUs != 4 {
		t.Fatalf("best %+v", b)
	}
	if b := d.Series[1].Best(); b == nil || b.VUs != 8 {
		t.Fatalf("best off %+v", b)
	}
	keys := d.WaitKeys(9)
	if len(keys) != 3 || keys[0] != "CPU" {
		t.Fatalf("wait keys %v", keys)
	}
	if st := p.WaitStack(keys); st[0] < 3.199 || st[0] > 3.201 || st[1] < 0.399 || st[1] > 0.401 {
		t.Fatalf("wait stack %v", st)
	}
}

func writeReport(t *testing.T) (string, *Data) {
	d := Aggregate("FPW test", fakeRuns(), 20, 7)
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	var buf bytes.Buffer
	if err := WriteHTML(&buf, d); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "http://") && !strings.Contains(buf.String(), "http://www.w3.org/2000/svg") {
		t.Fatal("report refers to the network")
	}
	if regexp.MustCompile(`(src|href)="http`).MatchString(buf.String()) {
		t.Fatal("report loads external resources")
	}
	// The header states the noise rule that flagged the runs: the share
	// given to Aggregate, for other processes and for steal.
	if !strings.Contains(buf.String(), "steal, took more than 7% of the machine") {
		t.Fatal("the report's header does not state the noise rule (7%, other processes or steal)")
	}
	return path, d
}

func TestPNGs(t *testing.T) {
	_, d := writeReport(t)
	files, err := WritePNGs(t.TempDir(), d)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 5+2 {
		t.Fatalf("files %v", files)
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil || img.Bounds().Dx() < 100 {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

func TestCompare(t *testing.T) {
	runs := fakeRuns()[:2]
	var b bytes.Buffer
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"#1", "#2", "NOPM", "1100", "1200", "FPI share %", "38.0", "new_order p50/p95/p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare output lacks %q:\n%s", want, out)
		}
	}
	// The configuration label goes one word to a line: every word is
	// there, and no line holds two words of one label.
	for _, r := range runs {
		words := strings.Fields(r.Label)
		if len(words) < 2 {
			t.Fatalf("fake run label %q has one word", r.Label)
		}
		for _, w := range words {
			if !strings.Contains(out, w) {
				t.Errorf("compare output lacks %q of label %q:\n%s", w, r.Label, out)
			}
		}
		if strings.Contains(out, words[0]+" "+words[1]) {
			t.Errorf("label %q not wrapped:\n%s", r.Label, out)
		}
	}
}

// chromium returns the path of a headless browser, or skips.
func chromium(t *testing.T) string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("STRATA_REQUIRE_BROWSER") == "1" {
		t.Fatal("chromium missing and STRATA_REQUIRE_BROWSER=1 (apt-get install -y chromium)")
	}
	t.Skip("chromium not installed (apt-get install -y chromium); set STRATA_REQUIRE_BROWSER=1 to fail instead")
	return ""
}

// DumpDOM renders file in headless chromium and returns the DOM.
func dumpDOM(t *testing.T, browser, file string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir="+t.TempDir(), "--dump-dom", "file://"+file)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return stdout.String()
}

// TestHTMLInBrowser opens the report in a real headless browser and finds
// every chart, every series and every point in the rendered DOM.
func TestHTMLInBrowser(t *testing.T) {
	browser := chromium(t)
	path, d := writeReport(t)
	dom := dumpDOM(t, browser, path)
	charts := regexp.MustCompile(`<svg class="chart" id="([a-z0-9-]+)"`).FindAllStringSubmatch(dom, -1)
	var ids []string
	for _, c := range charts {
		ids = append(ids, c[1])
	}
	want := []string{"throughput", "p95", "wal", "fpi", "hit", "waits-1", "waits-2"}
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("charts in DOM %v, want %v", ids, want)
	}
	// Each line chart has one point per series and VU count.
	if n := strings.Count(dom, `class="point"`); n != 5*len(d.Series)*3 {
		t.Fatalf("%d points in DOM", n)
	}
	for _, s := range d.Series {
		if !strings.Contains(dom, `data-series="`+s.Name+`"`) {
			t.Fatalf("series %q not in DOM", s.Name)
		}
	}
	if !strings.Contains(dom, "p95 over limit") || !strings.Contains(dom, "noisy ×1") {
		t.Fatal("flags missing from the rendered table")
	}
	// A screenshot renders without error too.
	shot := filepath.Join(t.TempDir(), "shot.png")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir="+t.TempDir(), "--window-size=1400,2400", "--screenshot="+shot, "file://"+path).CombinedOutput()
	if err != nil {
		t.Fatalf("screenshot: %v\n%s", err, out)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10000 {
		t.Fatalf("screenshot %v %v", fi, err)
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{16: "16", 75: "75", 18.75: "18.75", 12.5: "12.5", 20000: "20k", 12500: "12.5k", 250: "250", 0.25: "0.25", 0: "0"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestCompareCPUParts: every part of CPUParts gets its share, per New-Order
// and per transaction rows, and only when some run has the figure.
func TestCompareCPUParts(t *testing.T) {
	runs := fakeRuns()[:2]
	runs[0].Metrics["cpu_pageserver_us_per_xact"] = 123
	runs[1].Metrics["cpu_agent_ms_per_new_order"] = 0.25
	runs[1].Metrics["cpu_safekeepers_pct"] = 31
	var b bytes.Buffer
	if err := Compare(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"CPU us/xact pageserver", "123", "CPU ms/NO agent", "0.25", "CPU safekeepers %", "31"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare output lacks %q:\n%s", want, out)
		}
	}
	for _, absent := range []string{"CPU receivers %", "CPU ms/NO postgres", "CPU us/xact agent"} {
		if strings.Contains(out, absent) {
			t.Errorf("compare output has %q, which no run has:\n%s", absent, out)
		}
	}
}
