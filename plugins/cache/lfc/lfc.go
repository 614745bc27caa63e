// Package lfc is the local file cache (LFC): the compute agent's page cache
// between Postgres' shared_buffers and the pageserver, in RAM or in one file
// on local disk. It implements cache.Cache and is called once per page on
// the FUSE data path, so it lives in the agent's process.
//
// Layout. Pages are grouped in chunks of ChunkPages consecutive blocks of
// one relation fork; a chunk is the unit of allocation and eviction. Chunks
// are spread by hash over Partitions partitions, each with its own mutex,
// index (map from chunk to handle), eviction policy and share of the chunk
// slots: global slot g belongs to partition g % Partitions, so a resize moves
// no slot between partitions. The disk tier keeps slot g at offset
// g*ChunkBytes of its file.
//
// Locking. A partition's lock is held for the lookup and the policy update.
// RAM pages are immutable buffers (a Put stores a fresh copy, made before
// locking), so a RAM hit copies the page after unlocking; the disk tier's
// pread and pwrite run under the lock. A contended acquisition is
// timed and recorded in the wait accounting as lfc_lock; an uncontended one
// (TryLock succeeds) costs nothing extra. Page copies are recorded as
// lfc_read and lfc_write.
//
// It is not persistent (the disk file is recreated on start) and it does no
// admission control: every Put is stored.
package lfc

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/cache/lfc/policy"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// Options are the LFC's collaborators.
type Options struct {
	Logger zerolog.Logger
	// Registry, if set, receives the cache's metrics (and those of its own
	// Waits, when Waits is nil). Close unregisters them.
	Registry *prometheus.Registry
	// Waits is the agent's wait accounting; it must have the kinds
	// cache.WaitLFCLock, cache.WaitLFCRead and cache.WaitLFCWrite. Nil: the
	// cache makes its own (see Cache.Waits).
	Waits *cache.Waits
}

// Cache is the LFC.
type Cache struct {
	cfg        Config
	log        zerolog.Logger
	chunkPages uint32
	chunkBytes int64
	parts      []*partition
	file       *os.File // disk tier; nil for RAM
	// direct: the disk tier's file is open with O_DIRECT, so the kernel's
	// page cache holds no copy of it (the memory budget stays honest, and
	// a hit is a real disk read). False where the filesystem refuses
	// O_DIRECT (tmpfs).
	direct bool

	waits                *cache.Waits
	kLock, kRead, kWrite cache.WaitKind
	reg                  *prometheus.Registry
	collectors           []prometheus.Collector

	closed   atomic.Bool
	resizeMu sync.Mutex   // serialises Resize and Close
	slots    atomic.Int64 // total chunk slots (capacity)
}

var _ cache.Cache = (*Cache)(nil)

type chunkKey struct {
	tag   pg.RelTag
	chunk uint32
}

type entry struct {
	key     chunkKey
	slot    int32     // local slot number in the partition
	present [2]uint64 // bitmap of the pages held (ChunkPages <= 128)
}

func (e *entry) has(i uint32) bool { return e.present[i>>6]&(1<<(i&63)) != 0 }
func (e *entry) set(i uint32)      { e.present[i>>6] |= 1 << (i & 63) }
func (e *entry) clear(i uint32)    { e.present[i>>6] &^= 1 << (i & 63) }
func (e *entry) empty() bool       { return e.present[0]|e.present[1] == 0 }
func (e *entry) count() int64 {
	return int64(bits.OnesCount64(e.present[0]) + bits.OnesCount64(e.present[1]))
}

// partition is one lock's share of the cache. Every field is guarded by mu.
type partition struct {
	mu     sync.Mutex
	id     int
	closed bool
	index  map[chunkKey]int32 // chunk -> handle
	ents   []entry            // by handle
	lsns   []pg.LSN           // by handle*ChunkPages + page in chunk
	freeH  []int32            // free handles
	freeS  []int32            // free local slots below hwm
	hwm    int32              // slots >= hwm (and < nslots) were never used since the last shrink
	nslots int32              // local slots owned
	// RAM tier: the page buffers, by slot*ChunkPages + page in chunk, for
	// slots < hwm; nil where the page is absent. A buffer is immutable once
	// stored (a Put stores a new one), so Get copies it after unlocking.
	ram     [][]byte
	ramTier bool
	cp      int // ChunkPages
	pol     policy.Policy

	pages                                          int64
	hits, misses, puts, stale, evictions, invalids uint64
	_                                              [64]byte // keep neighbours' locks off this line
}

// New returns an empty LFC of cfg.SizeBytes.
func New(cfg Config, opts Options) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:        cfg,
		log:        opts.Logger.With().Str("component", "lfc").Logger(),
		chunkPages: uint32(cfg.ChunkPages),
		chunkBytes: cfg.ChunkBytes(),
		waits:      opts.Waits,
		reg:        opts.Registry,
	}
	if c.waits == nil {
		w, err := cache.NewWaits(cache.WaitLFCLock, cache.WaitLFCRead, cache.WaitLFCWrite)
		if err != nil {
			return nil, err
		}
		c.waits = w
		if c.reg != nil {
			c.collectors = append(c.collectors, w.Collector())
		}
	}
	var ok [3]bool
	c.kLock, ok[0] = c.waits.Kind(cache.WaitLFCLock)
	c.kRead, ok[1] = c.waits.Kind(cache.WaitLFCRead)
	c.kWrite, ok[2] = c.waits.Kind(cache.WaitLFCWrite)
	if !ok[0] || !ok[1] || !ok[2] {
		return nil, fmt.Errorf("lfc: Options.Waits lacks one of %s, %s, %s",
			cache.WaitLFCLock, cache.WaitLFCRead, cache.WaitLFCWrite)
	}
	for i := 0; i < cfg.Partitions; i++ {
		pol, err := policy.New(cfg.Policy)
		if err != nil {
			return nil, err
		}
		c.parts = append(c.parts, &partition{id: i, index: map[chunkKey]int32{}, pol: pol, ramTier: cfg.Tier == TierRAM, cp: cfg.ChunkPages})
	}
	if cfg.Tier == TierDisk {
		f, direct, err := openDirect(cfg.Path)
		if err != nil {
			return nil, fmt.Errorf("lfc: %w", err)
		}
		c.file, c.direct = f, direct
	}
	if err := c.Resize(cfg.SizeBytes); err != nil {
		c.Close()
		return nil, err
	}
	if c.reg != nil {
		c.collectors = append(c.collectors, Collector(func() *Cache { return c }))
		for i, col := range c.collectors {
			if err := c.reg.Register(col); err != nil {
				for _, done := range c.collectors[:i] {
					c.reg.Unregister(done)
				}
				c.collectors = nil
				c.Close()
				return nil, fmt.Errorf("lfc: register metrics: %w", err)
			}
		}
	}
	c.log.Info().Int64("size_bytes", c.slots.Load()*c.chunkBytes).Str("tier", cfg.Tier).
		Int("chunk_pages", cfg.ChunkPages).Int("partitions", cfg.Partitions).
		Str("policy", cfg.Policy).Msg("local file cache ready")
	return c, nil
}

// Waits returns the wait accounting the cache records into.
func (c *Cache) Waits() *cache.Waits { return c.waits }

// Config returns the configuration the cache was made with (SizeBytes as
// given to New, not as resized).
func (c *Cache) Config() Config { return c.cfg }

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// locate returns the chunk of key, the page's index in it, the chunk's hash
// and its partition.
func (c *Cache) locate(key pg.PageKey) (chunkKey, uint32, uint64, *partition) {
	ck := chunkKey{tag: key.Tag(), chunk: key.Block / c.chunkPages}
	i := key.Block % c.chunkPages
	h := mix64(uint64(key.Rel)<<32|uint64(ck.chunk)) ^
		mix64((uint64(key.DB)<<32|uint64(key.Spc))+uint64(key.Fork)<<61)
	return ck, i, h, c.parts[h%uint64(len(c.parts))]
}

// lock takes p's lock, recording the wait if it was contended.
func (c *Cache) lock(p *partition) {
	if p.mu.TryLock() {
		return
	}
	t0 := time.Now()
	p.mu.Lock()
	c.waits.Add(c.kLock, p.id, time.Since(t0))
}

func (c *Cache) off(p *partition, slot int32, i uint32) int64 {
	g := int64(p.id) + int64(slot)*int64(len(c.parts))
	return g*c.chunkBytes + int64(i)*pg.BlockSize
}

// preadPage reads a page of the disk tier.
// REQUIRES: p.mu held.
func (c *Cache) preadPage(p *partition, slot int32, i uint32, dst []byte) error {
	t0 := time.Now()
	var err error
	if c.direct {
		buf := getAligned()
		_, err = c.file.ReadAt(buf, c.off(p, slot, i))
		copy(dst, buf)
		putAligned(buf)
	} else {
		_, err = c.file.ReadAt(dst, c.off(p, slot, i))
	}
	c.waits.Add(c.kRead, p.id, time.Since(t0))
	return err
}

// pwritePage writes a page of the disk tier.
// REQUIRES: p.mu held.
func (c *Cache) pwritePage(p *partition, slot int32, i uint32, src []byte) error {
	t0 := time.Now()
	var err error
	if c.direct {
		buf := getAligned()
		copy(buf, src)
		_, err = c.file.WriteAt(buf, c.off(p, slot, i))
		putAligned(buf)
	} else {
		_, err = c.file.WriteAt(src, c.off(p, slot, i))
	}
	c.waits.Add(c.kWrite, p.id, time.Since(t0))
	return err
}

// store puts page i of the chunk in slot into the tier: for RAM, buf is the
// page's new private copy; for disk, it is written with pwrite.
// REQUIRES: p.mu held.
func (c *Cache) store(p *partition, slot int32, i uint32, buf []byte) error {
	if p.ramTier {
		p.ram[int(slot)*p.cp+int(i)] = buf
		return nil
	}
	return c.pwritePage(p, slot, i, buf)
}

// Get implements cache.Cache.
func (c *Cache) Get(key pg.PageKey, dst []byte) (bool, error) {
	if len(dst) < pg.BlockSize {
		return false, cache.ErrShortBuffer
	}
	if c.closed.Load() {
		return false, cache.ErrClosed
	}
	ck, i, _, p := c.locate(key)
	c.lock(p)
	if p.closed {
		p.mu.Unlock()
		return false, cache.ErrClosed
	}
	h, ok := p.index[ck]
	if !ok || !p.ents[h].has(i) {
		p.misses++
		p.mu.Unlock()
		return false, nil
	}
	p.pol.Touch(h)
	slot := p.ents[h].slot
	if p.ramTier {
		// The buffer is immutable: copy it without holding the lock.
		buf := p.ram[int(slot)*p.cp+int(i)]
		p.hits++
		p.mu.Unlock()
		t0 := time.Now()
		copy(dst[:pg.BlockSize], buf)
		c.waits.Add(c.kRead, p.id, time.Since(t0))
		return true, nil
	}
	defer p.mu.Unlock()
	if err := c.preadPage(p, slot, i, dst[:pg.BlockSize]); err != nil {
		p.dropPage(h, i)
		return false, fmt.Errorf("lfc: read %v: %w", key, err)
	}
	p.hits++
	return true, nil
}

// Put implements cache.Cache.
func (c *Cache) Put(key pg.PageKey, page []byte, lsn pg.LSN) error {
	if len(page) != pg.BlockSize {
		return cache.ErrPageSize
	}
	if c.closed.Load() {
		return cache.ErrClosed
	}
	ck, i, hash, p := c.locate(key)
	buf := page
	if c.file == nil {
		// The RAM tier stores a private, immutable copy, made before locking.
		t0 := time.Now()
		buf = make([]byte, pg.BlockSize)
		copy(buf, page)
		c.waits.Add(c.kWrite, p.id, time.Since(t0))
	}
	c.lock(p)
	defer p.mu.Unlock()
	if p.closed {
		return cache.ErrClosed
	}
	h, ok := p.index[ck]
	if ok {
		e := &p.ents[h]
		li := int(h)*int(c.chunkPages) + int(i)
		if e.has(i) && lsn != pg.InvalidLSN && lsn < p.lsns[li] {
			p.stale++
			return nil
		}
		if err := c.store(p, e.slot, i, buf); err != nil {
			p.dropPage(h, i)
			return fmt.Errorf("lfc: write %v: %w", key, err)
		}
		if !e.has(i) {
			e.set(i)
			p.pages++
		}
		p.lsns[li] = lsn
		p.pol.Touch(h)
		p.puts++
		return nil
	}
	if p.nslots == 0 {
		return nil
	}
	slot := p.allocSlot()
	h = p.allocHandle(c.chunkPages)
	p.ents[h] = entry{key: ck, slot: slot}
	p.index[ck] = h
	p.pol.Insert(h, hash)
	if err := c.store(p, slot, i, buf); err != nil {
		p.freeEntry(h)
		return fmt.Errorf("lfc: write %v: %w", key, err)
	}
	p.ents[h].set(i)
	p.lsns[int(h)*int(c.chunkPages)+int(i)] = lsn
	p.pages++
	p.puts++
	return nil
}

// allocSlot returns a free local slot, evicting a chunk if there is none.
// REQUIRES: p.mu held, p.nslots > 0.
func (p *partition) allocSlot() int32 {
	if n := len(p.freeS); n > 0 {
		s := p.freeS[n-1]
		p.freeS = p.freeS[:n-1]
		return s
	}
	if p.hwm < p.nslots {
		s := p.hwm
		p.hwm++
		if p.ramTier {
			p.ram = append(p.ram, make([][]byte, p.cp)...)
		}
		return s
	}
	v, ok := p.pol.Victim()
	if !ok {
		panic("lfc: partition full but its policy has no victim")
	}
	p.evictions++
	return p.forget(v)
}

// forget drops handle h, which the policy no longer holds, and returns its
// slot (not yet on the free list).
func (p *partition) forget(h int32) int32 {
	e := &p.ents[h]
	p.pages -= e.count()
	delete(p.index, e.key)
	s := e.slot
	if p.ramTier {
		clear(p.ram[int(s)*p.cp : int(s+1)*p.cp])
	}
	*e = entry{slot: -1}
	p.freeH = append(p.freeH, h)
	return s
}

// freeEntry removes resident handle h and frees its slot.
func (p *partition) freeEntry(h int32) {
	p.pol.Remove(h)
	p.freeS = append(p.freeS, p.forget(h))
}

// dropPage forgets page i of handle h (freeing the chunk when it empties).
func (p *partition) dropPage(h int32, i uint32) {
	e := &p.ents[h]
	if e.has(i) {
		e.clear(i)
		p.pages--
		if p.ramTier {
			p.ram[int(e.slot)*p.cp+int(i)] = nil
		}
	}
	if e.empty() {
		p.freeEntry(h)
	}
}

func (p *partition) allocHandle(chunkPages uint32) int32 {
	if n := len(p.freeH); n > 0 {
		h := p.freeH[n-1]
		p.freeH = p.freeH[:n-1]
		return h
	}
	p.ents = append(p.ents, entry{})
	p.lsns = append(p.lsns, make([]pg.LSN, chunkPages)...)
	return int32(len(p.ents) - 1)
}

// Invalidate implements cache.Cache.
func (c *Cache) Invalidate(key pg.PageKey) error {
	if c.closed.Load() {
		return cache.ErrClosed
	}
	ck, i, _, p := c.locate(key)
	c.lock(p)
	defer p.mu.Unlock()
	if p.closed {
		return cache.ErrClosed
	}
	if h, ok := p.index[ck]; ok && p.ents[h].has(i) {
		p.invalids++
		p.dropPage(h, i)
	}
	return nil
}

// InvalidateRel implements cache.Cache. It walks every partition's index:
// O(cached chunks), meant for DROP and TRUNCATE, not for the page path.
func (c *Cache) InvalidateRel(tag pg.RelTag, from uint32) error {
	if c.closed.Load() {
		return cache.ErrClosed
	}
	for _, p := range c.parts {
		c.lock(p)
		if p.closed {
			p.mu.Unlock()
			return cache.ErrClosed
		}
		for ck, h := range p.index {
			if ck.tag != tag {
				continue
			}
			first := ck.chunk * c.chunkPages
			if first+c.chunkPages-1 < from {
				continue
			}
			for i := uint32(0); i < c.chunkPages; i++ {
				if first+i >= from && p.ents[h].has(i) {
					p.invalids++
					p.dropPage(h, i) // may delete ck from the index: allowed while ranging
					if p.ents[h].key != ck {
						break
					}
				}
			}
		}
		p.mu.Unlock()
	}
	return nil
}

// slotsOf is how many of total global slots partition id owns.
func slotsOf(total int64, id, parts int) int32 {
	n := total / int64(parts)
	if int64(id) < total%int64(parts) {
		n++
	}
	return int32(n)
}

// Resize implements cache.Cache. Partitions are resized one at a time, so
// the others keep serving. Shrinking evicts by the policy until the chunks
// fit, then moves the chunks that sit in slots past the new end into free
// slots below it (RAM: swapping buffers; disk: copying the chunk).
func (c *Cache) Resize(bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("%w: %d", cache.ErrBadSize, bytes)
	}
	c.resizeMu.Lock()
	defer c.resizeMu.Unlock()
	if c.closed.Load() {
		return cache.ErrClosed
	}
	total := bytes / c.chunkBytes
	if max := int64(1<<31-1) * int64(len(c.parts)); total > max {
		total = max
	}
	old := c.slots.Load()
	if total > old {
		if c.file != nil {
			if err := preallocate(c.file, old*c.chunkBytes, total*c.chunkBytes); err != nil {
				return fmt.Errorf("lfc: grow %s to %d bytes: %w", c.cfg.Path, total*c.chunkBytes, err)
			}
		}
		c.slots.Store(total)
	}
	for _, p := range c.parts {
		c.lock(p)
		c.resizePartition(p, slotsOf(total, p.id, len(c.parts)))
		p.mu.Unlock()
	}
	if total < old {
		c.slots.Store(total)
		if c.file != nil {
			if err := preallocate(c.file, old*c.chunkBytes, total*c.chunkBytes); err != nil {
				return fmt.Errorf("lfc: shrink %s: %w", c.cfg.Path, err)
			}
		}
	}
	if total != old {
		c.log.Debug().Int64("from_bytes", old*c.chunkBytes).Int64("to_bytes", total*c.chunkBytes).Msg("resized")
	}
	return nil
}

// REQUIRES: p.mu held.
func (c *Cache) resizePartition(p *partition, n int32) {
	p.pol.SetCapacity(int(n))
	if n >= p.nslots {
		p.nslots = n // the new slots lie above hwm: free, never used
		return
	}
	for int32(p.pol.Len()) > n {
		v, _ := p.pol.Victim()
		p.evictions++
		p.freeS = append(p.freeS, p.forget(v))
	}
	if p.hwm > n {
		// Chunks may sit in slots >= n: move them into free slots below n.
		// There are enough: at most n chunks remain.
		low := p.freeS[:0]
		for _, s := range p.freeS {
			if s < n {
				low = append(low, s)
			}
		}
		for _, h := range p.index {
			e := &p.ents[h]
			if e.slot < n {
				continue
			}
			to := low[len(low)-1]
			low = low[:len(low)-1]
			if err := c.moveSlot(p, e.slot, to); err != nil {
				c.log.Warn().Err(err).Msg("moving a chunk while shrinking; dropping it")
				p.pol.Remove(h)
				p.evictions++
				p.forget(h)
				low = append(low, to)
				continue
			}
			e.slot = to
		}
		p.freeS = low
		p.hwm = n
		if c.file == nil {
			clear(p.ram[int(n)*p.cp:])
			p.ram = p.ram[: int(n)*p.cp : int(n)*p.cp]
		}
	}
	p.nslots = n
}

// moveSlot moves a chunk's bytes between local slots of p.
func (c *Cache) moveSlot(p *partition, from, to int32) error {
	if c.file == nil {
		a, b := p.ram[int(to)*p.cp:int(to+1)*p.cp], p.ram[int(from)*p.cp:int(from+1)*p.cp]
		for j := range a {
			a[j], b[j] = b[j], a[j]
		}
		return nil
	}
	buf := alignedBuf(int(c.chunkBytes))
	if _, err := c.file.ReadAt(buf, c.off(p, from, 0)); err != nil {
		return err
	}
	_, err := c.file.WriteAt(buf, c.off(p, to, 0))
	return err
}

// Keys returns up to max of the pages the cache holds (max <= 0: all of
// them), partition by partition; the order says nothing about how hot a
// page is. It is the list a compute saves so that the next one can warm its
// cache (core/compute/prewarm). Each partition is locked while its keys are
// copied.
func (c *Cache) Keys(max int) []pg.PageKey {
	var keys []pg.PageKey
	for _, p := range c.parts {
		p.mu.Lock()
		for ck, h := range p.index {
			e := &p.ents[h]
			for i := uint32(0); i < c.chunkPages; i++ {
				if max > 0 && len(keys) >= max {
					p.mu.Unlock()
					return keys
				}
				if e.has(i) {
					keys = append(keys, ck.tag.Page(ck.chunk*c.chunkPages+i))
				}
			}
		}
		p.mu.Unlock()
	}
	return keys
}

// Stats implements cache.Cache.
func (c *Cache) Stats() cache.Stats {
	var s cache.Stats
	var used int64
	for _, p := range c.parts {
		p.mu.Lock()
		s.Hits += p.hits
		s.Misses += p.misses
		s.Puts += p.puts
		s.StalePuts += p.stale
		s.Evictions += p.evictions
		s.Invalidations += p.invalids
		s.Pages += p.pages
		used += int64(p.hwm) - int64(len(p.freeS))
		p.mu.Unlock()
	}
	s.UsedBytes = used * c.chunkBytes
	s.CapacityBytes = c.slots.Load() * c.chunkBytes
	return s
}

// Close implements cache.Cache. It removes the disk tier's file.
func (c *Cache) Close() error {
	c.resizeMu.Lock()
	defer c.resizeMu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	for _, col := range c.collectors {
		c.reg.Unregister(col)
	}
	for _, p := range c.parts {
		p.mu.Lock()
		p.closed = true
		p.index, p.ents, p.lsns, p.ram, p.freeH = nil, nil, nil, nil, nil
		p.freeS = p.freeS[:0]
		p.nslots, p.hwm, p.pages = 0, 0, 0
		p.mu.Unlock()
	}
	c.slots.Store(0)
	if c.file != nil {
		err := c.file.Close()
		if rerr := os.Remove(c.cfg.Path); err == nil {
			err = rerr
		}
		if err != nil {
			return fmt.Errorf("lfc: close: %w", err)
		}
	}
	return nil
}
