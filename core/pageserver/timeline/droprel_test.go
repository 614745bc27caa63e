package timeline

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestImageLayerLeavesOutDroppedRelations: an image layer made after a
// relation was dropped holds none of its pages (before, every image layer
// copied them again: a bench that clones and drops a 400 MB database per
// run grew a cluster's layers to 39 GB), while the live relation's pages,
// a relation created again under the same number and reads below the
// drop are unchanged.
func TestImageLayerLeavesOutDroppedRelations(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl, err := Open(ctx, pg.TimelineID{0xD0}, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	live := rel
	gone := pg.RelTag{Spc: 1663, DB: 5, Rel: 16390}
	again := pg.RelTag{Spc: 1663, DB: 5, Rel: 16391}
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }
	const n = 40
	var ws []PageWrite
	for i := uint32(0); i < n; i++ {
		for j, r := range []pg.RelTag{live, gone, again} {
			ws = append(ws, PageWrite{Page: r.Page(i), W: 100, Data: page(byte(10*j + 1))})
		}
	}
	if _, err := tl.PutPages(ctx, ws); err != nil {
		t.Fatal(err)
	}
	for _, r := range []pg.RelTag{gone, again} {
		if err := tl.DropRel(ctx, r, 200); err != nil {
			t.Fatal(err)
		}
	}
	// again is created anew under the same number, with 2 pages.
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: again.Page(0), W: 300, Data: page(99)}, {Page: again.Page(1), W: 300, Data: page(98)}}); err != nil {
		t.Fatal(err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tl.CreateImageLayer(ctx, 300); err != nil {
		t.Fatal(err)
	}
	var imageBytes int64
	for _, d := range tl.Layers() {
		if d.Kind == layer.ImageLayer && d.LSNEnd > 300 {
			imageBytes += d.Size
		}
	}
	// live's 40 pages and again's 40 (its 2 new ones, and 38 of its
	// dropped incarnation: the newest size version of a fork created
	// again hides the drop, so those stay), but none of gone's 40: about
	// 80 pages, where before there were 120.
	if imageBytes > 90*pg.BlockSize || imageBytes < 80*pg.BlockSize {
		t.Fatalf("image layers at 300 hold %d bytes, want about 80 pages", imageBytes)
	}
	for i := uint32(0); i < n; i++ {
		if got, err := tl.GetPage(ctx, live.Page(i), LatestLSN, 0); err != nil || !bytes.Equal(got, page(1)) {
			t.Fatalf("live page %d: %v", i, err)
		}
		if _, err := tl.GetPage(ctx, gone.Page(i), LatestLSN, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("dropped page %d: %v, want ErrNotFound", i, err)
		}
		if got, err := tl.GetPage(ctx, gone.Page(i), 150, 0); err != nil || !bytes.Equal(got, page(11)) {
			t.Fatalf("dropped page %d read below the drop: %v", i, err)
		}
	}
	for i, want := range []byte{99, 98} {
		if got, err := tl.GetPage(ctx, again.Page(uint32(i)), LatestLSN, 0); err != nil || !bytes.Equal(got, page(want)) {
			t.Fatalf("re-created page %d: %v", i, err)
		}
	}
	// With no history kept, GC deletes the older layers, and with them
	// the dropped pages: what is left is about the image.
	tl.opts.GCHorizon, tl.opts.PITR = 0, 0
	var before int64
	for _, d := range tl.Layers() {
		before += d.Size
	}
	if _, err := tl.GC(ctx); err != nil {
		t.Fatal(err)
	}
	var after int64
	for _, d := range tl.Layers() {
		after += d.Size
	}
	if after > 90*pg.BlockSize {
		t.Fatalf("after GC the layers hold %d bytes (%d before), want about 80 pages", after, before)
	}
	t.Logf("layers: %d bytes before GC, %d after", before, after)
	for i := uint32(0); i < n; i++ {
		if got, err := tl.GetPage(ctx, live.Page(i), LatestLSN, 0); err != nil || !bytes.Equal(got, page(1)) {
			t.Fatalf("live page %d after GC: %v", i, err)
		}
	}
}
