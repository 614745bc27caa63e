package cluster

import (
	"testing"
	"time"

	"github.com/stratadb/strata/core/compute/agent"
)

// TestProgressWatch: what strata up and down say of the agent's reports,
// and what counts as the report moving.
func TestProgressWatch(t *testing.T) {
	var said []string
	w := newProgressWatch(func(s string) { said = append(said, s) })
	w.see(nil)
	if len(said) != 0 || w.last() != "no report from the agent" {
		t.Fatalf("no report: said %q, last %q", said, w.last())
	}
	time.Sleep(20 * time.Millisecond)
	w.see(&agent.Progress{Step: "fetching WAL", FetchedSegments: 1, FetchSegments: 9})
	if w.idle() >= 20*time.Millisecond {
		t.Errorf("a first report did not count as moving (idle %s)", w.idle())
	}
	w.see(&agent.Progress{Step: "fetching WAL", FetchedSegments: 2, FetchSegments: 9}) // same step, within 10 s
	time.Sleep(20 * time.Millisecond)
	w.see(&agent.Progress{Step: "fetching WAL", FetchedSegments: 2, FetchSegments: 9}) // unchanged
	if w.idle() < 20*time.Millisecond {
		t.Errorf("an unchanged report counted as moving (idle %s)", w.idle())
	}
	w.see(&agent.Progress{Step: "recovering"})
	w.see(&agent.Progress{Step: "recovering", Replaying: "000000010000000000000002", ReplayAt: 0x2000000})
	w.see(&agent.Progress{Step: "recovering", Replaying: "000000010000000000000003", ReplayAt: 0x3000000})
	want := []string{
		"compute: fetching WAL from the safekeepers: 1 of 9 segments",
		"compute: postgres starting",
		"compute: postgres replaying WAL: segment 000000010000000000000002",
	}
	if len(said) != len(want) {
		t.Fatalf("said %q, want %q", said, want)
	}
	for i := range want {
		if said[i] != want[i] {
			t.Fatalf("said %q, want %q", said, want)
		}
	}
	if w.last() != "postgres replaying WAL: segment 000000010000000000000003" {
		t.Errorf("last %q", w.last())
	}
}
