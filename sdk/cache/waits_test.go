package cache_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stratadb/strata/sdk/cache"
)

func TestWaits(t *testing.T) {
	w, err := cache.NewWaits(cache.WaitLFCLock, cache.WaitLFCRead, "getpage")
	if err != nil {
		t.Fatal(err)
	}
	lock, ok := w.Kind(cache.WaitLFCLock)
	if !ok || lock != 0 {
		t.Fatalf("Kind(lfc_lock) = %d %v", lock, ok)
	}
	gp, _ := w.Kind("getpage")
	if _, ok := w.Kind("nope"); ok {
		t.Fatal("Kind of an unknown name")
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				w.Add(lock, g, time.Microsecond)
				w.Add(gp, g*7+i, 2*time.Microsecond)
			}
		}(g)
	}
	wg.Wait()
	w.Add(-1, 0, time.Hour) // ignored
	snap := w.Snapshot()
	if len(snap) != 3 || snap[0] != (cache.WaitStat{Name: "lfc_lock", Count: 8000, Total: 8 * time.Millisecond}) ||
		snap[2] != (cache.WaitStat{Name: "getpage", Count: 8000, Total: 16 * time.Millisecond}) ||
		snap[1].Count != 0 {
		t.Fatalf("snapshot %+v", snap)
	}
	if got := w.Get("getpage"); got.Count != 8000 {
		t.Fatalf("Get %+v", got)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(w.Collector())
	want := `
# HELP strata_wait_events_total Number of waits the compute agent imposed, by kind.
# TYPE strata_wait_events_total counter
strata_wait_events_total{wait="getpage"} 8000
strata_wait_events_total{wait="lfc_lock"} 8000
strata_wait_events_total{wait="lfc_read"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "strata_wait_events_total"); err != nil {
		t.Fatal(err)
	}
	wantSec := `
# HELP strata_wait_seconds_total Total time of the waits the compute agent imposed, by kind.
# TYPE strata_wait_seconds_total counter
strata_wait_seconds_total{wait="getpage"} 0.016
strata_wait_seconds_total{wait="lfc_lock"} 0.008
strata_wait_seconds_total{wait="lfc_read"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantSec), "strata_wait_seconds_total"); err != nil {
		t.Fatal(err)
	}

	// A nil Waits records nothing and does not panic.
	var nw *cache.Waits
	nw.Add(0, 0, time.Second)
	if nw.Snapshot() != nil {
		t.Fatal("nil snapshot")
	}
	if _, err := cache.NewWaits("a", "a"); err == nil {
		t.Fatal("repeated kind accepted")
	}
	if _, err := cache.NewWaits(make([]string, cache.MaxWaitKinds+1)...); err == nil {
		t.Fatal("too many kinds accepted")
	}
}
