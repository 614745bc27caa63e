package fusefs

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/sdk/pg"
)

func TestWaitsCollector(t *testing.T) {
	var w Waits
	w.Observe(OpGetPage, relpath.KindRel, pg.BlockSize, 3*time.Millisecond)
	w.Observe(OpGetPage, relpath.KindRel, pg.BlockSize, time.Millisecond)
	w.Observe(OpFsync, relpath.KindOther, 0, time.Second)
	w.hits.Add(5)
	if w.Count(OpGetPage, relpath.KindRel) != 2 || w.Total(OpGetPage, relpath.KindRel) != 4*time.Millisecond {
		t.Fatalf("counters: %d %v", w.Count(OpGetPage, relpath.KindRel), w.Total(OpGetPage, relpath.KindRel))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(w.Collector())
	want := `
# HELP strata_compute_fuse_ops_total FUSE operations and backend waits of the compute, by operation and file kind.
# TYPE strata_compute_fuse_ops_total counter
strata_compute_fuse_ops_total{kind="other",op="fsync"} 1
strata_compute_fuse_ops_total{kind="rel",op="getpage"} 2
# HELP strata_compute_cache_hits_total Page reads served by the compute's cache tier.
# TYPE strata_compute_cache_hits_total counter
strata_compute_cache_hits_total 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "strata_compute_fuse_ops_total", "strata_compute_cache_hits_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "strata_compute_fuse_seconds_total"); err != nil || n != 2 {
		t.Fatalf("seconds series: %d, %v", n, err)
	}
}

func TestLastWritten(t *testing.T) {
	lw := NewLastWritten(3, 100)
	k := func(b uint32) pg.PageKey { return pg.PageKey{Spc: 1663, DB: 5, Rel: 1, Block: b} }
	if lw.Get(k(0)) != 100 {
		t.Fatal("unknown page must answer the floor")
	}
	lw.Set(k(0), 200)
	lw.Set(k(1), 300)
	lw.Set(k(0), 150) // never moves back
	if lw.Get(k(0)) != 200 || lw.Get(k(1)) != 300 || lw.Get(k(2)) != 100 {
		t.Fatalf("got %v %v %v", lw.Get(k(0)), lw.Get(k(1)), lw.Get(k(2)))
	}
	lw.Set(k(2), 250)
	lw.Set(k(3), 260) // over capacity: forget all, floor = 300
	if lw.Get(k(0)) != 300 || lw.Get(k(1)) != 300 || lw.Get(k(3)) != 300 {
		t.Fatalf("after eviction: %v %v %v", lw.Get(k(0)), lw.Get(k(1)), lw.Get(k(3)))
	}
	lw.Set(k(4), 400)
	lw.SetFloor(350)
	if lw.Get(k(4)) != 400 || lw.Get(k(5)) != 350 {
		t.Fatalf("floor: %v %v", lw.Get(k(4)), lw.Get(k(5)))
	}
}

func TestMemCache(t *testing.T) {
	c := NewMemCache(2)
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 7}
	p := func(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }
	buf := make([]byte, pg.BlockSize)
	c.Put(rel.Page(0), p(1))
	c.Put(rel.Page(1), p(2))
	if !c.Get(rel.Page(0), buf) || buf[0] != 1 { // 0 is now the newest
		t.Fatal("miss on 0")
	}
	c.Put(rel.Page(2), p(3)) // evicts 1, the least recently used
	if c.Get(rel.Page(1), buf) {
		t.Fatal("LRU kept block 1")
	}
	if !c.Get(rel.Page(2), buf) || buf[0] != 3 || c.Len() != 2 {
		t.Fatal("block 2 missing")
	}
	c.Put(rel.Page(2), p(4)) // update in place
	c.Get(rel.Page(2), buf)
	if buf[0] != 4 {
		t.Fatal("update lost")
	}
	c.Forget(rel, 1)
	if c.Get(rel.Page(2), buf) || !c.Get(rel.Page(0), buf) {
		t.Fatal("Forget dropped the wrong blocks")
	}
}
