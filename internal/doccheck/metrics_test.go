package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var metricLiteral = regexp.MustCompile(`"(strata_[a-z0-9_]+)"`)

// codeMetrics returns the strata_* string literals of the non-test Go files
// under root that import the Prometheus client: the metric names.
func codeMetrics(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), `"github.com/prometheus/client_golang/prometheus"`) {
			return nil
		}
		for _, m := range metricLiteral.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMetricsReference: docs/metrics.md documents every metric the code
// defines, and nothing else.
func TestMetricsReference(t *testing.T) {
	docs, err := Metrics("../..")
	if err != nil {
		t.Fatal(err)
	}
	code := codeMetrics(t, "../..")
	if len(code) < 50 || len(docs) < 50 {
		t.Fatalf("%d metric names in the code, %d in docs/metrics.md: the scan or the parse is broken", len(code), len(docs))
	}
	var missing, extra []string
	for name, path := range code {
		if _, ok := docs[name]; !ok {
			missing = append(missing, name+" ("+path+")")
		}
	}
	for name := range docs {
		if _, ok := code[name]; !ok {
			extra = append(extra, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("metrics not documented in docs/metrics.md:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(extra) > 0 {
		t.Errorf("docs/metrics.md documents metrics the code does not define:\n  %s", strings.Join(extra, "\n  "))
	}
}

// TestCheckExposition: the exposition check catches an undocumented
// family, a wrong type and wrong labels, and accepts a histogram's series.
func TestCheckExposition(t *testing.T) {
	docs := map[string]Metric{
		"strata_a_total":   {Name: "strata_a_total", Type: "counter", Labels: []string{"op", "store"}},
		"strata_b_seconds": {Name: "strata_b_seconds", Type: "histogram", Labels: []string{"timeline"}},
		"strata_c":         {Name: "strata_c", Type: "gauge"},
	}
	good := `# HELP strata_a_total A.
# TYPE strata_a_total counter
strata_a_total{op="get",store="fs"} 3
# TYPE strata_b_seconds histogram
strata_b_seconds_bucket{timeline="ab",le="0.1"} 1
strata_b_seconds_sum{timeline="ab"} 0.05
strata_b_seconds_count{timeline="ab"} 1
# TYPE strata_c gauge
strata_c 7
# TYPE go_goroutines gauge
go_goroutines 12
`
	fams, problems := CheckExposition(good, docs)
	if len(problems) > 0 || len(fams) != 3 {
		t.Fatalf("a good exposition: families %v, problems %v", fams, problems)
	}
	bad := `# TYPE strata_a_total counter
strata_a_total{op="get"} 3
# TYPE strata_c counter
strata_c 7
# TYPE strata_d gauge
strata_d 1
`
	_, problems = CheckExposition(bad, docs)
	want := []string{"strata_d is exported but not documented", "strata_c is a counter, documented as a gauge", "strata_a_total has labels [op], documented [op, store]"}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want %d", problems, len(want))
	}
	for _, w := range want {
		found := false
		for _, p := range problems {
			found = found || strings.Contains(p, w)
		}
		if !found {
			t.Errorf("no problem says %q: %q", w, problems)
		}
	}
}
