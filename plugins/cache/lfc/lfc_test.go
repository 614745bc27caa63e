package lfc

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/cache/cachetest"
	"github.com/stratadb/strata/sdk/pg"
)

func newCache(t testing.TB, cfg Config, opts Options) *Cache {
	t.Helper()
	c, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestAcceptance(t *testing.T) {
	type variant struct {
		tier         string
		chunk, parts int
		pol          string
	}
	variants := []variant{
		{TierRAM, 1, 1, "lru"},
		{TierRAM, 1, 16, "s3fifo"},
		{TierRAM, 16, 4, "clock"},
		{TierRAM, 128, 2, "s3fifo"},
		{TierDisk, 1, 4, "lru"},
		{TierDisk, 16, 1, "s3fifo"},
		{TierDisk, 8, 8, "clock"},
	}
	for _, v := range variants {
		name := fmt.Sprintf("%s/chunk=%d/parts=%d/%s", v.tier, v.chunk, v.parts, v.pol)
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			n := 0
			cfg := Config{Tier: v.tier, ChunkPages: v.chunk, Partitions: v.parts, Policy: v.pol}
			cachetest.RunOptions(t, func(t *testing.T, capacity int64) cache.Cache {
				cfg := cfg
				cfg.SizeBytes = capacity
				n++
				cfg.Path = filepath.Join(dir, fmt.Sprintf("lfc%d", n))
				c, err := New(cfg, Options{})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}, cachetest.Options{Unit: cfg.ChunkBytes(), MinUnits: v.parts, Duration: 150 * time.Millisecond})
		})
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Partitions = 0 }, "lfc.partitions: must be >= 1"},
		{func(c *Config) { c.SizeBytes = -1 }, "lfc.size_bytes:"},
		{func(c *Config) { c.Tier = "ssd" }, "lfc.tier:"},
		{func(c *Config) { c.Tier = TierDisk }, "lfc.path: required"},
		{func(c *Config) { c.ChunkPages = 0 }, "lfc.chunk_pages:"},
		{func(c *Config) { c.ChunkPages = 129 }, "lfc.chunk_pages:"},
		{func(c *Config) { c.Policy = "arc" }, "lfc.policy:"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want prefix %q", c, err, tc.want)
		}
		if _, err := New(c, Options{}); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
}

// TestMatchesReference applies one random sequence of operations to the LFC
// (large enough never to evict) and to cache.Memory and demands the same
// answer from every Get.
func TestMatchesReference(t *testing.T) {
	for _, chunk := range []int{1, 4, 128} {
		t.Run(fmt.Sprint("chunk=", chunk), func(t *testing.T) {
			cfg := Config{SizeBytes: 4 << 20 * int64(chunk), Tier: TierRAM, ChunkPages: chunk, Partitions: 3, Policy: "lru"}
			if chunk == 4 {
				cfg.Tier, cfg.Path = TierDisk, filepath.Join(t.TempDir(), "lfc")
			}
			c := newCache(t, cfg, Options{})
			ref, _ := cache.NewMemory(1 << 30)
			r := rand.New(rand.NewPCG(9, uint64(chunk)))
			a, b := make([]byte, pg.BlockSize), make([]byte, pg.BlockSize)
			for op := 0; op < 5000; op++ {
				k := pg.PageKey{Spc: 1663, DB: 5, Rel: uint32(r.IntN(3)), Fork: pg.ForkNumber(r.IntN(2)), Block: uint32(r.IntN(300))}
				switch x := r.IntN(100); {
				case x < 50:
					h1, err1 := c.Get(k, a)
					h2, _ := ref.Get(k, b)
					if err1 != nil || h1 != h2 || (h1 && string(a) != string(b)) {
						t.Fatalf("op %d Get(%v): lfc %v %v, reference %v", op, k, h1, err1, h2)
					}
				case x < 90:
					p := cachetest.Page(k, uint32(op))
					lsn := pg.LSN(r.IntN(1000))
					if err := c.Put(k, p, lsn); err != nil {
						t.Fatal(err)
					}
					_ = ref.Put(k, p, lsn)
				case x < 97:
					_ = c.Invalidate(k)
					_ = ref.Invalidate(k)
				default:
					from := uint32(r.IntN(300))
					_ = c.InvalidateRel(k.Tag(), from)
					_ = ref.InvalidateRel(k.Tag(), from)
				}
			}
			if err := c.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			cs, rs := c.Stats(), ref.Stats()
			if cs.Pages != rs.Pages || cs.Hits != rs.Hits || cs.StalePuts != rs.StalePuts || cs.Invalidations != rs.Invalidations {
				t.Fatalf("stats differ:\nlfc %+v\nref %+v", cs, rs)
			}
		})
	}
}

// TestShrinkKeepsHotPages: shrinking evicts by the policy, so pages just hit
// survive a shrink to half, with their bytes (which moved slots) intact.
func TestShrinkKeepsHotPages(t *testing.T) {
	for _, tier := range []string{TierRAM, TierDisk} {
		t.Run(tier, func(t *testing.T) {
			cfg := Config{SizeBytes: 64 * pg.BlockSize, Tier: tier, Path: filepath.Join(t.TempDir(), "f"),
				ChunkPages: 1, Partitions: 1, Policy: "lru"}
			c := newCache(t, cfg, Options{})
			key := func(i int) pg.PageKey { return pg.PageKey{Spc: 1663, DB: 1, Rel: 1, Block: uint32(i)} }
			for i := 0; i < 64; i++ {
				if err := c.Put(key(i), cachetest.Page(key(i), 1), 0); err != nil {
					t.Fatal(err)
				}
			}
			dst := make([]byte, pg.BlockSize)
			for i := 0; i < 64; i += 2 { // the even pages are hot
				if hit, _ := c.Get(key(i), dst); !hit {
					t.Fatalf("page %d missing before the shrink", i)
				}
			}
			if err := c.Resize(32 * pg.BlockSize); err != nil {
				t.Fatal(err)
			}
			if err := c.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 64; i++ {
				hit, err := c.Get(key(i), dst)
				if err != nil {
					t.Fatal(err)
				}
				if hit != (i%2 == 0) {
					t.Fatalf("page %d: hit=%v after the shrink", i, hit)
				}
				if hit {
					if _, err := cachetest.CheckPage(key(i), dst); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tier == TierDisk {
				fi, err := os.Stat(cfg.Path)
				if err != nil || fi.Size() != 32*pg.BlockSize {
					t.Fatalf("disk file after shrink: %v %v", fi.Size(), err)
				}
			}
		})
	}
}

func TestDiskFileLifecycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lfc.bin")
	if err := os.WriteFile(path, []byte("old contents"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{SizeBytes: 10 << 20, Tier: TierDisk, Path: path, ChunkPages: 128, Partitions: 4, Policy: "clock"}
	c, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 10<<20 {
		t.Fatalf("file size %d (%v), want 10 MiB", fi.Size(), err)
	}
	if err := c.Resize(20<<20 + 5); err != nil {
		t.Fatal(err)
	}
	if fi, _ = os.Stat(path); fi.Size() != 20<<20 {
		t.Fatalf("file size %d after growing to 20 MiB", fi.Size())
	}
	if st := c.Stats(); st.CapacityBytes != 20<<20 {
		t.Fatalf("capacity %d", st.CapacityBytes)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("file still there after Close: %v", err)
	}
	// An unwritable path fails New.
	cfg.Path = filepath.Join(t.TempDir(), "missing", "dir", "f")
	if _, err := New(cfg, Options{}); err == nil {
		t.Fatal("New with a path in a missing directory succeeded")
	}
}

// TestChunkAccounting: with 16-page chunks, one page per chunk uses a whole
// chunk of capacity, and a full chunk counts once.
func TestChunkAccounting(t *testing.T) {
	c := newCache(t, Config{SizeBytes: 4 * 16 * pg.BlockSize, Tier: TierRAM, ChunkPages: 16, Partitions: 1, Policy: "lru"}, Options{})
	page := make([]byte, pg.BlockSize)
	for blk := uint32(0); blk < 16; blk++ {
		_ = c.Put(pg.PageKey{Rel: 1, Block: blk}, page, 0)
	}
	_ = c.Put(pg.PageKey{Rel: 2, Block: 3}, page, 0)
	st := c.Stats()
	if st.Pages != 17 || st.UsedBytes != 2*16*pg.BlockSize {
		t.Fatalf("stats %+v, want 17 pages in 2 chunks", st)
	}
	for r := uint32(3); r < 6; r++ {
		_ = c.Put(pg.PageKey{Rel: r}, page, 0)
	}
	st = c.Stats()
	if st.Evictions != 1 || st.Pages != 4 {
		// the LRU chunk (rel 1, 16 pages) goes first
		t.Fatalf("stats %+v, want the 16-page chunk evicted", st)
	}
}

// TestWaitAccounting: with one partition and many goroutines the lock is
// contended and the waits show; reads and writes are counted exactly.
func TestWaitAccounting(t *testing.T) {
	w, err := cache.NewWaits("getpage", cache.WaitLFCLock, cache.WaitLFCRead, cache.WaitLFCWrite)
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(t, Config{SizeBytes: 1 << 20, Tier: TierRAM, ChunkPages: 1, Partitions: 1, Policy: "clock"}, Options{Waits: w})
	if c.Waits() != w {
		t.Fatal("cache does not use the Waits it was given")
	}
	k := pg.PageKey{Rel: 1}
	if err := c.Put(k, make([]byte, pg.BlockSize), 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	const g, n = 8, 2000
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, pg.BlockSize)
			for j := 0; j < n; j++ {
				_, _ = c.Get(k, dst)
			}
		}()
	}
	wg.Wait()
	if r := w.Get(cache.WaitLFCRead); r.Count != g*n || r.Total <= 0 {
		t.Fatalf("lfc_read %+v, want %d", r, g*n)
	}
	if wr := w.Get(cache.WaitLFCWrite); wr.Count != 1 {
		t.Fatalf("lfc_write %+v, want 1", wr)
	}
	if l := w.Get(cache.WaitLFCLock); l.Count == 0 || l.Total <= 0 {
		t.Logf("no contended acquisitions seen (possible on one core): %+v", l)
	}
	if gp := w.Get("getpage"); gp.Count != 0 {
		t.Fatalf("getpage %+v", gp)
	}
	// A Waits without the LFC kinds is refused.
	w2, _ := cache.NewWaits("getpage")
	if _, err := New(DefaultConfig(), Options{Waits: w2}); err == nil {
		t.Fatal("New accepted a Waits without lfc kinds")
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := New(Config{SizeBytes: 1 << 20, Tier: TierRAM, ChunkPages: 1, Partitions: 2, Policy: "lru"},
		Options{Registry: reg, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	k := pg.PageKey{Rel: 1}
	_ = c.Put(k, make([]byte, pg.BlockSize), 0)
	_, _ = c.Get(k, make([]byte, pg.BlockSize))
	_, _ = c.Get(pg.PageKey{Rel: 2}, make([]byte, pg.BlockSize))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetValue() + "}"
			}
			if m.Counter != nil {
				got[name] = m.GetCounter().GetValue()
			} else {
				got[name] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		"strata_lfc_hits_total": 1, "strata_lfc_misses_total": 1, "strata_lfc_puts_total": 1,
		"strata_lfc_pages": 1, "strata_lfc_capacity_bytes": 1 << 20,
		"strata_wait_events_total{lfc_read}": 1, "strata_wait_events_total{lfc_write}": 1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close unregisters: a second cache can register on the same registry.
	c2, err := New(DefaultConfig(), Options{Registry: reg})
	if err != nil {
		t.Fatalf("second cache on the same registry: %v", err)
	}
	_ = c2.Close()
}

// TestKeys: Keys lists exactly the pages held (not the other pages of their
// chunks, not invalidated ones) and stops at max.
func TestKeys(t *testing.T) {
	c := newCache(t, Config{SizeBytes: 64 * 8192 * 16, Tier: TierRAM, ChunkPages: 16, Partitions: 4, Policy: "lru"}, Options{})
	page := make([]byte, pg.BlockSize)
	a := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	b := pg.RelTag{Spc: 1663, DB: 5, Rel: 16390, Fork: pg.FSMFork}
	want := map[pg.PageKey]bool{}
	for _, k := range []pg.PageKey{a.Page(0), a.Page(3), a.Page(17), a.Page(40), b.Page(1), b.Page(2)} {
		if err := c.Put(k, page, pg.InvalidLSN); err != nil {
			t.Fatal(err)
		}
		want[k] = true
	}
	if err := c.Invalidate(a.Page(17)); err != nil {
		t.Fatal(err)
	}
	delete(want, a.Page(17))
	got := c.Keys(0)
	if len(got) != len(want) {
		t.Fatalf("Keys(0) = %v, want the %d pages %v", got, len(want), want)
	}
	for _, k := range got {
		if !want[k] {
			t.Errorf("Keys lists %s, which the cache does not hold", k)
		}
	}
	if got := c.Keys(2); len(got) != 2 {
		t.Errorf("Keys(2) returned %d keys", len(got))
	}
}
