package fusefs

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/sdk/pg"
)

// Op is a timed operation of the filesystem.
type Op uint8

// The operations that Waits counts.
const (
	OpRead    Op = iota // a FUSE read
	OpWrite             // a FUSE write
	OpGetPage           // a Backend.ReadPage on a cache miss (the "GetPage" wait)
	OpFsync             // a durability wait (Backend.Sync) on fsync
	numOps
)

var opNames = [numOps]string{"read", "write", "getpage", "fsync"}

const numKinds = 4 // relpath.KindOther .. KindLocal

// Waits counts and times the filesystem's operations per file kind, with
// atomic counters (no locks on the hot path). The zero value is ready.
type Waits struct {
	count [numOps][numKinds]atomic.Uint64
	nanos [numOps][numKinds]atomic.Uint64
	bytes [numOps][numKinds]atomic.Uint64
	hits  atomic.Uint64 // cache tier hits
	miss  atomic.Uint64 // cache tier misses
	// lsnAboveW counts page writes whose own LSN was above W (tagged with
	// the page LSN instead).
	lsnAboveW atomic.Uint64
	// sendOnly counts fsyncs answered once sent, without waiting for
	// durability (FS.SetSyncDurable(false)).
	sendOnly atomic.Uint64
	// walSyncs counts fsyncs of pg_wal files (answered without a disk
	// flush: the safekeepers make WAL durable).
	walSyncs atomic.Uint64
	// Read-ahead: pages fetched ahead of sequential readers, fetched pages
	// a reader took, fetched pages dropped unread (written, truncated,
	// expired), batches and their summed duration.
	raFetched, raUsed, raDropped, raBatches, raNanos atomic.Uint64
}

// ReadAhead returns the read-ahead's counters: pages fetched ahead, pages
// used by a reader, pages dropped unread, and fetch batches.
func (w *Waits) ReadAhead() (fetched, used, dropped, batches uint64) {
	return w.raFetched.Load(), w.raUsed.Load(), w.raDropped.Load(), w.raBatches.Load()
}

// WALFsyncs returns how many fsyncs of pg_wal files Postgres made.
func (w *Waits) WALFsyncs() uint64 { return w.walSyncs.Load() }

// SendOnlyFsyncs returns how many fsyncs returned once their mutations were
// sent, without waiting for durability.
func (w *Waits) SendOnlyFsyncs() uint64 { return w.sendOnly.Load() }

// PageLSNAboveW returns how many page writes carried an LSN above W.
func (w *Waits) PageLSNAboveW() uint64 { return w.lsnAboveW.Load() }

// Observe adds one operation of n bytes that took d.
func (w *Waits) Observe(op Op, k relpath.Kind, n int, d time.Duration) {
	w.count[op][k].Add(1)
	w.nanos[op][k].Add(uint64(d))
	w.bytes[op][k].Add(uint64(n))
}

// Count returns how many operations op on files of kind k were observed.
func (w *Waits) Count(op Op, k relpath.Kind) uint64 { return w.count[op][k].Load() }

// Ops returns how many reads and writes the filesystem served, every
// file kind together.
func (w *Waits) Ops() uint64 {
	var n uint64
	for _, op := range []Op{OpRead, OpWrite} {
		for k := range numKinds {
			n += w.count[op][k].Load()
		}
	}
	return n
}

// WrittenBytes returns how many bytes writes brought in, every file kind
// together.
func (w *Waits) WrittenBytes() uint64 {
	var n uint64
	for k := range numKinds {
		n += w.bytes[OpWrite][k].Load()
	}
	return n
}

// Total returns the summed duration of operations op on files of kind k.
func (w *Waits) Total(op Op, k relpath.Kind) time.Duration {
	return time.Duration(w.nanos[op][k].Load())
}

// CacheHits returns the cache tier's hits and misses.
func (w *Waits) CacheHits() (hits, misses uint64) { return w.hits.Load(), w.miss.Load() }

// Collector returns a Prometheus collector exporting the counters:
// strata_compute_fuse_ops_total{op,kind}, strata_compute_fuse_seconds_total{op,kind},
// strata_compute_fuse_bytes_total{op,kind}, strata_compute_cache_{hits,misses}_total.
func (w *Waits) Collector() prometheus.Collector { return waitsCollector{w} }

var (
	descOps   = prometheus.NewDesc("strata_compute_fuse_ops_total", "FUSE operations and backend waits of the compute, by operation and file kind.", []string{"op", "kind"}, nil)
	descSecs  = prometheus.NewDesc("strata_compute_fuse_seconds_total", "Time spent in FUSE operations and backend waits, by operation and file kind.", []string{"op", "kind"}, nil)
	descBytes = prometheus.NewDesc("strata_compute_fuse_bytes_total", "Bytes moved by FUSE operations, by operation and file kind.", []string{"op", "kind"}, nil)
	descHits  = prometheus.NewDesc("strata_compute_cache_hits_total", "Page reads served by the compute's cache tier.", nil, nil)
	descMiss  = prometheus.NewDesc("strata_compute_cache_misses_total", "Page reads that missed the compute's cache tier.", nil, nil)
	descAbove = prometheus.NewDesc("strata_compute_page_lsn_above_w_total", "Page writes whose page LSN was above the WAL position written (bulk writes), tagged with the page LSN.", nil, nil)
	descSend  = prometheus.NewDesc("strata_compute_fsync_send_only_total", "fsyncs answered once sent to storage, without waiting for durability (Postgres in crash recovery).", nil, nil)
	descWAL   = prometheus.NewDesc("strata_compute_wal_fsyncs_total", "fsyncs of pg_wal files, answered without flushing the scratch disk (the safekeepers make WAL durable).", nil, nil)
	descRA    = prometheus.NewDesc("strata_compute_readahead_pages_total", "Pages fetched ahead of sequential readers (result=fetched), taken by a reader (used), or dropped unread (dropped).", []string{"result"}, nil)
	descRAB   = prometheus.NewDesc("strata_compute_readahead_batches_total", "Read-ahead fetches (one Backend batch each).", nil, nil)
	descRAS   = prometheus.NewDesc("strata_compute_readahead_seconds_total", "Time spent in read-ahead fetches (in the background, not waited for by Postgres unless it reads a page still in flight).", nil, nil)
)

type waitsCollector struct{ w *Waits }

func (c waitsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOps
	ch <- descSecs
	ch <- descBytes
	ch <- descHits
	ch <- descMiss
	ch <- descAbove
	ch <- descSend
	ch <- descWAL
	ch <- descRA
	ch <- descRAB
	ch <- descRAS
}

func (c waitsCollector) Collect(ch chan<- prometheus.Metric) {
	for op := Op(0); op < numOps; op++ {
		for k := relpath.Kind(0); k < numKinds; k++ {
			n := c.w.count[op][k].Load()
			if n == 0 {
				continue
			}
			ch <- prometheus.MustNewConstMetric(descOps, prometheus.CounterValue, float64(n), opNames[op], k.String())
			ch <- prometheus.MustNewConstMetric(descSecs, prometheus.CounterValue, float64(c.w.nanos[op][k].Load())/1e9, opNames[op], k.String())
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(c.w.bytes[op][k].Load()), opNames[op], k.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(c.w.hits.Load()))
	ch <- prometheus.MustNewConstMetric(descMiss, prometheus.CounterValue, float64(c.w.miss.Load()))
	ch <- prometheus.MustNewConstMetric(descAbove, prometheus.CounterValue, float64(c.w.lsnAboveW.Load()))
	ch <- prometheus.MustNewConstMetric(descSend, prometheus.CounterValue, float64(c.w.sendOnly.Load()))
	ch <- prometheus.MustNewConstMetric(descWAL, prometheus.CounterValue, float64(c.w.walSyncs.Load()))
	ch <- prometheus.MustNewConstMetric(descRA, prometheus.CounterValue, float64(c.w.raFetched.Load()), "fetched")
	ch <- prometheus.MustNewConstMetric(descRA, prometheus.CounterValue, float64(c.w.raUsed.Load()), "used")
	ch <- prometheus.MustNewConstMetric(descRA, prometheus.CounterValue, float64(c.w.raDropped.Load()), "dropped")
	ch <- prometheus.MustNewConstMetric(descRAB, prometheus.CounterValue, float64(c.w.raBatches.Load()))
	ch <- prometheus.MustNewConstMetric(descRAS, prometheus.CounterValue, float64(c.w.raNanos.Load())/1e9)
}

// LastWritten is the last-written-LSN map: for each page, the W of its last
// write by this compute. Lookups of pages not in the map return the floor:
// the highest LSN of any forgotten entry, or the start position of the
// compute. GetPage sends the result as not_modified_since. It keeps at most
// max entries; safe for concurrent use.
type LastWritten struct {
	mu    sync.Mutex
	m     map[pg.PageKey]pg.LSN
	floor pg.LSN
	max   int
}

// NewLastWritten returns a map holding up to max entries, with floor start.
func NewLastWritten(max int, start pg.LSN) *LastWritten {
	return &LastWritten{m: map[pg.PageKey]pg.LSN{}, floor: start, max: max}
}

// Get returns not_modified_since for key.
func (l *LastWritten) Get(key pg.PageKey) pg.LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.m[key]; ok && v > l.floor {
		return v
	}
	return l.floor
}

// Set records a write of key at w.
func (l *LastWritten) Set(key pg.PageKey, w pg.LSN) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= l.max {
		// Forget everything and raise the floor: correct (the floor is at or
		// above every forgotten entry), merely less precise.
		for _, v := range l.m {
			if v > l.floor {
				l.floor = v
			}
		}
		clear(l.m)
	}
	if w > l.m[key] {
		l.m[key] = w
	}
}

// SetFloor raises the floor to at least w (for a truncate or unlink, which
// changes many pages at once).
func (l *LastWritten) SetFloor(w pg.LSN) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w > l.floor {
		l.floor = w
	}
}

// MemCache is a small LRU page Cache for tests and benchmarks; the agent
// plugs in the LFC instead (or no cache tier at all).
type MemCache struct {
	mu    sync.Mutex
	max   int
	pages map[pg.PageKey]*cacheEntry
	head  cacheEntry // sentinel of a circular list; head.next is the newest
}

type cacheEntry struct {
	key        pg.PageKey
	page       []byte
	prev, next *cacheEntry
}

var _ Cache = (*MemCache)(nil)

// NewMemCache returns an LRU cache of up to maxPages pages.
func NewMemCache(maxPages int) *MemCache {
	c := &MemCache{max: maxPages, pages: map[pg.PageKey]*cacheEntry{}}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

func (c *MemCache) unlink(e *cacheEntry) { e.prev.next, e.next.prev = e.next, e.prev }

func (c *MemCache) front(e *cacheEntry) {
	e.next, e.prev = c.head.next, &c.head
	c.head.next.prev = e
	c.head.next = e
}

// Get implements Cache.
func (c *MemCache) Get(key pg.PageKey, page []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.pages[key]
	if !ok {
		return false
	}
	copy(page, e.page)
	c.unlink(e)
	c.front(e)
	return true
}

// Put implements Cache.
func (c *MemCache) Put(key pg.PageKey, page []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pages[key]; ok {
		copy(e.page, page)
		c.unlink(e)
		c.front(e)
		return
	}
	var e *cacheEntry
	if len(c.pages) >= c.max {
		e = c.head.prev
		c.unlink(e)
		delete(c.pages, e.key)
	} else {
		e = &cacheEntry{page: make([]byte, pg.BlockSize)}
	}
	e.key = key
	copy(e.page, page)
	c.pages[key] = e
	c.front(e)
}

// Forget implements Cache.
func (c *MemCache) Forget(rel pg.RelTag, from uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.pages {
		if k.Tag() == rel && k.Block >= from {
			c.unlink(e)
			delete(c.pages, k)
		}
	}
}

// Len returns the number of cached pages.
func (c *MemCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pages)
}
