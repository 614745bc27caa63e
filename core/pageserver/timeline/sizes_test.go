package timeline

import (
	"context"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

// TestPutPagesWithSizes: sizes written with PutPages create empty forks,
// replace the extension a page makes at the same W (the size sent after
// the page wins), lower a size at a later W, drop a fork, and survive a
// reopen (one log write with the pages).
func TestPutPagesWithSizes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(1000)
	tl := openT(t, dir, commit, nil, pg.TimelineID{7}, nil, 0)
	empty := pg.RelTag{Spc: 1663, DB: 5, Rel: 20000}
	grown := pg.RelTag{Spc: 1663, DB: 5, Rel: 20001}
	// Pages 0..3 of grown at W 100 extend it to 4; the size sent with them
	// at the same W says 6 (two blocks written by zero pages elsewhere
	// would do that; here the size alone) and must win.
	ws := []PageWrite{}
	for blk := uint32(0); blk < 4; blk++ {
		ws = append(ws, PageWrite{Page: grown.Page(blk), W: 100, Data: page(byte(blk + 1))})
	}
	if _, err := tl.PutPages(ctx, ws, SizeWrite{Rel: empty, Nblocks: 0, W: 100}, SizeWrite{Rel: grown, Nblocks: 6, W: 100}); err != nil {
		t.Fatal(err)
	}
	check := func(tl *Timeline, rel pg.RelTag, lsn pg.LSN, want uint32) {
		t.Helper()
		n, ok, err := tl.Nblocks(ctx, rel, lsn)
		if err != nil || !ok || n != want {
			t.Fatalf("%s at %s: %d blocks, exists %v, %v; want %d", rel, lsn, n, ok, err, want)
		}
	}
	check(tl, empty, LatestLSN, 0)
	check(tl, grown, LatestLSN, 6)
	// A truncation sent with no pages at a later W.
	if _, err := tl.PutPages(ctx, nil, SizeWrite{Rel: grown, Nblocks: 2, W: 200}); err != nil {
		t.Fatal(err)
	}
	check(tl, grown, LatestLSN, 2)
	check(tl, grown, 150, 6)
	// A drop sent the same way.
	if _, err := tl.PutPages(ctx, nil, SizeWrite{Rel: empty, W: 300, Drop: true}); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := tl.Nblocks(ctx, empty, LatestLSN); err != nil || ok {
		t.Fatalf("dropped %s: %d blocks, exists %v, %v", empty, n, ok, err)
	}
	check(tl, empty, 250, 0)
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl = openT(t, dir, commit, nil, pg.TimelineID{7}, nil, 0)
	defer tl.Close()
	if _, ok, err := tl.Nblocks(ctx, empty, LatestLSN); err != nil || ok {
		t.Fatalf("dropped %s after reopen: exists %v, %v", empty, ok, err)
	}
	check(tl, grown, LatestLSN, 2)
	got, err := tl.GetPage(ctx, grown.Page(1), LatestLSN, 0)
	if err != nil || got[0] != 2 {
		t.Fatalf("block 1 after reopen: %v", err)
	}
}
