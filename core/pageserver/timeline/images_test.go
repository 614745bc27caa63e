package timeline

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestImagePassRewritesChangedRanges: after the first image pass (the
// whole key space), a pass rewrites only the ranges that changed since
// their image: where delta layers landed, and where a dropped relation
// still has pages (not where a delta file's range merely spans). The
// other ranges keep their image files; every read
// gives what it gave before, at every LSN GC keeps; GC drops the old
// images and deltas of the rewritten ranges; a pass with nothing changed
// writes nothing.
func TestImagePassRewritesChangedRanges(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	o := smallOpts()
	o.LayerTargetSize = 8 * pg.BlockSize // about 8 pages per image file
	tl, err := Open(ctx, pg.TimelineID{0x1A}, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { tl.Close() }()
	a := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	gone := pg.RelTag{Spc: 1663, DB: 5, Rel: 16385}
	b := pg.RelTag{Spc: 1663, DB: 5, Rel: 16386}
	want := map[pg.PageKey][]byte{}
	put := func(w pg.LSN, r pg.RelTag, blocks []uint32, v byte) {
		t.Helper()
		var ws []PageWrite
		for _, blk := range blocks {
			ws = append(ws, PageWrite{Page: r.Page(blk), W: w, Data: page(v)})
			want[r.Page(blk)] = page(v)
		}
		if _, err := tl.PutPages(ctx, ws); err != nil {
			t.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	span := func(n int) []uint32 {
		var bs []uint32
		for i := 0; i < n; i++ {
			bs = append(bs, uint32(i))
		}
		return bs
	}
	check := func(what string) {
		t.Helper()
		for pk, v := range want {
			got, err := tl.GetPage(ctx, pk, LatestLSN, 0)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("%s: page %v: %v (first byte %v, want %d)", what, pk, err, got[:min(1, len(got))], v[0])
			}
		}
	}
	// images returns the image files at lsn.
	images := func(lsn pg.LSN) (ds []layer.Desc, size int64) {
		for _, d := range tl.Layers() {
			if d.Kind == layer.ImageLayer && d.LSNStart == lsn {
				ds = append(ds, d)
				size += d.Size
			}
		}
		return ds, size
	}
	pass := func() pg.LSN {
		t.Helper()
		lsn := tl.LSNs().Durable
		if err := tl.CreateImageLayer(ctx, lsn); err != nil {
			t.Fatal(err)
		}
		if _, err := tl.GC(ctx); err != nil {
			t.Fatal(err)
		}
		return lsn
	}

	put(100, a, span(64), 1)
	put(100, gone, span(32), 2)
	put(100, b, span(64), 3)
	if p := tl.planImages(ctx, tl.LSNs().Durable, nil); !p.full {
		t.Fatalf("a timeline without images plans %+v, want the whole key space", p)
	}
	l1 := pass()
	first, firstBytes := images(l1)
	if len(first) < 15 || firstBytes < 160*pg.BlockSize {
		t.Fatalf("first pass: %d files, %d bytes; want about 20 files of 160 pages", len(first), firstBytes)
	}
	check("after the first pass")
	if p := tl.planImages(ctx, tl.LSNs().Durable+1, nil); p.full || len(p.ranges) != 0 || p.partitions != len(first) {
		t.Fatalf("nothing changed, yet the plan is %+v", p)
	}

	// Two pages of a change: only the range(s) holding them are rewritten.
	put(200, a, []uint32{3, 4}, 9)
	n, db, img := tl.deltasSinceImage()
	if n != 1 || db == 0 || img == 0 || img > 2*(8+1)*pg.BlockSize+4096 {
		t.Fatalf("after 2 pages: %d deltas, %d bytes, %d image bytes to replace (of %d)", n, db, img, firstBytes)
	}
	l2 := pass()
	second, secondBytes := images(l2)
	if len(second) == 0 || secondBytes > 2*(8+1)*pg.BlockSize+4096 {
		t.Fatalf("second pass wrote %d files, %d bytes; want the range of a's blocks 3-4 only", len(second), secondBytes)
	}
	for _, d := range second {
		if d.Keys.Overlaps(keyspace.RelRange(b)) {
			t.Fatalf("second pass rewrote %s, which holds b's pages: b did not change", d.Keys)
		}
	}
	check("after the second pass")
	if got, err := tl.GetPage(ctx, a.Page(3), l1, 0); err == nil {
		t.Fatalf("read at %s below the GC cutoff gave %d, want an error", l1, got[0])
	}
	if _, kept := images(l1); kept == 0 || kept >= firstBytes {
		t.Fatalf("after GC %d bytes of the first pass's images remain, want all but the rewritten range", kept)
	}
	if p := tl.planImages(ctx, tl.LSNs().Durable+1, nil); p.full || len(p.ranges) != 0 {
		t.Fatalf("after the second pass the plan is %+v, want nothing to do", p)
	}

	// A pass with nothing changed writes nothing.
	before := len(tl.Layers())
	if err := tl.CreateImageLayer(ctx, tl.LSNs().Durable); err != nil {
		t.Fatal(err)
	}
	if got := len(tl.Layers()); got != before {
		t.Fatalf("a pass with nothing changed went from %d to %d layer files", before, got)
	}

	// gone is dropped: the drop's delta touches one range (its size key),
	// its 32 pages span four; all are rewritten without them.
	if err := tl.DropRel(ctx, gone, 300); err != nil {
		t.Fatal(err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, blk := range span(32) {
		delete(want, gone.Page(blk))
	}
	l3 := pass()
	third, _ := images(l3)
	for _, d := range third {
		if !d.Keys.Overlaps(keyspace.RelRange(gone)) {
			t.Fatalf("the drop's pass rewrote %s, which holds none of gone's keys", d.Keys)
		}
	}
	var holding int64
	for _, d := range tl.Layers() {
		if d.Keys.Overlaps(keyspace.RelRange(gone)) {
			holding += d.Size
		}
	}
	// The ranges at gone's edges also hold a's and b's pages: at most two
	// files' worth, where gone's own pages were 32.
	if holding > 2*(8+1)*pg.BlockSize+8192 {
		t.Fatalf("after the drop's pass and GC, %d bytes of layers overlap gone's key range", holding)
	}
	check("after the drop's pass")
	if p := tl.planImages(ctx, tl.LSNs().Durable+1, nil); p.full || len(p.ranges) != 0 || p.partitions < len(first)-4 {
		t.Fatalf("after the drop's pass the plan is %+v", p)
	}

	// A restart keeps the tiling: the next change is again one range.
	tl.Close()
	if tl, err = Open(ctx, pg.TimelineID{0x1A}, tl.dir, o, Deps{Log: zerolog.Nop(), Commit: commit}); err != nil {
		t.Fatal(err)
	}
	// (Read now, with the page cache empty: before, it still held the
	// dropped pages read above, which reads of a dropped relation may
	// give.)
	for _, blk := range span(32) {
		if _, err := tl.GetPage(ctx, gone.Page(blk), LatestLSN, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("dropped page %d: %v, want ErrNotFound", blk, err)
		}
	}
	put(400, b, []uint32{63}, 7)
	l4 := pass()
	if fourth, size := images(l4); len(fourth) == 0 || size > 2*(8+1)*pg.BlockSize+4096 {
		t.Fatalf("after a restart a one-page change rewrote %d files, %d bytes", len(fourth), size)
	}
	check("after the restart's pass")

	// Delta files with a page of a and a page of b span the ranges of a's
	// other pages; only the two ranges with their keys are rewritten.
	// Compaction splits its output at the image ranges, so that GC can
	// drop it once those two are rewritten.
	for w := pg.LSN(500); w <= 510; w += 10 {
		var ws []PageWrite
		for _, r := range []pg.RelTag{a, b} {
			ws = append(ws, PageWrite{Page: r.Page(0), W: w, Data: page(byte(w))})
			want[r.Page(0)] = page(byte(w))
		}
		if _, err := tl.PutPages(ctx, ws); err != nil {
			t.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := tl.Compact(ctx, true); err != nil {
		t.Fatal(err)
	}
	front := imageFrontier(func() (hs []*handle) {
		for _, h := range tl.layers.All() {
			if !h.desc.IsDelta() {
				hs = append(hs, h)
			}
		}
		return hs
	}())
	for _, d := range tl.Layers() {
		if !d.IsDelta() {
			continue
		}
		in := false
		for _, f := range front {
			in = in || f.desc.Keys.Covers(d.Keys)
		}
		if !in {
			t.Fatalf("delta file %s (level %d) crosses the image ranges", d.Keys, d.Level)
		}
	}
	l5 := pass()
	// Their two ranges, and b's last: the delta of block 63, at the LSN of
	// the last pass (which hides it, but GC keeps what is at the cutoff),
	// went into the compaction's output with the newer ones.
	if fifth, size := images(l5); len(fifth) == 0 || size > 3*(8+1)*pg.BlockSize+8192 {
		t.Fatalf("two pages far apart in delta files rewrote %d files, %d bytes; want their two ranges (and b's last)", len(fifth), size)
	}
	// What is left of the delta files (at the cutoff, which GC keeps) is
	// hidden by the new images: GC drops it once the cutoff moves on.
	for _, d := range tl.Layers() {
		if !d.IsDelta() {
			continue
		}
		var cover []keyspace.Range
		for _, im := range tl.Layers() {
			if !im.IsDelta() && imageHides(im, d) && im.Keys.Overlaps(d.Keys) {
				cover = append(cover, im.Keys)
			}
		}
		if !covers(cover, d.Keys) {
			t.Fatalf("delta file %s [%s, %s) is not hidden by the images after the pass", d.Keys, d.LSNStart, d.LSNEnd)
		}
	}
	check("after the spanning deltas' pass")
}

// TestImagePlanRemembersDeltaKeys: the image plan looks inside a delta
// file whose range merely spans an image range, and it runs at every
// background round; it looks once per file and range, so an evicted delta
// file is not downloaded again by the next plan (which would also keep it
// from ever staying evicted).
func TestImagePlanRemembersDeltaKeys(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	o := smallOpts()
	o.LayerTargetSize = 8 * pg.BlockSize
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	tl, err := Open(ctx, pg.TimelineID{0x1B}, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { tl.Close() }()
	a := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	b := pg.RelTag{Spc: 1663, DB: 5, Rel: 16386}
	put := func(w pg.LSN, pages ...pg.PageKey) {
		t.Helper()
		var ws []PageWrite
		for _, pk := range pages {
			ws = append(ws, PageWrite{Page: pk, W: w, Data: page(byte(w))})
		}
		if _, err := tl.PutPages(ctx, ws); err != nil {
			t.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for blk := uint32(0); blk < 64; blk++ {
		put(100, a.Page(blk), b.Page(blk))
	}
	if err := tl.CreateImageLayer(ctx, tl.LSNs().Durable); err != nil {
		t.Fatal(err)
	}
	if _, err := tl.GC(ctx); err != nil {
		t.Fatal(err)
	}
	// One delta file with a's first page and b's last spans a's other
	// ranges.
	put(200, a.Page(0), b.Page(63))
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	evictAll := func() {
		t.Helper()
		tl.opts.MaxLocalBytes = 1
		tl.EvictCold()
		if n := tl.LocalBytes(); n != 0 {
			t.Fatalf("%d bytes left after eviction", n)
		}
	}
	evictAll()
	lsn := tl.LSNs().Durable
	first := tl.planImages(ctx, lsn, nil)
	if first.full || first.rewrite != 2 || first.deltas != 1 {
		t.Fatalf("plan %+v: want the two ranges of the two pages, one delta file", first)
	}
	if tl.LocalBytes() == 0 {
		t.Fatal("the first plan did not read the delta file: the test does not test what it means to")
	}
	evictAll()
	again := tl.planImages(ctx, lsn, nil)
	if n := tl.LocalBytes(); n != 0 {
		t.Fatalf("the second plan fetched %d bytes again", n)
	}
	if again.rewrite != first.rewrite || again.deltas != first.deltas || again.imageBytes != first.imageBytes || len(again.ranges) != len(first.ranges) {
		t.Fatalf("second plan %+v differs from the first %+v", again, first)
	}
}
