package fusefs

import (
	"context"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratadb/strata/sdk/pg"
)

// BatchReader is a Backend that reads several pages in one request. The
// read-ahead uses it when the Backend has it; otherwise it reads the pages
// one by one (still ahead of the reader).
type BatchReader interface {
	// ReadPages fills pages[i] (pg.BlockSize bytes each) like ReadPage
	// would for keys[i] with notModifiedSince[i], and returns one error
	// per page (nil for the pages read).
	ReadPages(ctx context.Context, keys []pg.PageKey, notModifiedSince []pg.LSN, pages [][]byte) []error
}

// readAhead fetches the blocks that follow a sequential reader of a
// relation fork before it asks for them: Postgres reads one 8 KiB block
// per call, so a sequential scan of pages that are in no cache tier pays a
// whole round trip to the pageserver per block (about 0.7 ms here, 12 MB/s
// per reader). A reader is a process (the FUSE caller's PID) on one fork;
// once it has read two blocks in a row (or skipped at most half a window
// forward, over blocks it found in shared_buffers; the fetched copies of
// the blocks it skips are dropped), the next window of
// blocks below the fork's end is fetched in one batch, and the next batch
// goes out when less than a window is left ahead of the reader (a batch
// takes about as long as the reader needs for half a window: with half a
// window of lead the reader waited for most batches).
//
// Fetched pages wait here until read, once; a write, truncation, creation
// or unlink of the fork drops the pages it touches, fetched or in flight,
// so a reader never gets a version older than the last write (the fetch
// itself asks with not_modified_since from the last-written-LSN map). At
// most readAheadCap windows of pages are held. Pages do not expire on a
// timer: only when a new window would pass the cap are the fetched pages
// that nobody read and whose fetch began more than readAheadTTL ago
// dropped (sweepPagesLocked), and if that leaves too little room the
// window is not fetched. take hands out a page of any age: it is still
// the newest, as every write of this compute drops its page. A parallel
// sequential scan hands its workers chunks of 32-64 blocks: each worker is
// a reader of its own, and the window it fetches past the end of its chunk
// is often read by the next worker (or dropped unread: 14-15% of the pages
// fetched in a 574 MB scan with a window of 64).
type readAhead struct {
	fsys   *FS
	window uint32

	mu    sync.Mutex
	pages map[pg.PageKey]*raPage
	runs  map[raStream]*raRun
}

type raStream struct {
	rel pg.RelTag
	pid uint32
}

type raRun struct {
	next  uint32 // the block a sequential reader reads next
	run   int    // reads in a row
	ahead uint32 // blocks below it are fetched or in flight
	used  time.Time
}

type raPage struct {
	done chan struct{}
	data []byte
	err  error
	at   time.Time
}

const (
	readAheadTTL = 250 * time.Millisecond
	readAheadCap = 32 // windows of pages held at most (16 MiB at the default window)
	maxRuns      = 4096
)

func newReadAhead(f *FS, window int) *readAhead {
	if window <= 0 {
		return nil
	}
	return &readAhead{fsys: f, window: uint32(window), pages: map[pg.PageKey]*raPage{}, runs: map[raStream]*raRun{}}
}

// take removes and returns the fetched (or in-flight) page key, or nil.
func (ra *readAhead) take(key pg.PageKey) *raPage {
	if ra == nil {
		return nil
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	p := ra.pages[key]
	if p != nil {
		delete(ra.pages, key)
	}
	return p
}

// forget drops the page key (it was written).
func (ra *readAhead) forget(key pg.PageKey) {
	if ra == nil {
		return
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if _, ok := ra.pages[key]; ok {
		delete(ra.pages, key)
		ra.fsys.waits.raDropped.Add(1)
	}
}

// forgetFork drops the pages of rel from block from on, and moves every
// reader's fetch mark of rel back to it (the fork was truncated, created
// again or unlinked).
func (ra *readAhead) forgetFork(rel pg.RelTag, from uint32) {
	if ra == nil {
		return
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for k := range ra.pages {
		if k.Tag() == rel && k.Block >= from {
			delete(ra.pages, k)
			ra.fsys.waits.raDropped.Add(1)
		}
	}
	for s, r := range ra.runs {
		if s.rel == rel && r.ahead > from {
			r.ahead = from
		}
	}
}

// observe notes that the caller of ctx read block blk of rel, which has
// nblocks blocks, and starts fetching the next window when the caller
// reads sequentially.
func (ra *readAhead) observe(ctx context.Context, rel pg.RelTag, blk, nblocks uint32) {
	if ra == nil {
		return
	}
	var pid uint32
	if c, ok := fuse.FromContext(ctx); ok {
		pid = c.Pid
	}
	now := time.Now()
	s := raStream{rel: rel, pid: pid}
	ra.mu.Lock()
	r := ra.runs[s]
	if r == nil {
		if len(ra.runs) >= maxRuns {
			ra.sweepRunsLocked(now)
		}
		r = &raRun{}
		ra.runs[s] = r
	}
	if blk >= r.next && blk <= r.next+ra.window/2 && r.run > 0 {
		r.run++
		// The blocks it skipped (found in shared_buffers, or not wanted:
		// ANALYZE reads a sample of the blocks in order) will not be read
		// by it: drop what was fetched of them, or unread pages fill the
		// cap and stop the next windows.
		for b := r.next; b < blk; b++ {
			if _, ok := ra.pages[rel.Page(b)]; ok {
				delete(ra.pages, rel.Page(b))
				ra.fsys.waits.raDropped.Add(1)
			}
		}
	} else {
		r.run, r.ahead = 1, 0
	}
	r.next, r.used = blk+1, now
	if r.run < 2 || r.ahead > blk+1+ra.window {
		ra.mu.Unlock()
		return
	}
	from := max(r.ahead, blk+1)
	to := min(from+ra.window, nblocks)
	if to <= from {
		ra.mu.Unlock()
		return
	}
	if len(ra.pages)+int(to-from) > readAheadCap*int(ra.window) {
		ra.sweepPagesLocked(now)
		if len(ra.pages)+int(to-from) > readAheadCap*int(ra.window) {
			ra.mu.Unlock()
			return
		}
	}
	r.ahead = to
	keys := make([]pg.PageKey, 0, to-from)
	ps := make([]*raPage, 0, to-from)
	for b := from; b < to; b++ {
		k := rel.Page(b)
		if _, ok := ra.pages[k]; ok {
			continue
		}
		p := &raPage{done: make(chan struct{}), at: now}
		ra.pages[k] = p
		keys = append(keys, k)
		ps = append(ps, p)
	}
	ra.mu.Unlock()
	if len(keys) > 0 {
		go ra.fetch(keys, ps)
	}
}

// fetch reads keys into ps, in one batch when the Backend can.
func (ra *readAhead) fetch(keys []pg.PageKey, ps []*raPage) {
	f := ra.fsys
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nms := make([]pg.LSN, len(keys))
	pages := make([][]byte, len(keys))
	buf := make([]byte, len(keys)*pg.BlockSize)
	for i, k := range keys {
		nms[i] = f.lw.Get(k)
		pages[i] = buf[i*pg.BlockSize : (i+1)*pg.BlockSize : (i+1)*pg.BlockSize]
	}
	t := time.Now()
	var errs []error
	if br, ok := f.be.(BatchReader); ok {
		errs = br.ReadPages(ctx, keys, nms, pages)
	} else {
		errs = make([]error, len(keys))
		for i, k := range keys {
			errs[i] = f.be.ReadPage(ctx, k, nms[i], pages[i])
		}
	}
	f.waits.raNanos.Add(uint64(time.Since(t)))
	f.waits.raBatches.Add(1)
	f.waits.raFetched.Add(uint64(len(keys)))
	for i, p := range ps {
		p.data, p.err = pages[i], errs[i]
		close(p.done)
	}
}

// sweepPagesLocked drops fetched pages older than readAheadTTL.
// REQUIRES: ra.mu held.
func (ra *readAhead) sweepPagesLocked(now time.Time) {
	for k, p := range ra.pages {
		select {
		case <-p.done:
		default:
			continue // in flight
		}
		if now.Sub(p.at) > readAheadTTL {
			delete(ra.pages, k)
			ra.fsys.waits.raDropped.Add(1)
		}
	}
}

// sweepRunsLocked drops the readers not seen for readAheadTTL.
// REQUIRES: ra.mu held.
func (ra *readAhead) sweepRunsLocked(now time.Time) {
	for s, r := range ra.runs {
		if now.Sub(r.used) > readAheadTTL {
			delete(ra.runs, s)
		}
	}
}

// wait waits for p; it reports whether p holds the page.
func (p *raPage) wait(ctx context.Context) bool {
	select {
	case <-p.done:
		return p.err == nil
	case <-ctx.Done():
		return false
	}
}
