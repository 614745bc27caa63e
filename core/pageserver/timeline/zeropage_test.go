package timeline

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// baseRedo records the base each Apply starts from and appends the
// records to it.
type baseRedo struct{ bases [][]byte }

func (r *baseRedo) Apply(_ keyspace.Key, _ pg.LSN, base []byte, recs [][]byte) ([]byte, error) {
	r.bases = append(r.bases, bytes.Clone(base))
	out := bytes.Clone(base)
	for _, rec := range recs {
		out = append(out, rec...)
	}
	return out, nil
}

// TestZeroPages: a page of zeros from the compute (empty data, or 8 KiB of
// zeros) is stored as a tombstone of the block, without its bytes. It
// reads as zeros within the fork's size, hides the block's older versions
// as a stored zero page did, extends the fork past its end, and a WAL
// record on top of it applies to zeros; through a flush into a layer
// file, an image pass and a restart.
func TestZeroPages(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(1000)
	id := pg.TimelineID{0x2E}
	m := NewMetrics(prometheus.NewRegistry())
	redo := &baseRedo{}
	openTL := func() *Timeline {
		tl, err := Open(ctx, id, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Metrics: m, Redo: redo})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tl := openTL()
	defer func() { tl.Close() }()
	put := func(ws ...PageWrite) {
		t.Helper()
		if _, err := tl.PutPages(ctx, ws); err != nil {
			t.Fatal(err)
		}
	}
	zeros := make([]byte, pg.BlockSize)
	expect := func(blk uint32, at pg.LSN, want []byte, what string) {
		t.Helper()
		got, err := tl.GetPage(ctx, rel.Page(blk), at, 0)
		if err != nil {
			t.Fatalf("%s: block %d at %s: %v", what, blk, at, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: block %d at %s reads %d bytes starting %v, want %d starting %v", what, blk, at, len(got), got[:min(4, len(got))], len(want), want[:4])
		}
	}
	// Blocks 0 and 1 with content, then zeros over them: block 0 as 8 KiB
	// of zeros, block 1 as empty data; block 2 extends the fork with an
	// empty page.
	put(PageWrite{Page: rel.Page(0), W: 100, Data: page(1)}, PageWrite{Page: rel.Page(1), W: 100, Data: page(1)})
	put(PageWrite{Page: rel.Page(0), W: 200, Data: make([]byte, pg.BlockSize)}, PageWrite{Page: rel.Page(1), W: 200},
		PageWrite{Page: rel.Page(2), W: 200})
	if n := testutil.ToFloat64(m.zeroPages); n != 3 {
		t.Fatalf("strata_pageserver_zero_pages_total = %v, want 3", n)
	}
	check := func(what string) {
		t.Helper()
		expect(0, 150, page(1), what+", before the zeros")
		expect(1, 150, page(1), what+", before the zeros")
		for blk := uint32(0); blk < 3; blk++ {
			expect(blk, LatestLSN, zeros, what)
		}
		if n, ok, err := tl.Nblocks(ctx, rel, LatestLSN); err != nil || !ok || n != 3 {
			t.Fatalf("%s: fork has %d blocks (exists %v, %v), want 3", what, n, ok, err)
		}
		if n, _, _ := tl.Nblocks(ctx, rel, 150); n != 2 {
			t.Fatalf("%s: fork has %d blocks at 150, want 2", what, n)
		}
	}
	check("in memory")
	// Nothing but the tombstone is stored: no 8 KiB of zeros.
	cs, _, err := tl.collect(ctx, keyspace.RelBlock(rel.Page(1)), LatestLSN)
	if err != nil || len(cs) == 0 || cs[0].v.Kind != layer.Tombstone || len(cs[0].v.Data) != 0 {
		t.Fatalf("block 1's newest version: %+v, %v; want a tombstone without data", cs, err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	check("in a layer file")

	// A WAL record on top of a zero page applies to zeros.
	if _, err := tl.Put(ctx, []Change{{Key: keyspace.RelBlock(rel.Page(2)), LSN: 300, Kind: layer.Delta, Data: []byte("rec")}}); err != nil {
		t.Fatal(err)
	}
	expect(2, LatestLSN, append(bytes.Clone(zeros), "rec"...), "a record on a zero page")
	if len(redo.bases) != 1 || !bytes.Equal(redo.bases[0], zeros) {
		t.Fatalf("redo started from %d bases, want one page of zeros", len(redo.bases))
	}

	// An image pass leaves the zero pages out of its files; they read as
	// zeros above it, and as before below it.
	if err := tl.CreateImageLayer(ctx, 300); err != nil {
		t.Fatal(err)
	}
	expect(0, LatestLSN, zeros, "above the image")
	expect(1, LatestLSN, zeros, "above the image")
	expect(0, 150, page(1), "below the image")
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl = openTL()
	expect(0, LatestLSN, zeros, "after a restart")
	expect(1, 150, page(1), "after a restart, before the zeros")
	expect(2, LatestLSN, append(bytes.Clone(zeros), "rec"...), "after a restart, the record on a zero page")

	// A page of another length is still refused.
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 500, Data: []byte{1, 2, 3}}}); err == nil {
		t.Fatal("a 3-byte page was accepted")
	}
}
