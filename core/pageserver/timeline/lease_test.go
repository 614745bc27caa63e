package timeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// TestLease: GC does not raise the cutoff above a leased LSN while the
// lease runs, and reads there keep their versions though newer image
// layers cover the key; once the lease ends (by time or by a lease of
// length 0, which ends only its holder's lease) the next GC passes it,
// and reads and listings there are refused. A lease below the cutoff, or
// longer than MaxLeaseTTL, is refused.
func TestLease(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	clock, advance := testClock()
	opts := smallOpts()
	opts.GCHorizon = 10
	tl, err := Open(ctx, pg.TimelineID{9}, t.TempDir(), opts, Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: 0})
	write := func(from, to int) { putHistory(t, tl, commit, k, from, to) }
	gc := func() pg.LSN {
		t.Helper()
		if _, err := tl.GC(ctx); err != nil {
			t.Fatal(err)
		}
		return tl.LSNs().GCCutoff
	}

	write(1, 10)
	end, err := tl.Lease(500, "r1", time.Minute)
	if err != nil || !end.Equal(clock().Add(time.Minute)) {
		t.Fatalf("lease at 0/1F4: ends %s, %v; want %s", end, err, clock().Add(time.Minute))
	}
	// A shorter lease of the same LSN does not shorten it.
	if end2, err := tl.Lease(500, "r1", time.Second); err != nil || !end2.Equal(end) {
		t.Fatalf("a shorter lease of 0/1F4: ends %s, %v; want %s", end2, err, end)
	}
	// A second holder of the same LSN ends its own lease only.
	if _, err := tl.Lease(500, "r2", time.Minute); err != nil {
		t.Fatal(err)
	}
	if l := tl.LSNs(); l.Leases != 2 {
		t.Fatalf("%d leases, want r1's and r2's", l.Leases)
	}
	if _, err := tl.Lease(500, "r2", 0); err != nil {
		t.Fatal(err)
	}
	write(11, 20)
	if c := gc(); c != 500 {
		t.Fatalf("cutoff %s with a lease at 0/1F4; want 0/1F4", c)
	}
	if l := tl.LSNs(); l.Lease != 500 || l.Leases != 1 {
		t.Fatalf("LSNs(): lease %s, %d leases; want one, at 0/1F4", l.Lease, l.Leases)
	}
	if d, err := tl.Get(ctx, k, 500); err != nil || string(d) != "v5" {
		t.Fatalf("read at the leased LSN: %q, %v; want v5", d, err)
	}
	if _, err := tl.Lease(400, "r1", time.Minute); !errors.Is(err, ErrBelowGCCutoff) {
		t.Fatalf("lease below the cutoff: %v, want ErrBelowGCCutoff", err)
	}
	if _, err := tl.Lease(600, "r1", 2*MaxLeaseTTL); err == nil {
		t.Fatal("a lease longer than MaxLeaseTTL was taken")
	}

	// The lease runs out: the next GC passes it.
	advance(time.Minute)
	if c := gc(); c != 2000-10 {
		t.Fatalf("cutoff %s after the lease ended; want %s", c, pg.LSN(2000-10))
	}
	if l := tl.LSNs(); l.Lease != 0 || l.Leases != 0 {
		t.Fatalf("LSNs(): lease %s, %d leases after the lease ended; want none", l.Lease, l.Leases)
	}
	if _, err := tl.Get(ctx, k, 500); !errors.Is(err, ErrBelowGCCutoff) {
		t.Fatalf("read at the old lease after GC: %v, want ErrBelowGCCutoff", err)
	}
	// Listings there are refused too, not answered with fewer entries.
	if rels, err := tl.ListRels(ctx, keyspace.RelsRange, 500); !errors.Is(err, ErrBelowGCCutoff) {
		t.Fatalf("relations at the old lease after GC: %v, %v; want ErrBelowGCCutoff", rels, err)
	}
	if files, err := tl.ListFiles(ctx, 500); !errors.Is(err, ErrBelowGCCutoff) {
		t.Fatalf("files at the old lease after GC: %v, %v; want ErrBelowGCCutoff", files, err)
	}

	// A lease ended by a lease of length 0.
	if _, err := tl.Lease(1995, "r1", time.Hour); err != nil {
		t.Fatal(err)
	}
	write(21, 30)
	if c := gc(); c != 1995 {
		t.Fatalf("cutoff %s with a lease at %s", c, pg.LSN(1995))
	}
	if end, err := tl.Lease(1995, "r1", 0); err != nil || !end.IsZero() {
		t.Fatalf("ending the lease: %s, %v", end, err)
	}
	if c := gc(); c != 3000-10 {
		t.Fatalf("cutoff %s after the lease was ended; want %s", c, pg.LSN(3000-10))
	}
}

// TestLeaseAfterRestart: a restarted timeline has forgotten its leases, so
// GC keeps the cutoff for LeaseGrace after the restart; a reader that
// renews its lease within it keeps its history, and once the grace and
// the lease are over GC goes on. A new timeline (no history) has no grace.
func TestLeaseAfterRestart(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	clock, advance := testClock()
	opts := smallOpts()
	opts.GCHorizon = 10
	opts.LeaseGrace = time.Minute
	dir := t.TempDir()
	open := func() *Timeline {
		t.Helper()
		tl, err := Open(ctx, pg.TimelineID{9}, dir, opts, Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	gc := func(tl *Timeline) pg.LSN {
		t.Helper()
		if _, err := tl.GC(ctx); err != nil {
			t.Fatal(err)
		}
		return tl.LSNs().GCCutoff
	}
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: 0})

	tl := open()
	putHistory(t, tl, commit, k, 1, 10)
	if c := gc(tl); c != 1000-10 {
		t.Fatalf("cutoff %s on a new timeline; want %s (no grace without a restart)", c, pg.LSN(1000-10))
	}
	putHistory(t, tl, commit, k, 11, 20)
	if _, err := tl.Lease(1500, "restore", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}

	// The restart: the lease is gone, and GC keeps the cutoff.
	tl = open()
	defer tl.Close()
	if l := tl.LSNs(); l.Leases != 0 {
		t.Fatalf("%d leases after the restart; leases live in memory", l.Leases)
	}
	advance(30 * time.Second)
	if c := gc(tl); c != 1000-10 {
		t.Fatalf("cutoff %s within the grace after a restart; want it kept at %s", c, pg.LSN(1000-10))
	}
	// The restore renews within the grace and keeps its LSN.
	if _, err := tl.Lease(1500, "restore", time.Minute); err != nil {
		t.Fatalf("renewal within the grace: %v", err)
	}
	advance(40 * time.Second)
	if c := gc(tl); c != 1500 {
		t.Fatalf("cutoff %s after the grace with a renewed lease at %s; want the lease", c, pg.LSN(1500))
	}
	if d, err := tl.Get(ctx, k, 1500); err != nil || string(d) != "v15" {
		t.Fatalf("read at the renewed lease: %q, %v; want v15", d, err)
	}
	advance(time.Minute)
	if c := gc(tl); c != 2000-10 {
		t.Fatalf("cutoff %s after the grace and the lease; want %s", c, pg.LSN(2000-10))
	}
}

// testClock is a clock for Deps.Now that moves only when advanced.
func testClock() (clock func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance = func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	return clock, advance
}
