// Package cachetest is the acceptance suite of the cache.Cache contract.
// Every implementation and every configuration worth shipping runs it:
//
//	func TestAcceptance(t *testing.T) {
//		cachetest.Run(t, func(t *testing.T, capacity int64) cache.Cache {
//			c, err := lfc.New(cfgWithSize(capacity), lfc.Options{})
//			...
//			return c
//		})
//	}
//
// open must return an empty cache of the given capacity in bytes; the suite
// closes it. Capacities are multiples of Options.Unit. The suite asserts
// behaviour (exact bytes, bounds, invalidation, concurrent resizes); it is
// not a benchmark. Run it under -race.
package cachetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// Options tune the suite. The zero value suits a cache with one page per
// allocation unit.
type Options struct {
	// Unit is the implementation's allocation unit in bytes (a chunk of
	// pages of one relation fork), default pg.BlockSize. Capacities the
	// suite asks for are multiples of Unit, and a cache may hold fewer pages
	// than capacity/BlockSize when units are partly filled.
	Unit int64
	// UnitPages is how many consecutive blocks of one fork share a unit
	// (default Unit/pg.BlockSize).
	UnitPages int
	// MinUnits is how many units a cache needs per unit it must be sure to
	// keep: a cache of MinUnits*n units keeps any n units without evicting
	// (a cache of P partitions, which splits keys by hash, sets it to P).
	// Default 1.
	MinUnits int
	// Duration of the concurrency test (default 300ms).
	Duration time.Duration
}

func (o *Options) fill() {
	if o.Unit <= 0 {
		o.Unit = pg.BlockSize
	}
	if o.UnitPages <= 0 {
		o.UnitPages = int(o.Unit / pg.BlockSize)
	}
	if o.MinUnits <= 0 {
		o.MinUnits = 1
	}
	if o.Duration <= 0 {
		o.Duration = 300 * time.Millisecond
	}
}

// Open returns an empty cache of capacity bytes.
type Open func(t *testing.T, capacity int64) cache.Cache

// Run runs the suite with default options.
func Run(t *testing.T, open Open) { RunOptions(t, open, Options{}) }

// RunOptions runs the suite.
func RunOptions(t *testing.T, open Open, o Options) {
	o.fill()
	s := &suite{open: open, o: o}
	t.Run("HitMissExactBytes", s.hitMiss)
	t.Run("Arguments", s.arguments)
	t.Run("BuffersNotRetained", s.buffers)
	t.Run("Overwrite", s.overwrite)
	t.Run("StaleLSN", s.staleLSN)
	t.Run("EvictionBound", s.evictionBound)
	t.Run("Invalidate", s.invalidate)
	t.Run("InvalidateRel", s.invalidateRel)
	t.Run("Resize", s.resize)
	t.Run("ZeroCapacity", s.zeroCapacity)
	t.Run("Concurrent", s.concurrent)
	t.Run("Close", s.close)
}

type suite struct {
	open Open
	o    Options
}

// unitsFor is how many units n consecutive blocks of one fork occupy.
func (s *suite) unitsFor(n int) int { return (n + s.o.UnitPages - 1) / s.o.UnitPages }

func (s *suite) openCache(t *testing.T, units int) cache.Cache {
	t.Helper()
	c := s.open(t, int64(units)*s.o.Unit)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Page returns a deterministic page for key and version: a header naming
// both and a body derived from them, so that CheckPage can tell a torn page
// or another key's page from the right one.
func Page(key pg.PageKey, version uint32) []byte {
	p := make([]byte, pg.BlockSize)
	binary.LittleEndian.PutUint32(p[0:], key.Spc)
	binary.LittleEndian.PutUint32(p[4:], key.DB)
	binary.LittleEndian.PutUint32(p[8:], key.Rel)
	p[12] = byte(key.Fork)
	binary.LittleEndian.PutUint32(p[16:], key.Block)
	binary.LittleEndian.PutUint32(p[20:], version)
	x := uint64(key.Rel)<<32 | uint64(key.Block)
	x ^= (uint64(version)<<8 | uint64(key.Fork) | uint64(key.DB)<<40 | uint64(key.Spc)<<20) * 0x9E3779B97F4A7C15
	for i := 24; i+8 <= len(p); i += 8 {
		x += 0x9E3779B97F4A7C15 // splitmix64
		z := (x ^ x>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(p[i:], z^z>>31)
	}
	return p
}

// CheckPage returns the version of p if p is exactly Page(key, version) for
// some version, or an error.
func CheckPage(key pg.PageKey, p []byte) (uint32, error) {
	if len(p) < pg.BlockSize {
		return 0, fmt.Errorf("short page")
	}
	v := binary.LittleEndian.Uint32(p[20:])
	want := Page(key, v)
	for i := 0; i < pg.BlockSize; i++ {
		if p[i] != want[i] {
			return 0, fmt.Errorf("page for %v differs from version %d at byte %d", key, v, i)
		}
	}
	return v, nil
}

func key(rel, blk uint32) pg.PageKey {
	return pg.PageKey{Spc: pg.DefaultTablespaceOID, DB: 5, Rel: rel, Block: blk}
}

func mustPut(t *testing.T, c cache.Cache, k pg.PageKey, v uint32, lsn pg.LSN) {
	t.Helper()
	if err := c.Put(k, Page(k, v), lsn); err != nil {
		t.Fatalf("Put(%v): %v", k, err)
	}
}

// get returns (version, hit); it fails the test on errors and wrong bytes.
func get(t *testing.T, c cache.Cache, k pg.PageKey) (uint32, bool) {
	t.Helper()
	dst := make([]byte, pg.BlockSize)
	hit, err := c.Get(k, dst)
	if err != nil {
		t.Fatalf("Get(%v): %v", k, err)
	}
	if !hit {
		return 0, false
	}
	v, err := CheckPage(k, dst)
	if err != nil {
		t.Fatalf("Get(%v): %v", k, err)
	}
	return v, true
}

func wantVersion(t *testing.T, c cache.Cache, k pg.PageKey, want uint32) {
	t.Helper()
	v, hit := get(t, c, k)
	if !hit {
		t.Fatalf("Get(%v): miss, want version %d", k, want)
	}
	if v != want {
		t.Fatalf("Get(%v): version %d, want %d", k, v, want)
	}
}

func wantMiss(t *testing.T, c cache.Cache, k pg.PageKey) {
	t.Helper()
	if v, hit := get(t, c, k); hit {
		t.Fatalf("Get(%v): hit (version %d), want a miss", k, v)
	}
}

func checkBound(t *testing.T, c cache.Cache) cache.Stats {
	t.Helper()
	st := c.Stats()
	if st.UsedBytes > st.CapacityBytes || st.Pages*pg.BlockSize > st.UsedBytes || st.Pages < 0 {
		t.Fatalf("stats out of bounds: %+v", st)
	}
	return st
}

func (s *suite) hitMiss(t *testing.T) {
	c := s.openCache(t, 4*s.o.MinUnits)
	k := key(100, 7)
	wantMiss(t, c, k)
	mustPut(t, c, k, 1, 10)
	wantVersion(t, c, k, 1)
	// Neighbours (same unit, other fork, other relation) stay misses.
	wantMiss(t, c, key(100, 6))
	wantMiss(t, c, key(101, 7))
	vm := k
	vm.Fork = pg.VMFork
	wantMiss(t, c, vm)
	// A longer dst: only the first BlockSize bytes are written.
	dst := make([]byte, pg.BlockSize+100)
	for i := range dst {
		dst[i] = 0xEE
	}
	hit, err := c.Get(k, dst)
	if err != nil || !hit {
		t.Fatalf("Get with long dst: hit=%v err=%v", hit, err)
	}
	if _, err := CheckPage(k, dst); err != nil {
		t.Fatal(err)
	}
	for i := pg.BlockSize; i < len(dst); i++ {
		if dst[i] != 0xEE {
			t.Fatalf("Get wrote dst[%d] past BlockSize", i)
		}
	}
	st := checkBound(t, c)
	if st.Hits != 2 || st.Misses != 4 || st.Puts != 1 || st.Pages != 1 {
		t.Fatalf("stats %+v, want 2 hits, 4 misses, 1 put, 1 page", st)
	}
}

func (s *suite) arguments(t *testing.T) {
	c := s.openCache(t, s.o.MinUnits)
	k := key(1, 1)
	if err := c.Put(k, make([]byte, pg.BlockSize-1), 0); !errors.Is(err, cache.ErrPageSize) {
		t.Fatalf("Put short page: %v, want ErrPageSize", err)
	}
	if err := c.Put(k, make([]byte, pg.BlockSize+1), 0); !errors.Is(err, cache.ErrPageSize) {
		t.Fatalf("Put long page: %v, want ErrPageSize", err)
	}
	mustPut(t, c, k, 1, 0)
	if _, err := c.Get(k, make([]byte, pg.BlockSize-1)); !errors.Is(err, cache.ErrShortBuffer) {
		t.Fatalf("Get short dst: %v, want ErrShortBuffer", err)
	}
	if err := c.Resize(-1); !errors.Is(err, cache.ErrBadSize) {
		t.Fatalf("Resize(-1): %v, want ErrBadSize", err)
	}
	wantVersion(t, c, k, 1)
}

func (s *suite) buffers(t *testing.T) {
	c := s.openCache(t, s.o.MinUnits)
	k := key(2, 3)
	p := Page(k, 5)
	if err := c.Put(k, p, 0); err != nil {
		t.Fatal(err)
	}
	for i := range p {
		p[i] = 0
	}
	wantVersion(t, c, k, 5)
	dst := make([]byte, pg.BlockSize)
	if hit, _ := c.Get(k, dst); !hit {
		t.Fatal("miss")
	}
	for i := range dst {
		dst[i] = 1
	}
	wantVersion(t, c, k, 5)
}

func (s *suite) overwrite(t *testing.T) {
	c := s.openCache(t, 2*s.o.MinUnits)
	k := key(3, 0)
	for v := uint32(1); v <= 5; v++ {
		mustPut(t, c, k, v, 0)
		wantVersion(t, c, k, v)
	}
	if st := checkBound(t, c); st.Pages != 1 {
		t.Fatalf("%d pages after overwrites of one key", st.Pages)
	}
}

func (s *suite) staleLSN(t *testing.T) {
	c := s.openCache(t, 2*s.o.MinUnits)
	k := key(4, 9)
	mustPut(t, c, k, 1, 0x200)
	mustPut(t, c, k, 2, 0x100) // late fill at an older LSN: ignored
	wantVersion(t, c, k, 1)
	mustPut(t, c, k, 3, 0x200) // same LSN overwrites
	wantVersion(t, c, k, 3)
	mustPut(t, c, k, 4, 0x300)
	wantVersion(t, c, k, 4)
	mustPut(t, c, k, 5, pg.InvalidLSN) // unknown LSN always overwrites
	wantVersion(t, c, k, 5)
	if st := c.Stats(); st.StalePuts != 1 {
		t.Fatalf("StalePuts = %d, want 1", st.StalePuts)
	}
	// After an invalidation the old LSN is forgotten.
	mustPut(t, c, k, 6, 0x900)
	if err := c.Invalidate(k); err != nil {
		t.Fatal(err)
	}
	mustPut(t, c, k, 7, 0x10)
	wantVersion(t, c, k, 7)
}

func (s *suite) evictionBound(t *testing.T) {
	units := 4 * s.o.MinUnits
	c := s.openCache(t, units)
	capPages := int64(units) * s.o.Unit / pg.BlockSize
	n := units*4 + 50
	// Blocks 3 units apart and 1 page in: each page is alone in its unit.
	k := func(i int) pg.PageKey { return key(uint32(1000+i%7), uint32(i*3*s.o.UnitPages+1)) }
	for i := 0; i < n; i++ {
		mustPut(t, c, k(i), uint32(i), 0)
		checkBound(t, c)
	}
	wantVersion(t, c, k(n-1), uint32(n-1))
	hits := int64(0)
	for i := 0; i < n; i++ {
		if v, hit := get(t, c, k(i)); hit {
			if v != uint32(i) {
				t.Fatalf("block %d: version %d", i, v)
			}
			hits++
		}
	}
	if hits > capPages || hits > int64(units) {
		t.Fatalf("%d pages hit, one per unit, capacity is %d units of %d pages", hits, units, s.o.UnitPages)
	}
	st := checkBound(t, c)
	if st.Evictions == 0 {
		t.Fatalf("no evictions after %d puts into %d pages: %+v", n, capPages, st)
	}
	if st.Pages != hits {
		t.Fatalf("Stats.Pages = %d, but %d pages hit", st.Pages, hits)
	}
}

func (s *suite) invalidate(t *testing.T) {
	c := s.openCache(t, 2*s.o.MinUnits)
	a, b := key(5, 0), key(5, 1)
	mustPut(t, c, a, 1, 0)
	mustPut(t, c, b, 1, 0)
	if err := c.Invalidate(a); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, c, a)
	wantVersion(t, c, b, 1)
	if err := c.Invalidate(key(99, 99)); err != nil {
		t.Fatalf("Invalidate of an absent key: %v", err)
	}
	if st := checkBound(t, c); st.Pages != 1 || st.Invalidations != 1 {
		t.Fatalf("stats %+v, want 1 page, 1 invalidation", st)
	}
}

func (s *suite) invalidateRel(t *testing.T) {
	c := s.openCache(t, s.o.MinUnits*4*s.unitsFor(10))
	a := pg.RelTag{Spc: pg.DefaultTablespaceOID, DB: 5, Rel: 7}
	b := pg.RelTag{Spc: pg.DefaultTablespaceOID, DB: 5, Rel: 8}
	avm := a
	avm.Fork = pg.VMFork
	otherDB := a
	otherDB.DB = 6
	for blk := uint32(0); blk < 10; blk++ {
		for _, tag := range []pg.RelTag{a, b, avm, otherDB} {
			mustPut(t, c, tag.Page(blk), blk, 0)
		}
	}
	if err := c.InvalidateRel(a, 5); err != nil {
		t.Fatal(err)
	}
	for blk := uint32(0); blk < 10; blk++ {
		if blk < 5 {
			wantVersion(t, c, a.Page(blk), blk)
		} else {
			wantMiss(t, c, a.Page(blk))
		}
		wantVersion(t, c, b.Page(blk), blk)
		wantVersion(t, c, avm.Page(blk), blk)
		wantVersion(t, c, otherDB.Page(blk), blk)
	}
	if err := c.InvalidateRel(a, 0); err != nil {
		t.Fatal(err)
	}
	for blk := uint32(0); blk < 10; blk++ {
		wantMiss(t, c, a.Page(blk))
		wantVersion(t, c, avm.Page(blk), blk)
	}
	if st := checkBound(t, c); st.Pages != 30 || st.Invalidations != 10 {
		t.Fatalf("stats %+v, want 30 pages and 10 invalidations", st)
	}
	// A relation that was never cached.
	if err := c.InvalidateRel(pg.RelTag{Rel: 12345}, 0); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) resize(t *testing.T) {
	units := 8 * s.o.MinUnits
	c := s.openCache(t, units)
	capPages := units // one page per unit below
	k := func(i int) pg.PageKey { return key(20, uint32(i*s.o.UnitPages)) }
	fill := func(n int, v uint32) {
		for i := 0; i < n; i++ {
			mustPut(t, c, k(i), v, 0)
		}
	}
	fill(capPages, 1)
	small := int64(s.o.MinUnits) * s.o.Unit
	if err := c.Resize(small); err != nil {
		t.Fatal(err)
	}
	st := checkBound(t, c)
	if st.CapacityBytes > small || st.UsedBytes > small {
		t.Fatalf("after Resize(%d): %+v", small, st)
	}
	kept := 0
	for i := 0; i < capPages; i++ {
		if v, hit := get(t, c, k(i)); hit {
			if v != 1 {
				t.Fatalf("version %d after shrink", v)
			}
			kept++
		}
	}
	if int64(kept)*pg.BlockSize > small || kept > s.o.MinUnits {
		t.Fatalf("%d pages kept after shrinking to %d bytes", kept, small)
	}
	// Grow again: the cache takes a full load without dropping the new pages.
	big := int64(s.o.MinUnits*2*capPages) * s.o.Unit
	if err := c.Resize(big); err != nil {
		t.Fatal(err)
	}
	if st := checkBound(t, c); st.CapacityBytes != big {
		t.Fatalf("capacity %d after Resize(%d)", st.CapacityBytes, big)
	}
	before := c.Stats().Evictions
	fill(2*capPages, 2)
	if st := checkBound(t, c); st.Evictions != before {
		t.Fatalf("%d evictions filling a grown cache exactly", st.Evictions-before)
	}
	for i := 0; i < 2*capPages; i++ {
		wantVersion(t, c, k(i), 2)
	}
}

func (s *suite) zeroCapacity(t *testing.T) {
	c := s.openCache(t, 0)
	k := key(30, 1)
	mustPut(t, c, k, 1, 0)
	wantMiss(t, c, k)
	if st := checkBound(t, c); st.Pages != 0 || st.CapacityBytes != 0 {
		t.Fatalf("zero-capacity cache: %+v", st)
	}
	if err := c.Resize(int64(s.o.MinUnits) * s.o.Unit); err != nil {
		t.Fatal(err)
	}
	mustPut(t, c, k, 2, 0)
	wantVersion(t, c, k, 2)
	if err := c.Resize(0); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, c, k)
}

// concurrent runs readers and writers over a small key space while one
// goroutine resizes the cache down and up. Every hit must be an exact page
// of the key asked for, and never older than a completed Put of that key
// where the Puts of the key are ordered.
func (s *suite) concurrent(t *testing.T) {
	units := 4 * s.o.MinUnits
	c := s.openCache(t, units)
	const nkeys = 512
	const workers = 8
	// Keys below nkeys/2 are never invalidated and their Puts are
	// serialised per key (as Postgres serialises the read and the write of
	// one block through its buffer's I/O lock): a hit on one must not be
	// older than the newest Put that completed before the Get began, even
	// across evictions. Keys above are also invalidated, and Put without
	// ordering, so a hit there is only checked for exact bytes.
	var next, done [nkeys]atomic.Uint32
	var keyMu [nkeys / 2]sync.Mutex
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, workers+1)
	keyOf := func(i int) pg.PageKey { return key(uint32(40+i%5), uint32(i)) }
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			dst := make([]byte, pg.BlockSize)
			for !stop.Load() {
				i := r.IntN(nkeys)
				k := keyOf(i)
				switch op := r.IntN(10); {
				case op < 6:
					floor := done[i].Load()
					hit, err := c.Get(k, dst)
					if err != nil {
						errc <- err
						return
					}
					if hit {
						v, err := CheckPage(k, dst)
						if err != nil {
							errc <- err
							return
						}
						if i < nkeys/2 && v < floor {
							errc <- fmt.Errorf("%v: version %d after the Put of %d completed", k, v, floor)
							return
						}
					}
				case op < 9 || i < nkeys/2:
					if i < nkeys/2 {
						keyMu[i].Lock()
					}
					v := next[i].Add(1)
					err := c.Put(k, Page(k, v), pg.LSN(v))
					if i < nkeys/2 {
						keyMu[i].Unlock()
					}
					if err != nil {
						errc <- err
						return
					}
					for {
						d := done[i].Load()
						if d >= v || done[i].CompareAndSwap(d, v) {
							break
						}
					}
				default:
					if err := c.Invalidate(k); err != nil {
						errc <- err
						return
					}
				}
			}
		}(w)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		sizes := []int64{int64(units) * s.o.Unit, 0, int64(s.o.MinUnits) * s.o.Unit, int64(3*units) * s.o.Unit}
		for i := 0; !stop.Load(); i++ {
			if err := c.Resize(sizes[i%len(sizes)]); err != nil {
				errc <- err
				return
			}
			st := c.Stats()
			if st.UsedBytes > st.CapacityBytes && st.CapacityBytes == sizes[i%len(sizes)] {
				// another Resize cannot run concurrently (only this
				// goroutine resizes), so the bound must hold now.
				errc <- fmt.Errorf("after Resize: %+v", st)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(s.o.Duration)
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	checkBound(t, c)
}

func (s *suite) close(t *testing.T) {
	c := s.open(t, int64(s.o.MinUnits)*s.o.Unit)
	k := key(50, 1)
	mustPut(t, c, k, 1, 0)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Get(k, make([]byte, pg.BlockSize)); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := c.Put(k, Page(k, 1), 0); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := c.Invalidate(k); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Invalidate after Close: %v", err)
	}
	if err := c.InvalidateRel(k.Tag(), 0); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("InvalidateRel after Close: %v", err)
	}
	if err := c.Resize(0); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Resize after Close: %v", err)
	}
	_ = c.Stats()
}
