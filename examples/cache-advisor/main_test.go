package main

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/cache/cachetest"
)

func TestFit(t *testing.T) {
	const budget = 10000
	advise := func(a cache.Advisor, now, prev cache.Stats) cache.Advice {
		t.Helper()
		adv, err := a.Advise(context.Background(), cache.Observation{Stats: now, Prev: prev, BudgetBytes: budget})
		if err != nil {
			t.Fatal(err)
		}
		return adv
	}
	a, err := open([]byte(`{"grow_step": 0.5, "min_bytes": 1000, "shrink_after": 3}`), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	grow := []struct {
		name      string
		now, prev cache.Stats
		resize    bool
		to        int64
	}{
		{"evictions grow by half the budget", cache.Stats{Evictions: 7, UsedBytes: 4000, CapacityBytes: 4000}, cache.Stats{Evictions: 2}, true, 9000},
		{"growth stops at the budget", cache.Stats{Evictions: 7, UsedBytes: 9000, CapacityBytes: 9000}, cache.Stats{Evictions: 2}, true, budget},
		{"at the budget nothing changes", cache.Stats{Evictions: 7, UsedBytes: budget, CapacityBytes: budget}, cache.Stats{Evictions: 2}, false, 0},
	}
	for _, c := range grow {
		if adv := advise(a, c.now, c.prev); adv.Resize != c.resize || (c.resize && adv.CapacityBytes != c.to) {
			t.Errorf("%s: %+v, want resize %v to %d", c.name, adv, c.resize, c.to)
		}
	}
	// Mostly empty: a shrink only on the third period in a row, to the
	// bytes in use plus the headroom.
	empty := cache.Stats{UsedBytes: 2000, CapacityBytes: 8000}
	for i := 1; i <= 2; i++ {
		if adv := advise(a, empty, empty); adv.Resize {
			t.Fatalf("period %d mostly empty: %+v, want no shrink yet", i, adv)
		}
	}
	if adv := advise(a, empty, empty); !adv.Resize || adv.CapacityBytes != 2500 {
		t.Fatalf("third period mostly empty: %+v, want a shrink to 2500", adv)
	}
	// An eviction or a half full period starts the count again.
	advise(a, empty, empty)
	advise(a, empty, empty)
	advise(a, cache.Stats{Evictions: 1, UsedBytes: 2000, CapacityBytes: budget}, cache.Stats{})
	advise(a, empty, empty)
	advise(a, cache.Stats{UsedBytes: 4000, CapacityBytes: 8000}, cache.Stats{})
	advise(a, empty, empty)
	if adv := advise(a, empty, empty); adv.Resize {
		t.Fatalf("shrink before three quiet periods in a row: %+v", adv)
	}
	// The minimum holds.
	advise(a, cache.Stats{UsedBytes: 4000, CapacityBytes: 8000}, cache.Stats{})
	tiny := cache.Stats{UsedBytes: 100, CapacityBytes: 8000}
	advise(a, tiny, tiny)
	advise(a, tiny, tiny)
	if adv := advise(a, tiny, tiny); !adv.Resize || adv.CapacityBytes != 1000 {
		t.Fatalf("shrink of a nearly empty LFC: %+v, want the 1000-byte minimum", adv)
	}
	for _, bad := range []string{`{"grow_step": 0}`, `{"low_watermark": 1}`, `{"typo": 1}`, `{"min_bytes": -1}`, `{"shrink_after": 0}`} {
		if _, err := open([]byte(bad), zerolog.Nop()); err == nil {
			t.Errorf("config %s accepted", bad)
		}
	}
}

// TestAcceptance runs the advisor contract's suite in process (the agent's
// tests run it through the process boundary).
func TestAcceptance(t *testing.T) {
	cachetest.RunAdvisor(t, func(t *testing.T) cache.Advisor {
		a, err := open(nil, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		return a
	})
}
