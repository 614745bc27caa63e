package metrics

import (
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

func TestServe(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	s, err := Serve("127.0.0.1:0", reg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get("http://" + s.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "strata_test_total 3") || !strings.Contains(string(body), "go_goroutines") {
		t.Fatalf("metrics missing:\n%s", body)
	}
}

// TestProfiler: the profiler answers beside /metrics (a goroutine dump
// names this test's goroutine).
func TestProfiler(t *testing.T) {
	s, err := Serve("127.0.0.1:0", NewRegistry(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get("http://" + s.Addr().String() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "TestProfiler") {
		t.Fatalf("status %s, goroutine dump:\n%.2000s", resp.Status, body)
	}
}

// TestDiskFree: the gauge reads the free space of the directory's
// filesystem at each scrape, and NaN for a directory that is gone.
func TestDiskFree(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewDiskFree("strata_test_disk_free_bytes", "test", dir, nil))
	value := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	want := float64(st.Bavail) * float64(st.Bsize)
	if got := value(); got <= 0 || math.Abs(got-want) > 64<<20 {
		t.Fatalf("disk free %g, statfs says %g", got, want)
	}
	os.RemoveAll(dir)
	if got := value(); !math.IsNaN(got) {
		t.Fatalf("disk free of a removed folder: %g, want NaN", got)
	}
}
