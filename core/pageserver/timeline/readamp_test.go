package timeline

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// readAmpTimeline writes an image of each of keys keys into a first L0
// layer, then l0 more L0 layers, each holding a delta for a random quarter
// of the keys, and returns the timeline (page cache off) and the keys.
func readAmpTimeline(tb testing.TB, keys, l0 int) (*Timeline, []keyspace.Key) {
	commit := &CommitLSN{}
	commit.Set(1 << 60)
	o := smallOpts()
	o.CheckpointDistance = 1 << 40
	o.LayerTargetSize = 1 << 20
	o.CompactionThreshold = 1 << 20 // compaction only when forced
	o.CacheBytes = 1                // no page cache: every read walks the layers
	tl, err := Open(context.Background(), pg.TimelineID{0xA3}, tb.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tl.Close() })
	ctx := context.Background()
	ks := make([]keyspace.Key, keys)
	var cs []Change
	lsn := pg.LSN(0x1000)
	for i := range ks {
		ks[i] = keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1, Block: uint32(i)})
		cs = append(cs, Change{Key: ks[i], LSN: lsn, Kind: layer.Image, Data: make([]byte, 512)})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for l := 0; l <= l0; l++ {
		if l > 0 {
			cs = cs[:0]
			for _, i := range rng.Perm(keys)[:keys/4] {
				lsn += 8
				cs = append(cs, Change{Key: ks[i], LSN: lsn, Kind: layer.Delta, Data: []byte("delta-16-bytes..")})
			}
		}
		if err := tl.Ingest(ctx, cs, lsn); err != nil {
			tb.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	return tl, ks
}

// layersPerRead reads every key at the latest LSN and returns the mean
// number of layer files a read consulted.
func layersPerRead(tb testing.TB, tl *Timeline, ks []keyspace.Key) float64 {
	ctx := context.Background()
	total := 0
	for _, k := range ks {
		_, n, err := tl.collect(ctx, k, LatestLSN)
		if err != nil {
			tb.Fatal(err)
		}
		total += n
	}
	return float64(total) / float64(len(ks))
}

// TestCompactionCutsReadAmplification checks that compacting 16 L0
// layers leaves reads consulting about one layer and the same values.
func TestCompactionCutsReadAmplification(t *testing.T) {
	tl, ks := readAmpTimeline(t, 400, 16)
	ctx := context.Background()
	want := map[keyspace.Key]string{}
	for _, k := range ks {
		v, err := tl.Get(ctx, k, LatestLSN)
		if err != nil {
			t.Fatal(err)
		}
		want[k] = string(v)
	}
	before := layersPerRead(t, tl, ks)
	if err := tl.Compact(ctx, true); err != nil {
		t.Fatal(err)
	}
	after := layersPerRead(t, tl, ks)
	if before < 16 || after > 1.5 {
		t.Fatalf("layers per read: %.2f before compaction, %.2f after; want >= 16 and about 1", before, after)
	}
	for _, k := range ks {
		v, err := tl.Get(ctx, k, LatestLSN)
		if err != nil || string(v) != want[k] {
			t.Fatalf("%s after compaction: %d bytes, %v; want %d bytes", k, len(v), err, len(want[k]))
		}
	}
	t.Logf("layers per read: %.2f with 17 L0 layers, %.2f after compaction", before, after)
}

// BenchmarkReadAmplification measures uncached reads (page cache off) of
// 4,000 keys spread over 1 image L0 layer and 32 delta L0 layers, then
// after compaction into L1; it reports layer files consulted per read.
func BenchmarkReadAmplification(b *testing.B) {
	tl, ks := readAmpTimeline(b, 4000, 32)
	ctx := context.Background()
	run := func(b *testing.B) {
		amp := layersPerRead(b, tl, ks)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := tl.Get(ctx, ks[i%len(ks)], LatestLSN); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(amp, "layers/read")
	}
	b.Run("l0", run)
	if err := tl.Compact(ctx, true); err != nil {
		b.Fatal(err)
	}
	b.Run("compacted", run)
}

// TestRedoDeltasPerReadMetric checks strata_pageserver_redo_deltas_per_read:
// a page with a base image and three deltas, read once uncached, is one
// observation of 3; a page with only an image is one observation of 0; a
// cached read and a relation size read observe nothing.
func TestRedoDeltasPerReadMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	commit := &CommitLSN{}
	commit.Set(1 << 60)
	tl, err := Open(context.Background(), pg.TimelineID{0xA4}, t.TempDir(), smallOpts(),
		Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}, Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	ctx := context.Background()
	rebuilt := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 7, Block: 0})
	imaged := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 7, Block: 1})
	size := keyspace.RelSize(pg.RelTag{Spc: 1663, DB: 1, Rel: 7})
	cs := []Change{
		{Key: rebuilt, LSN: 0x100, Kind: layer.Image, Data: []byte("base")},
		{Key: imaged, LSN: 0x100, Kind: layer.Image, Data: []byte("only")},
		{Key: size, LSN: 0x100, Kind: layer.Image, Data: []byte{0, 0, 0, 2}},
		{Key: rebuilt, LSN: 0x108, Kind: layer.Delta, Data: []byte("+a")},
		{Key: rebuilt, LSN: 0x110, Kind: layer.Delta, Data: []byte("+b")},
		{Key: rebuilt, LSN: 0x118, Kind: layer.Delta, Data: []byte("+c")},
	}
	if err := tl.Ingest(ctx, cs, 0x118); err != nil {
		t.Fatal(err)
	}
	for _, k := range []keyspace.Key{rebuilt, imaged, size} {
		if _, err := tl.Get(ctx, k, 0x118); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tl.Get(ctx, rebuilt, LatestLSN); err != nil { // page cache hit
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, mf := range mfs {
		if mf.GetName() != "strata_pageserver_redo_deltas_per_read" {
			continue
		}
		found = true
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 2 || h.GetSampleSum() != 3 {
			t.Fatalf("deltas per read: %d observations summing to %v, want 2 summing to 3", h.GetSampleCount(), h.GetSampleSum())
		}
		for _, b := range h.GetBucket() {
			want := uint64(0)
			switch {
			case b.GetUpperBound() >= 3:
				want = 2
			case b.GetUpperBound() >= 0:
				want = 1
			}
			if b.GetCumulativeCount() != want {
				t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
			}
		}
	}
	if !found {
		t.Fatal("strata_pageserver_redo_deltas_per_read is not registered")
	}
}
