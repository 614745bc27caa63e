package timeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

func benchTimeline(b *testing.B) *Timeline { return benchTimelineAt(b, 1<<60) }

// benchTimelineAt opens a benchmark timeline whose commit LSN stays at c.
func benchTimelineAt(b *testing.B, c pg.LSN) *Timeline {
	commit := &CommitLSN{}
	commit.Set(c)
	o := smallOpts()
	o.CheckpointDistance = 1 << 40
	o.LayerTargetSize = 64 << 20
	tl, err := Open(context.Background(), pg.TimelineID{0xBE}, b.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tl.Close() })
	return tl
}

// BenchmarkIngestPages measures Ingest of 8 KiB page images in batches of
// 64 (each batch fsynced), i.e. the in-memory layer's append-only log.
func BenchmarkIngestPages(b *testing.B) {
	tl := benchTimeline(b)
	ctx := context.Background()
	data := make([]byte, pg.BlockSize)
	b.SetBytes(64 * pg.BlockSize)
	lsn := pg.LSN(0)
	for i := 0; i < b.N; i++ {
		cs := make([]Change, 64)
		for j := range cs {
			lsn += 100
			cs[j] = Change{Key: keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1, Block: uint32((i*64 + j) % 100000)}), LSN: lsn, Kind: layer.Image, Data: data}
		}
		if err := tl.Ingest(ctx, cs, lsn); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIngestDeltas measures Ingest of 100-byte WAL records in batches
// of 8192 (~800 KB of records, each batch fsynced): the decoded-WAL ingest
// path.
func BenchmarkIngestDeltas(b *testing.B) {
	tl := benchTimeline(b)
	ctx := context.Background()
	rec := make([]byte, 100)
	b.SetBytes(8192 * 100)
	lsn := pg.LSN(0)
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		cs := make([]Change, 8192)
		for j := range cs {
			lsn += 100
			cs[j] = Change{Key: keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1, Block: uint32((i*8192 + j) % 20000)}), LSN: lsn, Kind: layer.Delta, Data: rec}
		}
		if err := tl.Ingest(ctx, cs, lsn); err != nil {
			b.Fatal(err)
		}
	}
	// CPU seconds of the whole process: a figure that a busy machine's
	// wall clock does not distort.
	if cpu := (cpuTime() - cpu0).Seconds(); cpu > 0 {
		b.ReportMetric(float64(b.N)*8192*100/1e6/cpu, "MB/cpu-s")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFlush measures writing a frozen 64 MiB in-memory layer of 8 KiB
// images out as delta layer files (sort, write, fsync).
func BenchmarkFlush(b *testing.B) {
	ctx := context.Background()
	data := make([]byte, pg.BlockSize)
	const pages = 8192
	b.SetBytes(pages * pg.BlockSize)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		tl := benchTimeline(b)
		var cs []Change
		for j := 0; j < pages; j++ {
			cs = append(cs, Change{Key: keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: uint32(j % 7), Block: uint32(j)}), LSN: pg.LSN(j + 1), Kind: layer.Image, Data: data})
		}
		if err := tl.Ingest(ctx, cs, pg.LSN(pages)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := tl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateImageLayer measures a timeline's first image layer pass
// (the whole key space) over 20,000 keys of 40 relations spread over 120
// delta layers, as a pageserver holds them after many flushes: every key's
// versions are found through the layer map. The values are 64 bytes, so
// that the key walk is measured rather than the copying of 8 KiB pages.
// Each op builds a new timeline (not timed): later passes rewrite only
// what changed (BenchmarkImagePass).
func BenchmarkCreateImageLayer(b *testing.B) {
	ctx := context.Background()
	data := make([]byte, 64)
	const pages, layers = 20000, 120
	var cpu time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		tl := benchTimeline(b)
		lsn := pg.LSN(0)
		for l := 0; l < layers; l++ {
			var cs []Change
			for j := l; j < pages; j += layers / 4 {
				lsn++
				cs = append(cs, Change{Key: keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: uint32(16384 + j%40), Block: uint32(j / 40)}), LSN: lsn, Kind: layer.Image, Data: data})
			}
			if err := tl.Ingest(ctx, cs, lsn); err != nil {
				b.Fatal(err)
			}
			if err := tl.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		cpu0 := cpuTime()
		if err := tl.CreateImageLayer(ctx, lsn); err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime() - cpu0
	}
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
}

// imageBench is a timeline of 40 relations of n pages each, one delta
// file per relation (ingested as images), below its first image pass: the
// database of the image benchmarks.
type imageBench struct {
	b    *testing.B
	tl   *Timeline
	lsn  pg.LSN
	data []byte
}

func newImageBench(b *testing.B, id byte, pages int, o Options) *imageBench {
	commit := &CommitLSN{}
	commit.Set(1 << 60)
	tl, err := Open(context.Background(), pg.TimelineID{id}, b.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tl.Close() })
	ib := &imageBench{b: b, tl: tl, data: make([]byte, pg.BlockSize)}
	for r := 0; r < 40; r++ {
		ib.write([]int{r}, pages)
	}
	if err := tl.CreateImageLayer(context.Background(), ib.lsn); err != nil {
		b.Fatal(err)
	}
	return ib
}

func benchKey(r, blk int) keyspace.Key {
	return keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: uint32(16384 + r), Block: uint32(blk)})
}

// write stores pages 0 to n-1 of each relation of rels, one LSN each, and
// flushes them into a delta file.
func (ib *imageBench) write(rels []int, n int) {
	var cs []Change
	for _, r := range rels {
		for blk := 0; blk < n; blk++ {
			ib.lsn++
			ib.data[0] = byte(ib.lsn)
			cs = append(cs, Change{Key: benchKey(r, blk), LSN: ib.lsn, Kind: layer.Image, Data: ib.data})
		}
	}
	ib.ingest(cs)
}

func (ib *imageBench) ingest(cs []Change) {
	ctx := context.Background()
	if err := ib.tl.Ingest(ctx, cs, ib.lsn); err != nil {
		ib.b.Fatal(err)
	}
	if err := ib.tl.Flush(ctx); err != nil {
		ib.b.Fatal(err)
	}
}

// imageOpts are the image benchmarks' options: no flush but theirs, image
// files of target bytes, no compaction.
func imageOpts(target int64) Options {
	o := smallOpts()
	o.CheckpointDistance = 1 << 40
	o.LayerTargetSize = target
	o.CompactionThreshold = 1 << 30
	return o
}

// BenchmarkImagePass measures an image pass over a 160 MB database (40
// relations of 500 pages of 8 KiB, image files of 8 MiB) after its first
// pass, when the pages written since are those of one relation (hot: 500
// pages, 4 MB) or one page of each relation (spread: 40 pages). A pass
// rewrites the key ranges that changed: in hot about one image file's
// worth, in spread the whole database (as every pass did before passes
// went by key range). image-MB/op is what the pass wrote.
func BenchmarkImagePass(b *testing.B) {
	for _, c := range []struct {
		name string
		rels []int // relations written, by index
		n    int   // pages of each
	}{
		{"hot", []int{7}, 500},
		{"spread", func() (rs []int) {
			for r := 0; r < 40; r++ {
				rs = append(rs, r)
			}
			return rs
		}(), 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			ib := newImageBench(b, 0xBF, 500, imageOpts(8<<20))
			tl := ib.tl
			var written int64
			var cpu time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ib.write(c.rels, c.n)
				b.StartTimer()
				cpu0 := cpuTime()
				if err := tl.CreateImageLayer(ctx, ib.lsn); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime() - cpu0
				for _, d := range tl.Layers() {
					if d.Kind == layer.ImageLayer && d.LSNStart == ib.lsn {
						written += d.Size
					}
				}
			}
			b.ReportMetric(float64(written)/1e6/float64(b.N), "image-MB/op")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
		})
	}
}

// BenchmarkPutPagesCommitBehind measures one-page PutPages while the commit
// LSN stands still below every write, as during initdb on a new compute
// (no WAL reaches the safekeepers until Postgres starts): every write stays
// pending. A write must not cost time in proportion to the versions already
// pending (it did: 17 us per write at 20,000 pending, quadratic in all).
func BenchmarkPutPagesCommitBehind(b *testing.B) {
	tl := benchTimelineAt(b, 0)
	ctx := context.Background()
	data := make([]byte, pg.BlockSize)
	rel := pg.RelTag{Spc: 1663, DB: 1, Rel: 1}
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := pg.LSN(1000 + i*100)
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i % 50000)), W: w, Data: data}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// Each write is pending, and so is each size change.
	if n := tl.PendingCount(); n < b.N {
		b.Fatalf("%d pending versions after %d writes above the commit LSN", n, b.N)
	}
}

// BenchmarkImagePlan measures the image plan, which the background loop
// runs every round, with many delta files above the images: each holds a
// page of the first relation and one of the last, so its range spans
// every image range and the plan must look inside it for each. "first"
// forgets what earlier plans learnt before each one (every delta file is
// searched once per image range); "again" is every later round.
func BenchmarkImagePlan(b *testing.B) {
	for _, deltas := range []int{100, 1000} {
		for _, again := range []bool{false, true} {
			name := fmt.Sprintf("deltas=%d/first", deltas)
			if again {
				name = fmt.Sprintf("deltas=%d/again", deltas)
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				ib := newImageBench(b, 0xBE, 500, imageOpts(8<<20))
				tl := ib.tl
				for i := 0; i < deltas; i++ {
					ib.lsn += 2
					ib.ingest([]Change{
						{Key: benchKey(0, i%500), LSN: ib.lsn - 1, Kind: layer.Image, Data: ib.data},
						{Key: benchKey(39, i%500), LSN: ib.lsn, Kind: layer.Image, Data: ib.data},
					})
				}
				lsn := ib.lsn
				var p imagePlan
				p = tl.planImages(ctx, lsn, nil)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if !again {
						b.StopTimer()
						for _, h := range tl.layers.All() {
							h.keysIn = nil
						}
						b.StartTimer()
					}
					p = tl.planImages(ctx, lsn, nil)
				}
				if p.full || p.deltas != deltas || p.rewrite != 2 {
					b.Fatalf("plan %+v: want %d delta files and the two ranges of their pages", p, deltas)
				}
				b.ReportMetric(float64(p.partitions), "image-files")
			})
		}
	}
}

// BenchmarkListRels lists the relation forks of a timeline of 40
// relations of 2,500 pages each (100,000 page keys, 160 MB delta files
// below an image copy of them), as the compute does at each mount and an
// image pass does to find dropped relations.
func BenchmarkListRels(b *testing.B) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 60)
	tl, err := Open(ctx, pg.TimelineID{0xBD}, b.TempDir(), imageOpts(64<<20), Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		b.Fatal(err)
	}
	defer tl.Close()
	data := make([]byte, 64)
	lsn := pg.LSN(0)
	for r := 0; r < 40; r++ {
		rel := pg.RelTag{Spc: 1663, DB: 5, Rel: uint32(16384 + r)}
		var cs []Change
		for blk := 0; blk < 2500; blk++ {
			lsn++
			cs = append(cs, Change{Key: keyspace.RelBlock(rel.Page(uint32(blk))), LSN: lsn, Kind: layer.Image, Data: data})
		}
		lsn++
		size := make([]byte, 4)
		binary.BigEndian.PutUint32(size, 2500)
		cs = append(cs, Change{Key: keyspace.RelSize(rel), LSN: lsn, Kind: layer.Image, Data: size})
		if err := tl.Ingest(ctx, cs, lsn); err != nil {
			b.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := tl.CreateImageLayer(ctx, lsn); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rels, err := tl.ListRels(ctx, keyspace.RelsRange, LatestLSN)
		if err != nil || len(rels) != 40 {
			b.Fatalf("%d relations, %v; want 40", len(rels), err)
		}
	}
}

// BenchmarkScanKeys: ScanKeys over a million keys (the walk of a full
// image pass over an 8 GB database) in 20 interleaved delta files, then in
// the tiled image files of an image pass over them: windows of merged
// layer indexes and, for comparison, how every scan ran before (one map of
// every key, then one sorted slice: oneMapScan). peak-MB is the
// highest heap in use above the timeline's own during the scan.
func BenchmarkScanKeys(b *testing.B) {
	const keys, files = 1 << 20, 20
	ctx := context.Background()
	tl := benchTimeline(b)
	tl.opts.LayerTargetSize = 1 << 20 // tiled image files of about 25,000 keys
	data := make([]byte, 16)
	lsn := pg.LSN(0)
	for f := 0; f < files; f++ {
		var cs []Change
		for j := f; j < keys; j += files {
			lsn++
			cs = append(cs, Change{Key: keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: uint32(16384 + j%64), Block: uint32(j / 64)}), LSN: lsn, Kind: layer.Image, Data: data})
		}
		if err := tl.Ingest(ctx, cs, lsn); err != nil {
			b.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	scan := func(b *testing.B, upto pg.LSN) {
		for _, c := range []struct {
			name string
			scan func(fn func(keyspace.Key) error) error
		}{
			{"windows", func(fn func(keyspace.Key) error) error { return tl.ScanKeys(ctx, keyspace.All, upto, fn) }},
			{"one-map", func(fn func(keyspace.Key) error) error { return oneMapScan(ctx, tl, keyspace.All, upto, fn) }},
		} {
			b.Run(c.name, func(b *testing.B) {
				var peak uint64
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					runtime.GC()
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					base := ms.HeapInuse
					stop, done := make(chan struct{}), make(chan struct{})
					go func() { // sample the heap while the scan runs
						defer close(done)
						t := time.NewTicker(time.Millisecond)
						defer t.Stop()
						for {
							var ms runtime.MemStats
							runtime.ReadMemStats(&ms)
							if ms.HeapInuse > base {
								peak = max(peak, ms.HeapInuse-base)
							}
							select {
							case <-stop:
								return
							case <-t.C:
							}
						}
					}()
					b.StartTimer()
					n := 0
					if err := c.scan(func(keyspace.Key) error { n++; return nil }); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					close(stop)
					<-done
					if n != keys {
						b.Fatalf("scan found %d keys, want %d", n, keys)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(peak)/(1<<20), "peak-MB")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/key")
			})
		}
	}
	b.Run("deltas", func(b *testing.B) { scan(b, lsn) })
	if err := tl.CreateImageLayer(ctx, lsn); err != nil {
		b.Fatal(err)
	}
	// The images are the newest files: a scan below them walks the deltas
	// again, one at their LSN walks every file.
	b.Run("images", func(b *testing.B) {
		b.Logf("%d layer files", len(tl.Layers()))
		scan(b, lsn)
	})
}
