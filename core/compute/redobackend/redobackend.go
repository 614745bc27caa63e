// Package redobackend is the compute's fusefs.Backend in redo mode
// (storage.page_source: redo): relation pages that Postgres writes stay in
// the compute, and the pageserver rebuilds every page from WAL.
//
//   - Relation page writes (evictions, checkpoints) go to a local page store
//     only, never to the pageserver. The relation index (which forks exist,
//     their sizes) is local too, loaded from the pageserver once at Open.
//   - A read of a page the store holds is served locally. A read of any
//     other page goes to the pageserver (GetPage at the latest LSN) with
//     not_modified_since = the page's last-written LSN: for a page the store
//     evicted, the LSN in its header (the last WAL record that changed it:
//     the pageserver must have ingested that far); for a page this compute
//     never held, the value the filesystem's last-written-LSN map gives
//     (the compute's start LSN at least). A page LSN can be older than
//     the record that makes the page exist on the pageserver (CREATE
//     DATABASE ... STRATEGY FILE_COPY copies the template's files, with
//     their LSNs, before it logs the copy): an evicted page with content
//     that the pageserver does not know is asked for again at the
//     compute's WAL position W (SetWALPosition), and is an error if it is
//     still unknown; it never reads as zeros.
//   - Blocks past a fork's size at Open, or past a truncation or creation
//     by this compute, that the compute never wrote read as zeros without
//     asking the pageserver: their content can only come from this compute,
//     and the pageserver may still hold versions from before a truncation.
//   - Pages Postgres changes without WAL: hint bits are lost when a page is
//     evicted and rebuilt from WAL, which is harmless (they are masked in
//     every consistency check and recomputed from pg_xact); free-space-map
//     forks and every fork of an unlogged relation (one with an init fork)
//     are pinned in the store, never evicted and never read from the
//     pageserver (its FSM pages are initdb's; unlogged data has no WAL).
//     Visibility-map pages are pinned too: heap records clear VM bits
//     without moving the VM page's LSN, so the LSN of an evicted VM page
//     would not say how far the pageserver must have ingested (Neon
//     WAL-logs evicted VM pages for the same reason). A VM page this
//     compute never held is read from the pageserver as any other.
//     FSM forks the pageserver lists are not shown to Postgres at all: an
//     absent FSM means "no free space known", and VACUUM rebuilds it.
//   - The compute must run with wal_log_hints=on (or data checksums):
//     only then does VACUUM's all-visible mark move the heap page's LSN,
//     which is what an evicted page is read back with.
//   - Non-relation files and folders (pg_control, pg_xact, ...) go to Files,
//     another Backend (in a cluster, psbackend: writeback to the
//     pageserver, gated by the safekeepers), so that a new compute finds
//     pg_control and runs crash recovery from its checkpoint with the WAL
//     the safekeepers hold.
//
// Durability: relation pages need none here, the WAL on the safekeepers is
// their durable form; Sync waits for Files only. A compute that loses its
// store (machine lost) starts again with the pageserver's pages at the
// safekeepers' durable end E (not_modified_since = E, see fusefs WALStart)
// and replays WAL from pg_control's REDO point, as in writeback mode.
//
// The store is bounded by Options.MaxPages (0: unbounded); least recently
// used pages that are not pinned are evicted first.
package redobackend

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// Pages is what the Backend needs from the pageserver: pages rebuilt from
// WAL and the relation forks that exist when the compute starts.
// Implementations are safe for concurrent use.
type Pages interface {
	// GetPage returns the newest version of a page, waiting until the
	// pageserver has ingested WAL up to notModifiedSince. A page the
	// pageserver does not know is an error wrapping ErrNotFound. The
	// caller owns the result.
	GetPage(ctx context.Context, key pg.PageKey, notModifiedSince pg.LSN) ([]byte, error)
	// ListRels returns every relation fork and its size at the newest LSN.
	ListRels(ctx context.Context) ([]fusefs.RelInfo, error)
}

// ErrNotFound is what Pages returns for a page the pageserver does not have.
var ErrNotFound = errors.New("redobackend: page not found on the pageserver")

// Options configure a Backend. Pages and Files are required.
type Options struct {
	// Pages is the pageserver (ClientPages, or TimelinePages in process).
	Pages Pages
	// Files stores non-relation files and folders (psbackend in a cluster).
	Files fusefs.Backend
	// MaxPages bounds the local page store (0: unbounded). Pinned pages
	// (FSM, unlogged relations) count but are never evicted.
	MaxPages int
	Log      zerolog.Logger
	// Registry receives the Backend's metrics (nil: none).
	Registry *prometheus.Registry
	// Metrics, when set, are used instead of new ones in Registry: a
	// compute that opens a Backend at every start of Postgres keeps one
	// set of counters (NewMetrics).
	Metrics *Metrics
}

type entry struct {
	key    pg.PageKey
	data   []byte
	el     *list.Element // nil when pinned
	pinned bool
}

type relState struct {
	n     uint32
	fresh uint32 // blocks at or above it that were never stored read as zeros
}

// Backend implements fusefs.Backend for redo mode. Safe for concurrent use.
type Backend struct {
	o Options
	m *Metrics

	mu      sync.Mutex
	rels    map[pg.RelTag]*relState
	pages   map[pg.PageKey]*entry
	lru     *list.List                 // unpinned entries, most recent first
	evicted map[pg.PageKey]evictedPage // what is known of evicted pages
	wal     func() pg.LSN              // the compute's WAL position W (nil: unknown)

	refetches atomic.Int64
}

// evictedPage is what the store remembers of a page it evicted.
type evictedPage struct {
	lsn  pg.LSN // the page LSN in its header
	zero bool   // the page was all zeros (a new block no WAL record has touched)
}

// SetWALPosition gives the Backend the compute's WAL position W (the
// filesystem's walpos tracker, fusefs.FS.WAL().Current). A read of an
// evicted page that the pageserver does not know at the page's own LSN
// asks again at W (see ReadPage); without it such a read fails.
func (b *Backend) SetWALPosition(w func() pg.LSN) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wal = w
}

var _ fusefs.Backend = (*Backend)(nil)

// Open returns a Backend: it loads the relation forks from o.Pages (FSM
// forks left out) and keeps everything else in o.Files.
func Open(ctx context.Context, o Options) (*Backend, error) {
	if o.Pages == nil || o.Files == nil {
		return nil, errors.New("redobackend: Options.Pages and Options.Files are required")
	}
	m := o.Metrics
	if m == nil {
		m = NewMetrics(o.Registry)
	}
	b := &Backend{o: o, m: m, rels: map[pg.RelTag]*relState{}, pages: map[pg.PageKey]*entry{},
		lru: list.New(), evicted: map[pg.PageKey]evictedPage{}}
	rels, err := o.Pages.ListRels(ctx)
	if err != nil {
		return nil, fmt.Errorf("redobackend: list relations: %w", err)
	}
	for _, r := range rels {
		if r.Rel.Fork == pg.FSMFork {
			continue
		}
		b.rels[r.Rel] = &relState{n: r.Nblocks, fresh: r.Nblocks}
	}
	return b, nil
}

// pinnedLocked reports whether pages of rel must stay in the store: FSM
// forks (not WAL-logged), visibility-map forks (a heap record clears VM
// bits without setting the VM page's LSN, so an evicted VM page's LSN
// would not tell the pageserver how far to wait) and forks of unlogged
// relations.
func (b *Backend) pinnedLocked(rel pg.RelTag) bool {
	if rel.Fork == pg.FSMFork || rel.Fork == pg.VMFork || rel.Fork == pg.InitFork {
		return true
	}
	init := rel
	init.Fork = pg.InitFork
	_, unlogged := b.rels[init]
	return unlogged
}

// unbackedLocked reports whether the pageserver cannot hold rel's pages:
// FSM forks and forks of unlogged relations (VM pages it can rebuild).
func (b *Backend) unbackedLocked(rel pg.RelTag) bool {
	return rel.Fork != pg.VMFork && b.pinnedLocked(rel)
}

// ListRels implements fusefs.Backend.
func (b *Backend) ListRels(context.Context) ([]fusefs.RelInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]fusefs.RelInfo, 0, len(b.rels))
	for r, s := range b.rels {
		out = append(out, fusefs.RelInfo{Rel: r, Nblocks: s.n})
	}
	return out, nil
}

// CreateRel implements fusefs.Backend.
func (b *Backend) CreateRel(_ context.Context, rel pg.RelTag, _ pg.LSN) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropPagesLocked(rel, 0)
	b.rels[rel] = &relState{}
	if rel.Fork == pg.InitFork {
		// The relation is unlogged: pin what its other forks hold.
		for k, e := range b.pages {
			if k.Spc == rel.Spc && k.DB == rel.DB && k.Rel == rel.Rel && !e.pinned {
				b.lru.Remove(e.el)
				e.el, e.pinned = nil, true
			}
		}
	}
	return nil
}

// Nblocks implements fusefs.Backend.
func (b *Backend) Nblocks(_ context.Context, rel pg.RelTag) (uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.rels[rel]
	if !ok {
		return 0, fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, rel)
	}
	return s.n, nil
}

// ReadPage implements fusefs.Backend.
func (b *Backend) ReadPage(ctx context.Context, key pg.PageKey, notModifiedSince pg.LSN, page []byte) error {
	b.mu.Lock()
	s, ok := b.rels[key.Tag()]
	if !ok || key.Block >= s.n {
		b.mu.Unlock()
		return fmt.Errorf("%w: block %s", fusefs.ErrNotFound, key)
	}
	if e, ok := b.pages[key]; ok {
		copy(page, e.data)
		if e.el != nil {
			b.lru.MoveToFront(e.el)
		}
		b.mu.Unlock()
		b.m.hits.Inc()
		return nil
	}
	ev, wasEvicted := b.evicted[key]
	if !wasEvicted && (key.Block >= s.fresh || b.unbackedLocked(key.Tag())) {
		b.mu.Unlock()
		clear(page[:pg.BlockSize])
		b.m.zeros.Inc()
		return nil
	}
	nms := notModifiedSince
	if wasEvicted {
		nms = ev.lsn
	}
	wal := b.wal
	b.mu.Unlock()
	b.m.fetches.Inc()
	ctx = context.WithoutCancel(ctx)
	data, err := b.o.Pages.GetPage(ctx, key, nms)
	if errors.Is(err, ErrNotFound) && wasEvicted && !ev.zero {
		// This compute wrote the page, so it exists; the pageserver has
		// not ingested the record that creates it. A page's LSN can be
		// older than that record: CREATE DATABASE ... STRATEGY FILE_COPY
		// copies the template's files (their pages keep the template's
		// LSNs) before it logs the copy. Ask again at W, which is past
		// every record this compute has written: never answer zeros for
		// a page that had content.
		var w pg.LSN
		if wal != nil {
			w = wal()
		}
		if w <= nms {
			return fmt.Errorf("redobackend: page %s was written and evicted here, but the pageserver does not have it (not modified since %s, WAL position %s): %w", key, nms, w, err)
		}
		b.m.refetches.Inc()
		b.refetches.Add(1)
		nms = w
		data, err = b.o.Pages.GetPage(ctx, key, nms)
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("redobackend: page %s was written and evicted here, but the pageserver does not have it even at the WAL position %s: %w", key, nms, err)
		}
	}
	if errors.Is(err, ErrNotFound) {
		// A block no WAL record has touched: a new, all-zeros page.
		clear(page[:pg.BlockSize])
		return nil
	}
	if err != nil {
		return fmt.Errorf("redobackend: GetPage %s (not modified since %s): %w", key, nms, err)
	}
	if len(data) != pg.BlockSize {
		return fmt.Errorf("redobackend: page %s has %d bytes", key, len(data))
	}
	copy(page, data)
	return nil
}

// WritePage implements fusefs.Backend: the page goes to the local store.
func (b *Backend) WritePage(_ context.Context, key pg.PageKey, page []byte, _ pg.LSN) error {
	if len(page) != pg.BlockSize {
		return fmt.Errorf("redobackend: page of %d bytes", len(page))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.rels[key.Tag()]
	if !ok {
		return fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, key.Tag())
	}
	if e, ok := b.pages[key]; ok {
		copy(e.data, page)
		if e.el != nil {
			b.lru.MoveToFront(e.el)
		}
	} else {
		e := &entry{key: key, data: append([]byte(nil), page...), pinned: b.pinnedLocked(key.Tag())}
		if !e.pinned {
			e.el = b.lru.PushFront(e)
		}
		b.pages[key] = e
		delete(b.evicted, key)
	}
	if key.Block >= s.n {
		s.n = key.Block + 1
	}
	b.m.writes.Inc()
	b.evictLocked()
	return nil
}

// evictLocked drops least recently used unpinned pages above MaxPages,
// remembering their page LSN for the next read.
func (b *Backend) evictLocked() {
	for b.o.MaxPages > 0 && len(b.pages) > b.o.MaxPages && b.lru.Len() > 0 {
		e := b.lru.Remove(b.lru.Back()).(*entry)
		delete(b.pages, e.key)
		b.evicted[e.key] = evictedPage{
			lsn:  pg.LSN(uint64(binary.LittleEndian.Uint32(e.data))<<32 | uint64(binary.LittleEndian.Uint32(e.data[4:]))),
			zero: pg.IsZeroPage(e.data),
		}
		b.m.evictions.Inc()
	}
}

// SetMaxPages changes the local store's bound (0: unbounded) and evicts
// down to it. A compute that runs initdb keeps the store unbounded until
// initdb's pages are imported into the pageserver (they have no WAL).
func (b *Backend) SetMaxPages(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.o.MaxPages = n
	b.evictLocked()
}

// dropPagesLocked forgets the stored and evicted pages of rel at or above from.
func (b *Backend) dropPagesLocked(rel pg.RelTag, from uint32) {
	for k, e := range b.pages {
		if k.Tag() == rel && k.Block >= from {
			if e.el != nil {
				b.lru.Remove(e.el)
			}
			delete(b.pages, k)
		}
	}
	for k := range b.evicted {
		if k.Tag() == rel && k.Block >= from {
			delete(b.evicted, k)
		}
	}
}

// TruncateRel implements fusefs.Backend.
func (b *Backend) TruncateRel(_ context.Context, rel pg.RelTag, nblocks uint32, _ pg.LSN) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.rels[rel]
	if !ok {
		return fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, rel)
	}
	if nblocks < s.n {
		b.dropPagesLocked(rel, nblocks)
	}
	s.n = nblocks
	s.fresh = min(s.fresh, nblocks)
	return nil
}

// UnlinkRel implements fusefs.Backend.
func (b *Backend) UnlinkRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error {
	b.mu.Lock()
	if _, ok := b.rels[rel]; !ok {
		b.mu.Unlock()
		return fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, rel)
	}
	b.dropPagesLocked(rel, 0)
	delete(b.rels, rel)
	b.mu.Unlock()
	// A Files backend that indexes relation forks itself (psbackend does,
	// from the pageserver) must forget this one, or it keeps the folder
	// from being removed.
	if _, err := b.o.Files.Nblocks(ctx, rel); err == nil {
		if err := b.o.Files.UnlinkRel(ctx, rel, w); err != nil && !errors.Is(err, fusefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// List implements fusefs.Backend.
func (b *Backend) List(ctx context.Context) ([]fusefs.FileInfo, error) { return b.o.Files.List(ctx) }

// Mkdir implements fusefs.Backend.
func (b *Backend) Mkdir(ctx context.Context, p string, mode uint32, w pg.LSN) error {
	return b.o.Files.Mkdir(ctx, p, mode, w)
}

// CreateFile implements fusefs.Backend.
func (b *Backend) CreateFile(ctx context.Context, p string, mode uint32, w pg.LSN) error {
	return b.o.Files.CreateFile(ctx, p, mode, w)
}

// ReadFile implements fusefs.Backend.
func (b *Backend) ReadFile(ctx context.Context, p string, off int64, buf []byte) (int, error) {
	return b.o.Files.ReadFile(ctx, p, off, buf)
}

// WriteFile implements fusefs.Backend.
func (b *Backend) WriteFile(ctx context.Context, p string, off int64, data []byte, w pg.LSN) error {
	return b.o.Files.WriteFile(ctx, p, off, data, w)
}

// TruncateFile implements fusefs.Backend.
func (b *Backend) TruncateFile(ctx context.Context, p string, size int64, w pg.LSN) error {
	return b.o.Files.TruncateFile(ctx, p, size, w)
}

// Rename implements fusefs.Backend.
func (b *Backend) Rename(ctx context.Context, from, to string, w pg.LSN) error {
	return b.o.Files.Rename(ctx, from, to, w)
}

// Remove implements fusefs.Backend: a folder that holds a relation fork
// of this Backend is not empty.
func (b *Backend) Remove(ctx context.Context, p string, w pg.LSN) error {
	b.mu.Lock()
	for r := range b.rels {
		if rp := pageserver.RelPath(r, 0); path.Dir(rp) == p || strings.HasPrefix(rp, p+"/") {
			b.mu.Unlock()
			return fmt.Errorf("%w: %s", fusefs.ErrNotEmpty, p)
		}
	}
	b.mu.Unlock()
	return b.o.Files.Remove(ctx, p, w)
}

// Sync implements fusefs.Backend: relation pages need no durability here
// (their WAL is durable on the safekeepers); files do.
func (b *Backend) Sync(ctx context.Context, w pg.LSN) error { return b.o.Files.Sync(ctx, w) }

var _ fusefs.Sender = (*Backend)(nil)

// Send implements fusefs.Sender: it sends what Files buffered without
// waiting for durability (a Files backend that is no Sender has nothing
// buffered). Relation pages have nothing to send.
func (b *Backend) Send(ctx context.Context) error {
	if s, ok := b.o.Files.(fusefs.Sender); ok {
		return s.Send(ctx)
	}
	return nil
}

// Stats are the local store's counters.
type Stats struct {
	Pages   int `json:"pages"`
	Pinned  int `json:"pinned"`
	Evicted int `json:"evicted"`
	// Refetches counts reads of evicted pages asked again at W (see ReadPage).
	Refetches int `json:"refetches"`
}

// Stats returns the local store's current sizes.
func (b *Backend) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{Pages: len(b.pages), Pinned: len(b.pages) - b.lru.Len(), Evicted: len(b.evicted), Refetches: int(b.refetches.Load())}
}

// Metrics are a Backend's counters.
type Metrics struct {
	hits, fetches, refetches, zeros, writes, evictions prometheus.Counter
}

// NewMetrics returns counters registered in reg (nil: unregistered).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	c := func(name, help string) prometheus.Counter {
		ctr := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		if reg != nil {
			reg.MustRegister(ctr)
		}
		return ctr
	}
	return &Metrics{
		hits:      c("strata_redobackend_local_reads_total", "Page reads served by the local page store."),
		fetches:   c("strata_redobackend_getpage_total", "Page reads sent to the pageserver (rebuilt from WAL)."),
		refetches: c("strata_redobackend_getpage_at_wal_position_total", "Reads of evicted pages that the pageserver did not have at their page LSN, asked again at the compute's WAL position."),
		zeros:     c("strata_redobackend_fresh_reads_total", "Reads of never-written blocks past a fork's known end, served as zeros."),
		writes:    c("strata_redobackend_page_writes_total", "Page writes kept in the local page store."),
		evictions: c("strata_redobackend_evictions_total", "Pages evicted from the local page store."),
	}
}

// ClientPages is Pages on the pageserver's gRPC client, for timeline tl.
func ClientPages(c *client.Client, tl pg.TimelineID) Pages { return clientPages{c: c, tl: tl} }

type clientPages struct {
	c  *client.Client
	tl pg.TimelineID
}

func (p clientPages) GetPage(ctx context.Context, key pg.PageKey, nms pg.LSN) ([]byte, error) {
	d, err := p.c.GetPage(ctx, p.tl, client.PageRequest{Page: key, RequestLSN: client.LatestLSN, NotModifiedSince: nms})
	if errors.Is(err, timeline.ErrNotFound) {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	return d, err
}

func (p clientPages) ListRels(ctx context.Context) ([]fusefs.RelInfo, error) {
	_, rels, err := p.c.ListFiles(ctx, p.tl, client.LatestLSN)
	if err != nil || len(rels) == 0 {
		return nil, err
	}
	sizes, err := p.c.Nblocks(ctx, p.tl, rels, client.LatestLSN, 0)
	if err != nil {
		return nil, err
	}
	var out []fusefs.RelInfo
	for i, r := range rels {
		if sizes[i].Exists {
			out = append(out, fusefs.RelInfo{Rel: r, Nblocks: sizes[i].Nblocks})
		}
	}
	return out, nil
}

// TimelinePages is Pages on a timeline in the same process (tests, and a
// compute embedded with its pageserver).
func TimelinePages(tl *timeline.Timeline) Pages { return timelinePages{tl: tl} }

type timelinePages struct{ tl *timeline.Timeline }

func (p timelinePages) GetPage(ctx context.Context, key pg.PageKey, nms pg.LSN) ([]byte, error) {
	d, err := p.tl.GetPage(ctx, key, timeline.LatestLSN, nms)
	if errors.Is(err, timeline.ErrNotFound) {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), d...), nil
}

func (p timelinePages) ListRels(ctx context.Context) ([]fusefs.RelInfo, error) {
	rels, err := p.tl.ListRels(ctx, keyspace.RelsRange, timeline.LatestLSN)
	if err != nil {
		return nil, err
	}
	out := make([]fusefs.RelInfo, 0, len(rels))
	for _, r := range rels {
		n, _, err := p.tl.Nblocks(ctx, r, timeline.LatestLSN)
		if err != nil {
			return nil, err
		}
		out = append(out, fusefs.RelInfo{Rel: r, Nblocks: n})
	}
	return out, nil
}
