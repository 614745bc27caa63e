package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
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
