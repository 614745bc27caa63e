package timeline

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/pg"
)

// TestWriteBelowImageLayer: a compute write that arrives with a W below an
// image layer made before it (a late write) is stored at the image's LSN,
// above the image, so reads at the latest LSN return it, before and after
// a restart. Stored at its own W, the image hid it: every read at or above
// the image's LSN returned the image's older page.
func TestWriteBelowImageLayer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(1000)
	id := pg.TimelineID{0x1A}
	m := NewMetrics(prometheus.NewRegistry())
	openTL := func() *Timeline {
		tl, err := Open(ctx, id, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	put := func(tl *Timeline, blk uint32, w pg.LSN, b byte) {
		t.Helper()
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(blk), W: w, Data: page(b)}}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(tl *Timeline, blk uint32, at pg.LSN, b byte, what string) {
		t.Helper()
		got, err := tl.GetPage(ctx, rel.Page(blk), at, 0)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, page(b)) {
			t.Fatalf("%s: blk %d at %s reads page %d, want %d", what, blk, at, got[0], b)
		}
	}
	tl := openTL()
	put(tl, 0, 100, 1)
	put(tl, 1, 100, 1)
	// Another write of the compute takes the durable LSN to 300, and the
	// pageserver makes an image layer there.
	put(tl, 2, 300, 1)
	if err := tl.CreateImageLayer(ctx, 300); err != nil {
		t.Fatal(err)
	}
	// The late write: block 0 as of W=200.
	put(tl, 0, 200, 2)
	expect(tl, 0, LatestLSN, 2, "late write, latest")
	expect(tl, 0, 300, 2, "late write, at the image's LSN")
	expect(tl, 0, 250, 1, "late write, between its W and the image") // the documented cost
	if n := testutil.ToFloat64(m.raisedWrites); n != 1 {
		t.Fatalf("strata_pageserver_writes_raised_total = %v, want 1", n)
	}
	// A write above the image keeps its W.
	put(tl, 2, 400, 2)
	expect(tl, 2, 350, 1, "write above the image, before its W")
	expect(tl, 2, LatestLSN, 2, "write above the image, latest")
	if n := testutil.ToFloat64(m.raisedWrites); n != 1 {
		t.Fatalf("a write above the image was raised: %v raised", n)
	}
	// After a restart the image layer's LSN still holds writes below it.
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl = openTL()
	defer tl.Close()
	expect(tl, 0, LatestLSN, 2, "late write after a restart")
	put(tl, 1, 250, 2)
	expect(tl, 1, LatestLSN, 2, "late write made after a restart")
	if n := testutil.ToFloat64(m.raisedWrites); n != 2 {
		t.Fatalf("strata_pageserver_writes_raised_total = %v after the restart's late write, want 2", n)
	}
}
