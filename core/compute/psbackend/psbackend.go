// Package psbackend is the compute's fusefs.Backend on the pageserver, in
// writeback mode: page images and non-relation files written by Postgres go
// to one pageserver timeline through the gRPC client, each tagged with W
// (the compute's WAL position), and the pageserver keeps them pending until
// the commit LSN reaches W (DESIGN.md invariant 2).
//
// Page writes are buffered (Options.WriteBuffer) and sent in batches; Sync,
// Send and Close send the buffer first, and so does a file or folder change
// after a fork was created, truncated or unlinked (settle); reads see
// buffered pages. A full buffer is sent by a background flusher, so the
// write that fills it does not wait for the round trip; only a buffer four
// times the size (the pageserver slower than the writes) makes the writer
// send it itself.
//
// One Backend serves one timeline for one primary compute, the only writer
// of that timeline. It therefore keeps an authoritative local index: the
// size of every relation fork, the size (and, once read, the content) of
// every non-relation file, and the folders. Folders and their modes are not
// a pageserver notion; they are stored in the timeline as the non-relation
// file DirsFile, rewritten on Mkdir and on the removal of a folder.
//
// Requests are detached from the caller's cancellation (context.WithoutCancel):
// the filesystem cancels a request's context when the kernel interrupts
// it (Postgres takes signals all the time), and a mutation cut in half, an
// EINTR from fsync or an EIO on a read would hurt Postgres more than the
// wait. Sync is bounded by Options.SyncTimeout instead.
//
// Sync(w) waits until the pageserver reports every version tagged at or
// below w durable. In a cluster the safekeepers' commit LSN drives that;
// with Options.StandaloneCommit the Backend advances the timeline's commit
// LSN to w itself (tests and single-node use without safekeepers).
package psbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// DirsFile is the non-relation file that records the folders and their
// modes, one "mode path" line each after a "strata-dirs N" header.
const DirsFile = ".strata_dirs"

// ErrClosed: the Backend was closed.
var ErrClosed = errors.New("psbackend: closed")

// ErrLost: the pageserver restarted (a new incarnation) while it held
// versions of this Backend that were not yet durable; they are gone, so
// every later Sync fails with it (the filesystem answers EIO, Postgres
// PANICs, and the agent restarts it on a new Backend: crash recovery
// rewrites them from the WAL).
var ErrLost = errors.New("psbackend: pending versions lost in a pageserver restart")

// Options configure a Backend.
type Options struct {
	// StandaloneCommit makes Sync advance the timeline's commit LSN to w
	// itself (AdvanceCommitLSN) before waiting. Only for a timeline whose
	// commit LSN is the pageserver's settable one (no safekeepers).
	StandaloneCommit bool
	// SyncTimeout bounds one Sync (0: no bound; in a cluster Sync waits for
	// the safekeepers as long as they take).
	SyncTimeout time.Duration
	// SyncPoll is how often Sync re-reads the durable LSN (default 2ms).
	SyncPoll time.Duration
	// ZeroBatch bounds the pages sent in one PutPages (default 256).
	ZeroBatch int
	// WriteBuffer is how many page writes are kept before they are sent in
	// one PutPages (default 64; 1 sends every write at once, in the
	// writer's call). A full buffer is sent in the background; at four
	// times WriteBuffer the writer sends it itself and waits. Buffered
	// pages are read back from the buffer; Sync, Send and Close send them
	// first, and so does a file or folder change after a fork was created,
	// truncated or unlinked (settle).
	WriteBuffer int
	Log         zerolog.Logger
}

type fileEnt struct {
	size   int64
	data   []byte // content when loaded
	loaded bool
}

// Backend implements fusefs.Backend on a pageserver timeline. Safe for
// concurrent use; the caller serializes mutations of one fork or file.
type Backend struct {
	c    *client.Client
	tl   pg.TimelineID
	opts Options

	dirMu   sync.Mutex // serializes folder changes (DirsFile rewrites)
	flushMu sync.Mutex // serializes flushes of the page buffer

	mu       sync.Mutex
	rels     map[pg.RelTag]uint32
	files    map[string]*fileEnt
	dirs     map[string]uint32 // path -> mode
	maxW     pg.LSN            // highest W sent
	durable  pg.LSN            // highest durable LSN seen
	advanced pg.LSN            // highest commit LSN set (StandaloneCommit)
	inc      uint64            // pageserver incarnation holding the pending versions
	lost     error             // ErrLost once pending versions were lost
	lostCh   chan struct{}     // closed when lost is set
	closed   bool
	buf      map[pg.PageKey]*bufPage // page writes not yet sent
	// sizeW is, per fork, the highest LSN of a size version sent: every
	// later size change is tagged at least that high, so the newest size
	// is the newest version (buffered pages go out with mixed W).
	sizeW map[pg.RelTag]pg.LSN
	// psSize is, per fork, a size the pageserver's newest size version is
	// at least (this compute is the only writer): a batch whose pages all
	// lie below it extends nothing there, and flush need not restate it.
	psSize map[pg.RelTag]uint32
	// resized holds the forks created, truncated or unlinked since the
	// last send, each with the number of its latest such change (resizes
	// counts them): the next flush stores their sizes (drops, for those in
	// drops) with the page writes, in the same round trip, and forgets
	// only the changes it carried.
	resized map[pg.RelTag]uint64
	resizes uint64
	drops   map[pg.RelTag]bool

	kick     chan struct{} // cap 1: the buffer is full, the flusher should send it
	stop     chan struct{} // closed by Close: the flusher exits
	stopOnce sync.Once
	bg       sync.WaitGroup
}

type bufPage struct {
	data []byte // nil: a page of zeros (sent without its 8 KiB)
	w    pg.LSN
}

var (
	_ fusefs.Backend     = (*Backend)(nil)
	_ fusefs.Sender      = (*Backend)(nil)
	_ fusefs.BatchReader = (*Backend)(nil)
)

// Open loads the timeline's index (files, relation forks and their sizes,
// folders) and returns a Backend on it. The client stays owned by the
// caller. A timeline without DirsFile (imported from a data directory, or
// new) gets Postgres' fixed folders plus the parents of its files.
func Open(ctx context.Context, c *client.Client, tl pg.TimelineID, opts Options) (*Backend, error) {
	if opts.SyncPoll <= 0 {
		opts.SyncPoll = 2 * time.Millisecond
	}
	if opts.ZeroBatch <= 0 {
		opts.ZeroBatch = 256
	}
	if opts.WriteBuffer <= 0 {
		opts.WriteBuffer = 64
	}
	b := &Backend{c: c, tl: tl, opts: opts, rels: map[pg.RelTag]uint32{}, files: map[string]*fileEnt{}, dirs: map[string]uint32{}, buf: map[pg.PageKey]*bufPage{}, sizeW: map[pg.RelTag]pg.LSN{}, psSize: map[pg.RelTag]uint32{}, resized: map[pg.RelTag]uint64{}, drops: map[pg.RelTag]bool{}, lostCh: make(chan struct{}),
		kick: make(chan struct{}, 1), stop: make(chan struct{})}
	fs, rels, err := c.ListFiles(ctx, tl, client.LatestLSN)
	if err != nil {
		return nil, fmt.Errorf("psbackend: list timeline %s: %w", tl, err)
	}
	if len(rels) > 0 {
		sizes, err := c.Nblocks(ctx, tl, rels, client.LatestLSN, 0)
		if err != nil {
			return nil, fmt.Errorf("psbackend: relation sizes: %w", err)
		}
		for i, r := range rels {
			if sizes[i].Exists {
				b.rels[r] = sizes[i].Nblocks
				b.psSize[r] = sizes[i].Nblocks
			}
		}
	}
	haveDirs := false
	for _, f := range fs {
		if f.Path == DirsFile {
			data, err := c.GetFile(ctx, tl, DirsFile, client.LatestLSN)
			if err != nil {
				return nil, fmt.Errorf("psbackend: read %s: %w", DirsFile, err)
			}
			if b.dirs, err = DecodeDirs(data); err != nil {
				return nil, err
			}
			haveDirs = true
			continue
		}
		b.files[f.Path] = &fileEnt{size: f.Size}
	}
	if !haveDirs && (len(fs) > 0 || len(rels) > 0) {
		for _, d := range pageserver.DataDirDirs {
			b.addDirLocked(d)
		}
		for p := range b.files {
			b.addDirLocked(path.Dir(p))
		}
		for r := range b.rels {
			b.addDirLocked(path.Dir(pageserver.RelPath(r, 0)))
		}
	}
	b.bg.Add(1)
	go b.flusher()
	return b, nil
}

func (b *Backend) addDirLocked(d string) {
	for d != "." && d != "" && d != "/" {
		if _, ok := b.dirs[d]; !ok {
			b.dirs[d] = 0o700
		}
		d = path.Dir(d)
	}
}

func encodeDirs(dirs map[string]uint32) []byte {
	ps := make([]string, 0, len(dirs))
	for p := range dirs {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "strata-dirs %d\n", len(ps))
	for _, p := range ps {
		fmt.Fprintf(&buf, "%o %s\n", dirs[p], p)
	}
	return buf.Bytes()
}

// DecodeDirs parses DirsFile: each folder's path and mode. Bytes after
// the counted lines are ignored (a shorter rewrite whose truncation was
// not applied).
func DecodeDirs(data []byte) (map[string]uint32, error) {
	lines := strings.Split(string(data), "\n")
	var n int
	if _, err := fmt.Sscanf(lines[0], "strata-dirs %d", &n); err != nil || n > len(lines)-1 {
		return nil, fmt.Errorf("psbackend: corrupt %s header %q", DirsFile, lines[0])
	}
	out := make(map[string]uint32, n)
	for _, l := range lines[1 : n+1] {
		m, p, ok := strings.Cut(l, " ")
		mode, err := strconv.ParseUint(m, 8, 32)
		if !ok || err != nil || p == "" {
			return nil, fmt.Errorf("psbackend: corrupt %s line %q", DirsFile, l)
		}
		out[p] = uint32(mode)
	}
	return out, nil
}

// Close sends the buffered page writes and marks the Backend closed (the
// client is the caller's); a Sync still waiting for durability returns
// ErrClosed.
func (b *Backend) Close() error {
	b.stopOnce.Do(func() { close(b.stop) })
	b.bg.Wait()
	err := b.flush(context.Background())
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return err
}

// note returns a function that records the Ack of a mutation tagged w (or
// of GetDurable, w = 0) and passes its error on. It applies the client's
// incarnation rules: the first incarnation seen is the one holding this
// Backend's pending versions; an Ack of another incarnation while versions
// are pending (sent above the durable LSN) means the pageserver restarted
// and forgot them, and every later Sync fails (ErrLost) so that Postgres
// PANICs and recovers from the WAL. Durable LSNs count only from Acks of the
// current incarnation.
func (b *Backend) note(w pg.LSN) func(client.Ack, error) error {
	return func(a client.Ack, err error) error {
		if err != nil {
			return err
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.seeLocked(a.Incarnation)
		b.maxW = max(b.maxW, w)
		if a.Incarnation == b.inc {
			b.durable = max(b.durable, a.Durable)
		}
		return nil
	}
}

// seeLocked notes an answer of incarnation inc (0: unknown): another one
// than the incarnation that accepted versions not yet seen durable means
// they are lost. REQUIRES: b.mu held.
func (b *Backend) seeLocked(inc uint64) {
	if inc == 0 {
		return
	}
	switch {
	case b.inc == 0:
		b.inc = inc
	case inc != b.inc:
		if b.maxW > b.durable && b.lost == nil {
			b.lost = fmt.Errorf("%w: pageserver incarnation %x became %x while versions up to %s were above the durable LSN %s", ErrLost, b.inc, inc, b.maxW, b.durable)
			b.opts.Log.Error().Err(b.lost).Msg("pending page versions lost")
			close(b.lostCh)
		}
		b.inc = inc
	}
}

// checkRead applies the client's rule 4 to a page or file read answered by
// a: once versions are lost (noticed here or by a write's Ack), no read
// from the pageserver is used, since it may be an older version of a page
// or file whose newer version was lost. Postgres gets EIO until the agent
// restarts it.
func (b *Backend) checkRead(a client.Ack) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seeLocked(a.Incarnation)
	return b.lost
}

// sent records that a mutation tagged w went out.
func (b *Backend) sent(w pg.LSN, durable pg.LSN) {
	b.mu.Lock()
	b.maxW = max(b.maxW, w)
	b.durable = max(b.durable, durable)
	b.mu.Unlock()
}

func mapErr(err error) error {
	if errors.Is(err, timeline.ErrNotFound) {
		return fmt.Errorf("%w: %v", fusefs.ErrNotFound, err)
	}
	return err
}

// sizeTag returns the tag for a size change of rel made at w and records it.
func (b *Backend) sizeTag(rel pg.RelTag, w pg.LSN) pg.LSN {
	b.mu.Lock()
	defer b.mu.Unlock()
	w = max(w, b.sizeW[rel])
	b.sizeW[rel] = w
	return w
}

// ListRels implements fusefs.Backend.
func (b *Backend) ListRels(ctx context.Context) ([]fusefs.RelInfo, error) {
	ctx = context.WithoutCancel(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]fusefs.RelInfo, 0, len(b.rels))
	for r, n := range b.rels {
		out = append(out, fusefs.RelInfo{Rel: r, Nblocks: n})
	}
	return out, nil
}

// CreateRel implements fusefs.Backend. The new fork exists here at once;
// the pageserver learns of it with the next send of the page buffer (a
// full buffer, Sync, Send, Close, or settle before a file or folder
// change), in the same round trip as the pages. Like a buffered page, a
// fork that no Sync covered is gone after a crash of the agent, and
// Postgres' crash recovery creates it again from the WAL (smgr create
// records); one that a Sync covered is durable.
func (b *Backend) CreateRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error {
	b.sizeTag(rel, w)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	// An existing fork is reset (relfilenode reuse): its buffered writes
	// go, as with a truncation to zero blocks.
	b.dropBufferedLocked(rel, 0)
	b.rels[rel] = 0
	delete(b.psSize, rel)
	delete(b.drops, rel)
	b.resizes++
	b.resized[rel] = b.resizes
	return nil
}

func (b *Backend) size(rel pg.RelTag) (uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, ErrClosed
	}
	n, ok := b.rels[rel]
	if !ok {
		return 0, fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, rel)
	}
	return n, nil
}

// Nblocks implements fusefs.Backend.
func (b *Backend) Nblocks(ctx context.Context, rel pg.RelTag) (uint32, error) {
	return b.size(rel)
}

// ReadPage implements fusefs.Backend: GetPage at the latest LSN, with
// notModifiedSince capped at the highest W this Backend sent (the
// pageserver holds every write of this compute, so it need not wait).
func (b *Backend) ReadPage(ctx context.Context, key pg.PageKey, notModifiedSince pg.LSN, page []byte) error {
	return b.ReadPages(ctx, []pg.PageKey{key}, []pg.LSN{notModifiedSince}, [][]byte{page})[0]
}

// ReadPages implements fusefs.BatchReader (the read-ahead): the pages in
// the write buffer are copied from it, the others read with one GetPages,
// each like ReadPage reads it.
func (b *Backend) ReadPages(ctx context.Context, keys []pg.PageKey, notModifiedSince []pg.LSN, pages [][]byte) []error {
	ctx = context.WithoutCancel(ctx)
	errs := make([]error, len(keys))
	reqs := make([]client.PageRequest, 0, len(keys))
	idx := make([]int, 0, len(keys))
	b.mu.Lock()
	for i, k := range keys {
		n, ok := b.rels[k.Tag()]
		switch {
		case b.closed:
			errs[i] = ErrClosed
		case !ok:
			errs[i] = fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, k.Tag())
		case k.Block >= n:
			errs[i] = fmt.Errorf("%w: block %s past the end (%d blocks)", fusefs.ErrNotFound, k, n)
		default:
			if p, ok := b.buf[k]; ok {
				if p.data == nil {
					clear(pages[i])
				} else {
					copy(pages[i], p.data)
				}
				continue
			}
			reqs = append(reqs, client.PageRequest{Page: k, RequestLSN: client.LatestLSN, NotModifiedSince: min(notModifiedSince[i], b.maxW)})
			idx = append(idx, i)
		}
	}
	b.mu.Unlock()
	if len(reqs) == 0 {
		return errs
	}
	res, err := b.c.GetPages(ctx, b.tl, reqs)
	for j, i := range idx {
		if err != nil {
			errs[i] = err
			continue
		}
		r := res[j]
		if lost := b.checkRead(client.Ack{Incarnation: r.Incarnation}); lost != nil {
			errs[i] = lost
			continue
		}
		switch {
		case errors.Is(r.Err, timeline.ErrNotFound):
			clear(pages[i])
		case r.Err != nil:
			errs[i] = r.Err
		case len(r.Data) != pg.BlockSize:
			errs[i] = fmt.Errorf("psbackend: page %s has %d bytes", keys[i], len(r.Data))
		default:
			copy(pages[i], r.Data)
		}
	}
	return errs
}

// putZeros buffers zero pages over blocks [from, to) of rel at w, so that
// versions left from before a truncation never show through a hole.
func (b *Backend) putZeros(ctx context.Context, rel pg.RelTag, from, to uint32, w pg.LSN) error {
	for blk := from; blk < to; blk++ {
		if err := b.buffer(ctx, rel.Page(blk), nil, w); err != nil {
			return err
		}
	}
	return nil
}

// buffer keeps a page write (data is owned by the buffer from now on; nil
// is a page of zeros) and sends the buffer when it is full.
func (b *Backend) buffer(ctx context.Context, key pg.PageKey, data []byte, w pg.LSN) error {
	b.mu.Lock()
	b.buf[key] = &bufPage{data: data, w: w}
	if n, ok := b.rels[key.Tag()]; ok && key.Block >= n {
		b.rels[key.Tag()] = key.Block + 1
	}
	n := len(b.buf)
	b.mu.Unlock()
	switch {
	case n >= b.opts.WriteBuffer && (b.opts.WriteBuffer == 1 || n >= 4*b.opts.WriteBuffer):
		// Every write at once, or the flusher is behind: send it here.
		return b.flush(ctx)
	case n >= b.opts.WriteBuffer:
		select {
		case b.kick <- struct{}{}:
		default: // a flush is already due
		}
	}
	return nil
}

// flusher sends the buffer whenever a write finds it full, until Close.
// A failed send leaves the pages in the buffer: the next send (a full
// buffer, Sync, Send, Close, or settle before a file or folder change)
// carries them again and returns its error to Postgres. Meanwhile it
// retries with a backoff, and logs the first failure and the recovery.
func (b *Backend) flusher() {
	defer b.bg.Done()
	var backoff time.Duration
	for {
		select {
		case <-b.stop:
			return
		case <-b.kick:
		}
		err := b.flush(context.Background())
		switch {
		case err == nil && backoff > 0:
			b.opts.Log.Info().Msg("psbackend: background page writes are sent again")
			backoff = 0
		case err == nil:
		default:
			if backoff == 0 {
				b.opts.Log.Warn().Err(err).Msg("psbackend: sending buffered page writes in the background (kept, retried)")
			}
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-b.stop:
				t.Stop()
				return
			case <-t.C:
			}
			select {
			case b.kick <- struct{}{}:
			default:
			}
		}
	}
}

// flush sends every buffered page write, and the sizes of the forks that
// were created, truncated or extended, in one PutPages (several when there are more
// than ZeroBatch pages; the sizes go with the last). Pages stay readable
// from the buffer until the pageserver has them.
func (b *Backend) flush(ctx context.Context) error {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	if len(b.buf) == 0 && len(b.resized) == 0 {
		b.mu.Unlock()
		return nil
	}
	resized := maps.Clone(b.resized)
	sent := make(map[pg.PageKey]*bufPage, len(b.buf))
	ws := make([]client.PageWrite, 0, len(b.buf))
	for k, p := range b.buf {
		sent[k] = p
		ws = append(ws, client.PageWrite{Page: k, W: p.w, Data: p.data})
	}
	// Every page of one send carries its highest W (and no less than any
	// W sent before): a send of more than ZeroBatch pages is several
	// calls, and a page whose own W lay below an image layer that the
	// pageserver made between two of them would be hidden by that image
	// (timeline.PutPages' contract). Each page was written at or before
	// that W, and a Sync's W is past every page it sends, so no durability
	// wait changes.
	sendW := b.maxW
	for _, w := range ws {
		sendW = max(sendW, w.W)
	}
	b.mu.Unlock()
	for i := range ws {
		ws[i].W = sendW
	}
	// Ascending keys: a fork grows block by block on the pageserver.
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].Page.Tag() != ws[j].Page.Tag() {
			return relLess(ws[i].Page.Tag(), ws[j].Page.Tag())
		}
		return ws[i].Page.Block < ws[j].Page.Block
	})
	// The sizes stored with the pages: every fork created or truncated
	// since the last send, and every fork the pages extend, restated at or above its
	// pages' W (the pageserver extends a fork at the W of the page past
	// its end; the restated size, stored after it, is the newest version
	// whatever the order of earlier size changes). A fork whose pages all
	// lie below the size the pageserver already has was not extended
	// (overwrites: a checkpoint's writes, evictions) and needs none.
	top := map[pg.RelTag]pg.LSN{}
	b.mu.Lock()
	for _, w := range ws {
		rel := w.Page.Tag()
		if n, ok := b.psSize[rel]; !ok || w.Page.Block >= n {
			top[rel] = sendW
		}
	}
	for rel := range resized {
		top[rel] = sendW
	}
	sizes := make([]client.SizeWrite, 0, len(top))
	for rel, w := range top {
		n, ok := b.rels[rel]
		drop := !ok && b.drops[rel]
		if !ok && !drop {
			continue
		}
		w = max(w, b.sizeW[rel])
		b.sizeW[rel] = w
		sizes = append(sizes, client.SizeWrite{Rel: rel, Nblocks: n, W: w, Drop: drop})
	}
	b.mu.Unlock()
	var maxW pg.LSN
	for off := 0; off == 0 || off < len(ws); off += b.opts.ZeroBatch {
		batch := ws[off:min(len(ws), off+b.opts.ZeroBatch)]
		for _, w := range batch {
			maxW = max(maxW, w.W)
		}
		var withSizes []client.SizeWrite
		if off+b.opts.ZeroBatch >= len(ws) {
			withSizes = sizes // the last call
			for _, sz := range sizes {
				maxW = max(maxW, sz.W)
			}
		}
		if err := b.note(maxW)(b.c.PutPagesAck(ctx, b.tl, batch, withSizes...)); err != nil {
			return err
		}
	}
	b.mu.Lock()
	for _, sz := range sizes {
		if _, ok := b.rels[sz.Rel]; ok {
			b.psSize[sz.Rel] = sz.Nblocks
		}
	}
	for rel, seq := range resized {
		if b.resized[rel] == seq {
			delete(b.resized, rel)
			delete(b.drops, rel)
		}
	}
	for k, p := range sent {
		if b.buf[k] == p {
			delete(b.buf, k)
		}
	}
	b.mu.Unlock()
	return nil
}

func relLess(a, b pg.RelTag) bool {
	if a.Spc != b.Spc {
		return a.Spc < b.Spc
	}
	if a.DB != b.DB {
		return a.DB < b.DB
	}
	if a.Rel != b.Rel {
		return a.Rel < b.Rel
	}
	return a.Fork < b.Fork
}

// WritePage implements fusefs.Backend: the page joins the write buffer,
// sent with PutPages tagged with w. A page of zeros (Postgres extends a
// relation with one) is sent without its bytes: the pageserver stores a
// marker that reads as zeros.
func (b *Backend) WritePage(ctx context.Context, key pg.PageKey, page []byte, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	rel := key.Tag()
	n, err := b.size(rel)
	if err != nil {
		return err
	}
	if key.Block > n {
		if err := b.putZeros(ctx, rel, n, key.Block, w); err != nil {
			return err
		}
	}
	var data []byte
	if !pg.IsZeroPage(page) {
		data = bytes.Clone(page)
	}
	return b.buffer(ctx, key, data, w)
}

// dropBufferedLocked forgets the buffered writes of rel's blocks from
// block on. REQUIRES: b.mu held.
func (b *Backend) dropBufferedLocked(rel pg.RelTag, from uint32) {
	for k := range b.buf {
		if k.Tag() == rel && k.Block >= from {
			delete(b.buf, k)
		}
	}
}

// TruncateRel implements fusefs.Backend. Like CreateRel it makes no round
// trip: the buffered writes of the blocks it cuts are dropped, an
// extension buffers zero pages, and the new size goes to the pageserver
// with the next send, stored above the pages sent with it (and above every
// send before, which may have carried pages it cuts).
func (b *Backend) TruncateRel(ctx context.Context, rel pg.RelTag, nblocks uint32, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	n, err := b.size(rel)
	if err != nil {
		return err
	}
	if nblocks > n {
		if err := b.putZeros(ctx, rel, n, nblocks, w); err != nil {
			return err
		}
	}
	b.sizeTag(rel, w)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.rels[rel]; !ok {
		return fmt.Errorf("%w: relation %s", fusefs.ErrNotFound, rel)
	}
	b.dropBufferedLocked(rel, nblocks)
	b.rels[rel] = nblocks
	b.resizes++
	b.resized[rel] = b.resizes
	return nil
}

// UnlinkRel implements fusefs.Backend. Like CreateRel it makes no round
// trip: the fork and its buffered writes go here at once, and the next
// send stores the drop on the pageserver with the pages. An unlink that no
// send carried is lost with the agent: Postgres' crash recovery unlinks a
// dropped table's files again (the commit record lists them); a file the
// checkpointer unlinks after a checkpoint (the first segment of a dropped
// main fork, truncated to nothing at the drop) may stay behind empty, as
// it may on local disk after a crash.
func (b *Backend) UnlinkRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error {
	if _, err := b.size(rel); err != nil {
		return err
	}
	b.sizeTag(rel, w)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.dropBufferedLocked(rel, 0)
	delete(b.rels, rel)
	delete(b.psSize, rel)
	b.resizes++
	b.resized[rel] = b.resizes
	b.drops[rel] = true
	return nil
}

// List implements fusefs.Backend.
func (b *Backend) List(ctx context.Context) ([]fusefs.FileInfo, error) {
	b.mu.Lock()
	out := make([]fusefs.FileInfo, 0, len(b.dirs)+len(b.files))
	for p, m := range b.dirs {
		out = append(out, fusefs.FileInfo{Path: p, Dir: true, Mode: m})
	}
	for p, f := range b.files {
		out = append(out, fusefs.FileInfo{Path: p, Mode: 0o600, Size: f.size})
	}
	b.mu.Unlock()
	// Parents before children: fewer slashes first.
	sort.Slice(out, func(i, j int) bool {
		di, dj := strings.Count(out[i].Path, "/"), strings.Count(out[j].Path, "/")
		if di != dj {
			return di < dj
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

func (b *Backend) parentExistsLocked(p string) bool {
	d := path.Dir(p)
	if d == "." {
		return true
	}
	_, ok := b.dirs[d]
	return ok
}

func (b *Backend) existsLocked(p string) bool {
	_, f := b.files[p]
	_, d := b.dirs[p]
	return f || d
}

func validPath(p string) error {
	if p == "" || p == DirsFile || path.Clean(p) != p || strings.HasPrefix(p, "/") || strings.HasPrefix(p, "../") {
		return fmt.Errorf("psbackend: invalid path %q", p)
	}
	return nil
}

// settle sends the buffer first when a fork was created, truncated or
// unlinked since the last send, so that a mutation sent on its own (a
// file, a folder) never reaches the pageserver before them. Postgres never
// fsyncs a new fork: a checkpoint writes pg_control after the fsyncs of
// the files it wrote, and without this a pg_control whose redo point lies
// past a CREATE TABLE could be stored, and become durable, while the
// table's forks were still here (lost with the agent); crash recovery,
// starting past the create record, would not make them again.
func (b *Backend) settle(ctx context.Context) error {
	b.mu.Lock()
	n := len(b.resized)
	b.mu.Unlock()
	if n == 0 {
		return nil
	}
	return b.flush(ctx)
}

// writeDirs stores the folder list at w. REQUIRES: b.dirMu held, so that
// rewrites reach the pageserver in the order of the snapshots.
func (b *Backend) writeDirs(ctx context.Context, data []byte, w pg.LSN) error {
	if err := b.settle(ctx); err != nil {
		return err
	}
	if err := b.note(w)(b.c.WriteFileAck(ctx, b.tl, DirsFile, 0, data, w)); err != nil {
		return err
	}
	if err := b.note(w)(b.c.TruncateFileAck(ctx, b.tl, DirsFile, int64(len(data)), w)); err != nil {
		return err
	}
	b.sent(w, 0)
	return nil
}

// Mkdir implements fusefs.Backend.
func (b *Backend) Mkdir(ctx context.Context, p string, mode uint32, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := validPath(p); err != nil {
		return err
	}
	b.dirMu.Lock()
	defer b.dirMu.Unlock()
	b.mu.Lock()
	if b.existsLocked(p) {
		b.mu.Unlock()
		return fmt.Errorf("%w: %s", fusefs.ErrExists, p)
	}
	if !b.parentExistsLocked(p) {
		b.mu.Unlock()
		return fmt.Errorf("%w: parent of %s", fusefs.ErrNotFound, p)
	}
	b.dirs[p] = mode & 0o7777
	data := encodeDirs(b.dirs)
	b.mu.Unlock()
	if err := b.writeDirs(ctx, data, w); err != nil {
		b.mu.Lock()
		delete(b.dirs, p)
		b.mu.Unlock()
		return err
	}
	return nil
}

// CreateFile implements fusefs.Backend.
func (b *Backend) CreateFile(ctx context.Context, p string, mode uint32, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := b.settle(ctx); err != nil {
		return err
	}
	if err := validPath(p); err != nil {
		return err
	}
	b.mu.Lock()
	if b.existsLocked(p) {
		b.mu.Unlock()
		return fmt.Errorf("%w: %s", fusefs.ErrExists, p)
	}
	if !b.parentExistsLocked(p) {
		b.mu.Unlock()
		return fmt.Errorf("%w: parent of %s", fusefs.ErrNotFound, p)
	}
	b.mu.Unlock()
	if err := b.note(w)(b.c.TruncateFileAck(ctx, b.tl, p, 0, w)); err != nil {
		return err
	}
	b.sent(w, 0)
	b.mu.Lock()
	b.files[p] = &fileEnt{loaded: true}
	b.mu.Unlock()
	return nil
}

// content returns the file's entry with its content loaded.
func (b *Backend) content(ctx context.Context, p string) (*fileEnt, error) {
	b.mu.Lock()
	f, ok := b.files[p]
	if !ok {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: file %s", fusefs.ErrNotFound, p)
	}
	if f.loaded {
		b.mu.Unlock()
		return f, nil
	}
	b.mu.Unlock()
	data, ack, err := b.c.GetFileAck(ctx, b.tl, p, client.LatestLSN)
	if lost := b.checkRead(ack); lost != nil {
		return nil, lost
	}
	if err != nil {
		return nil, mapErr(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.files[p]; ok && cur == f && !f.loaded {
		f.data, f.size, f.loaded = data, int64(len(data)), true
	}
	return f, nil
}

// ReadFile implements fusefs.Backend; the content is fetched (GetFile) on
// the first read and kept, written through, from then on.
func (b *Backend) ReadFile(ctx context.Context, p string, off int64, buf []byte) (int, error) {
	ctx = context.WithoutCancel(ctx)
	f, err := b.content(ctx, p)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if off >= int64(len(f.data)) {
		return 0, nil
	}
	return copy(buf, f.data[off:]), nil
}

// invalidate forgets a file's cached content after a failed mutation.
func (b *Backend) invalidate(p string) {
	b.mu.Lock()
	if f, ok := b.files[p]; ok {
		f.loaded, f.data = false, nil
	}
	b.mu.Unlock()
}

// WriteFile implements fusefs.Backend.
func (b *Backend) WriteFile(ctx context.Context, p string, off int64, data []byte, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := b.settle(ctx); err != nil {
		return err
	}
	f, err := b.content(ctx, p)
	if err != nil {
		return err
	}
	if err := b.note(w)(b.c.WriteFileAck(ctx, b.tl, p, off, data, w)); err != nil {
		b.invalidate(p)
		return err
	}
	b.sent(w, 0)
	b.mu.Lock()
	if end := off + int64(len(data)); end > int64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
	}
	copy(f.data[off:], data)
	f.size = int64(len(f.data))
	b.mu.Unlock()
	return nil
}

// TruncateFile implements fusefs.Backend.
func (b *Backend) TruncateFile(ctx context.Context, p string, size int64, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := b.settle(ctx); err != nil {
		return err
	}
	f, err := b.content(ctx, p)
	if err != nil {
		return err
	}
	if err := b.note(w)(b.c.TruncateFileAck(ctx, b.tl, p, size, w)); err != nil {
		b.invalidate(p)
		return err
	}
	b.sent(w, 0)
	b.mu.Lock()
	if size <= int64(len(f.data)) {
		f.data = f.data[:size:size]
	} else {
		f.data = append(f.data, make([]byte, size-int64(len(f.data)))...)
	}
	f.size = size
	b.mu.Unlock()
	return nil
}

// Rename implements fusefs.Backend as replace-target-then-unlink-source,
// both at w: not atomic on the pageserver (a crash in between leaves both
// files), but the target is never torn: its new content and size are one
// step (ReplaceFile; before, a write then a truncate, and a crash between
// them left a target that had been longer with the new content and the
// old tail).
func (b *Backend) Rename(ctx context.Context, from, to string, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := b.settle(ctx); err != nil {
		return err
	}
	if err := validPath(to); err != nil {
		return err
	}
	f, err := b.content(ctx, from)
	if err != nil {
		return err
	}
	b.mu.Lock()
	if _, isDir := b.dirs[to]; isDir || !b.parentExistsLocked(to) {
		b.mu.Unlock()
		return fmt.Errorf("%w: rename target %s", fusefs.ErrNotFound, to)
	}
	data := bytes.Clone(f.data)
	b.mu.Unlock()
	if err := b.note(w)(b.c.ReplaceFileAck(ctx, b.tl, to, data, w)); err != nil {
		b.invalidate(to)
		return err
	}
	if err := b.note(w)(b.c.UnlinkFileAck(ctx, b.tl, from, w)); err != nil {
		return err
	}
	b.sent(w, 0)
	b.mu.Lock()
	b.files[to] = &fileEnt{size: int64(len(data)), data: data, loaded: true}
	delete(b.files, from)
	b.mu.Unlock()
	return nil
}

// Remove implements fusefs.Backend.
func (b *Backend) Remove(ctx context.Context, p string, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if err := b.settle(ctx); err != nil {
		return err
	}
	b.dirMu.Lock()
	defer b.dirMu.Unlock()
	b.mu.Lock()
	if _, ok := b.files[p]; ok {
		b.mu.Unlock()
		if err := b.note(w)(b.c.UnlinkFileAck(ctx, b.tl, p, w)); err != nil {
			return mapErr(err)
		}
		b.sent(w, 0)
		b.mu.Lock()
		delete(b.files, p)
		b.mu.Unlock()
		return nil
	}
	mode, ok := b.dirs[p]
	if !ok {
		b.mu.Unlock()
		return fmt.Errorf("%w: %s", fusefs.ErrNotFound, p)
	}
	prefix := p + "/"
	for q := range b.dirs {
		if strings.HasPrefix(q, prefix) {
			b.mu.Unlock()
			return fmt.Errorf("%w: %s", fusefs.ErrNotEmpty, p)
		}
	}
	for q := range b.files {
		if strings.HasPrefix(q, prefix) {
			b.mu.Unlock()
			return fmt.Errorf("%w: %s", fusefs.ErrNotEmpty, p)
		}
	}
	for r := range b.rels {
		if path.Dir(pageserver.RelPath(r, 0)) == p {
			b.mu.Unlock()
			return fmt.Errorf("%w: %s", fusefs.ErrNotEmpty, p)
		}
	}
	delete(b.dirs, p)
	data := encodeDirs(b.dirs)
	b.mu.Unlock()
	if err := b.writeDirs(ctx, data, w); err != nil {
		b.mu.Lock()
		b.dirs[p] = mode
		b.mu.Unlock()
		return err
	}
	return nil
}

// Send implements fusefs.Sender: it sends the buffered page writes without
// waiting for them to become durable. Like Sync it fails with ErrLost once
// the pageserver forgot pending versions: in crash recovery that makes the
// end-of-recovery checkpoint PANIC before it writes pg_control, instead of
// letting a pg_control past the lost pages become durable.
func (b *Backend) Send(ctx context.Context) error {
	if err := b.flush(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	return b.Lost()
}

// Sync implements fusefs.Backend: it returns once the pageserver's durable
// LSN covers every mutation this Backend sent at or below w. With
// StandaloneCommit it first advances the commit LSN to w.
func (b *Backend) Sync(ctx context.Context, w pg.LSN) error {
	ctx = context.WithoutCancel(ctx)
	if b.opts.SyncTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.opts.SyncTimeout)
		defer cancel()
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	if b.lost != nil {
		err := b.lost
		b.mu.Unlock()
		return err
	}
	target := min(w, b.maxW)
	if target <= b.durable {
		b.mu.Unlock()
		return nil
	}
	advance := b.opts.StandaloneCommit && target > b.advanced
	b.mu.Unlock()
	if advance {
		if err := b.c.AdvanceCommitLSN(ctx, b.tl, target); err != nil {
			return fmt.Errorf("psbackend: advance commit LSN: %w", err)
		}
		b.mu.Lock()
		b.advanced = max(b.advanced, target)
		b.mu.Unlock()
	}
	for {
		d, err := b.durableLSN(ctx)
		if err != nil {
			// gRPC may report the deadline a moment before ctx does.
			if dl, ok := ctx.Deadline(); ctx.Err() != nil || (ok && !time.Now().Before(dl.Add(-time.Millisecond))) {
				return fmt.Errorf("psbackend: Sync(%s): %w (%v)", w, context.DeadlineExceeded, err)
			}
			return err
		}
		b.mu.Lock()
		lost, durable := b.lost, b.durable
		b.mu.Unlock()
		if lost != nil {
			return lost
		}
		if d >= target && durable >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("psbackend: Sync(%s): %w", w, ctx.Err())
		case <-b.stop:
			// Close: the compute is being torn down (Postgres died). A Sync
			// left waiting would keep its fsync, and so the dying process
			// and the mount, alive for good when the WAL it waits for can
			// no longer reach the safekeepers.
			return fmt.Errorf("psbackend: Sync(%s): %w", w, ErrClosed)
		case <-time.After(b.opts.SyncPoll):
		}
	}
}

func (b *Backend) durableLSN(ctx context.Context) (pg.LSN, error) {
	a, err := b.c.GetDurable(ctx, b.tl)
	if err := b.note(0)(a, err); err != nil {
		return 0, err
	}
	return a.Durable, nil
}

// RefreshDurable asks the pageserver for its durable LSN now, so that
// Durable returns it. Durable alone moves only with writes and syncs, so
// on an idle compute it lags the pageserver by whatever committed since.
func (b *Backend) RefreshDurable(ctx context.Context) error {
	_, err := b.durableLSN(ctx)
	return err
}

// Durable returns the highest durable LSN this Backend has seen.
func (b *Backend) Durable() pg.LSN {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.durable
}

// Lost returns ErrLost (wrapped) once the pageserver restarted while it held
// versions of this Backend that were not durable, else nil.
func (b *Backend) Lost() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lost
}

// LostNotify returns a channel that is closed when Lost becomes non-nil.
func (b *Backend) LostNotify() <-chan struct{} { return b.lostCh }
