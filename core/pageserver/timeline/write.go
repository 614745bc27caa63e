package timeline

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// Change is one new version of a key: the unit of Put and Ingest. For a
// page write in writeback mode, LSN is W (the compute's WAL position) and
// Kind is layer.Image. Data must not be modified during the call; Ingest
// and IngestBuffered copy it (the caller may reuse it afterwards), Put and
// PutPages may keep it (a gated version waits in memory as it is).
type Change struct {
	Key  keyspace.Key
	LSN  pg.LSN
	Kind layer.Kind
	Data []byte
}

// Put stores versions written by the compute (writeback mode), behind the
// durability gate: a version whose LSN (W) is above the commit LSN is kept
// pending (visible to reads, not durable) until the commit LSN reaches it.
// Versions at or below the commit LSN are appended to the log and fsynced
// before Put returns. Put returns the durable LSN after the call.
func (t *Timeline) Put(ctx context.Context, cs []Change) (pg.LSN, error) {
	t.writeMu.Lock()
	err := t.putLocked(cs, true, true)
	t.writeMu.Unlock()
	if err != nil {
		return 0, err
	}
	return t.LSNs().Durable, nil
}

// Ingest stores versions decoded from WAL that the safekeeper quorum already
// holds (no gate) and records that WAL up to lastRecord is ingested. The
// versions are durable when Ingest returns. With a PushdownPolicy, a key
// whose delta chain reaches the policy's N is materialized with the redo
// engine and the image is stored at the same LSN.
func (t *Timeline) Ingest(ctx context.Context, cs []Change, lastRecord pg.LSN) error {
	return t.ingest(ctx, cs, lastRecord, true)
}

// IngestBuffered is Ingest without the fsync: the versions are visible to
// reads at once and durable after the next SyncIngested (or any later
// synced write; the background loop syncs every BackgroundInterval).
// LSNs().Durable stays at the last synced point meanwhile, so the
// safekeepers keep the WAL that is not durable here. WAL ingest uses it
// to pay one fsync per many batches instead of one per batch.
func (t *Timeline) IngestBuffered(ctx context.Context, cs []Change, lastRecord pg.LSN) error {
	return t.ingest(ctx, cs, lastRecord, false)
}

// SyncIngested makes every version ingested so far durable (one fsync of
// the log) and advances LSNs().Durable accordingly. It does nothing when
// no IngestBuffered call is waiting for a sync.
func (t *Timeline) SyncIngested() error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	return t.syncLocked()
}

// syncLocked fsyncs the open log when IngestBuffered left versions
// unsynced. REQUIRES: t.writeMu held.
func (t *Timeline) syncLocked() error {
	if !t.dirty.Load() {
		return nil
	}
	last := t.lastRecord.Load()
	t.mu.RLock()
	open, closed := t.open, t.closed
	t.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	// Frozen layers were synced when frozen; the open one holds the rest.
	if err := open.Sync(); err != nil {
		return err
	}
	t.markSynced(last)
	return nil
}

// markSynced records that every version at or below last is durable.
// REQUIRES: t.writeMu held (no write can slip in between).
func (t *Timeline) markSynced(last uint64) {
	for {
		o := t.synced.Load()
		if last <= o || t.synced.CompareAndSwap(o, last) {
			break
		}
	}
	t.dirty.Store(false)
}

func (t *Timeline) ingest(ctx context.Context, cs []Change, lastRecord pg.LSN, sync bool) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	// Until lastRecord covers cs, a read at the "latest" LSN may not see
	// the key's newest version: no read fills the page cache meanwhile.
	t.writing.Add(1)
	t.epoch.Add(1)
	defer func() {
		t.epoch.Add(1)
		t.writing.Add(-1)
	}()
	if !sync {
		// Set before lastRecord moves, so LSNs never reports these
		// versions as durable.
		t.dirty.Store(true)
	}
	// The deltas and the images below land in one in-memory layer: no
	// freeze between them (storeLocked does not freeze, and every other
	// freeze holds writeMu). A batch split across two layers left the
	// first, once flushed, holding versions above the consistent LSN of
	// the manifest (the second's floor), and a timeline restarted from the
	// object store ingested those records again.
	if err := t.storeLocked(cs, false, sync); err != nil {
		return err
	}
	if err := t.releaseLocked(t.d.Commit.CommitLSN()); err != nil {
		return err
	}
	// The image policy's images (pushdown, hot, plugins), at the deltas'
	// LSNs.
	imgs, err := t.DueImages(ctx, cs)
	if err != nil {
		return err
	}
	if err := t.storeLocked(imgs, false, sync); err != nil {
		return err
	}
	t.advanceLastRecord(lastRecord)
	if sync {
		// storeLocked synced what it wrote; earlier buffered versions need
		// their own sync (an empty cs wrote nothing).
		if err := t.syncLocked(); err != nil {
			return err
		}
		t.markSynced(t.lastRecord.Load())
	}
	return t.afterWriteLocked()
}

// putLocked stores cs (storeLocked) and then freezes the open layer if it
// is due. REQUIRES: t.writeMu held.
func (t *Timeline) putLocked(cs []Change, gated, sync bool) error {
	if err := t.storeLocked(cs, gated, sync); err != nil {
		return err
	}
	return t.afterWriteLocked()
}

// afterWriteLocked ends a write: it freezes the open layer when it is due,
// and a writer that outruns flushing flushes itself. Only between writes:
// one write's versions stay in one in-memory layer. REQUIRES: t.writeMu.
func (t *Timeline) afterWriteLocked() error {
	t.maybeFreeze()
	// Backpressure: a writer that outruns flushing flushes itself.
	t.mu.RLock()
	behind := len(t.frozen) > maxFrozen
	t.mu.RUnlock()
	if behind {
		return t.flushFrozen(context.Background())
	}
	return nil
}

// storeLocked assigns Seqs and stores cs; sync fsyncs the log before it
// returns. Readers are not blocked while the versions are appended to the
// log: t.mu is held only to assign Seqs and take the open layer.
// REQUIRES: t.writeMu held.
func (t *Timeline) storeLocked(cs []Change, gated, sync bool) error {
	if len(cs) == 0 {
		return nil
	}
	commit := t.d.Commit.CommitLSN()
	// Page cache guard: no reader fills the cache while the write is half
	// visible, and the epoch moves before and after it (pageCache.putIf).
	t.writing.Add(1)
	t.epoch.Add(1)
	visible := false
	published := func() {
		if !visible {
			visible = true
			t.cache.invalidateBatch(cs)
			t.epoch.Add(1)
			t.writing.Add(-1)
		}
	}
	defer published()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	var maxLSN pg.LSN
	direct := make([]layer.Version, 0, len(cs))
	raised := 0
	for _, c := range cs {
		lsn := c.LSN
		if gated && lsn < t.imageFloor {
			// An image layer at imageFloor would hide this version from
			// every read at or above it. Stored at the image's LSN, its
			// larger Seq ranks it above the image (CreateImageLayer). Its
			// W is below that LSN, which is at most the durable LSN: the
			// WAL behind it is durable either way.
			lsn = t.imageFloor
			raised++
		}
		v := layer.Version{Key: c.Key, LSN: lsn, Seq: t.seq.Add(1), Kind: c.Kind, Data: c.Data}
		maxLSN = max(maxLSN, lsn)
		if gated && lsn > commit {
			if len(t.pending) == 0 || lsn < t.pendingMin {
				t.pendingMin = lsn
			}
			t.pending = append(t.pending, v)
			t.pendingKeys[c.Key] = insertVersion(t.pendingKeys[c.Key], v)
			continue
		}
		direct = append(direct, v)
	}
	open := t.open
	floor := t.imageFloor
	lo := minLSN(direct)
	if !gated {
		// WAL ingest's versions lie above the last record LSN, but for
		// images made after their batch at its end (walingest's SLRU
		// pages): made of versions stored already, they need no WAL read
		// again, and the last record LSN, a record's end, stays their
		// floor (lo-1 lies inside that record).
		lo = max(lo, pg.LSN(t.lastRecord.Load())+1)
	}
	if len(direct) > 0 {
		t.noteFloorLocked(open, pg.LSN(t.lastRecord.Load()), lo)
	}
	t.mu.Unlock()
	if raised > 0 {
		t.d.Metrics.raised(raised)
		t.log.Debug().Int("versions", raised).Stringer("image_lsn", floor).Msg("writes below the newest image layer raised to its LSN")
	}
	wrote := len(direct) > 0
	for attempt := 0; wrote; attempt++ {
		err := open.PutBatch(direct)
		if err == nil {
			break
		}
		if errors.Is(err, layer.ErrClosed) {
			return ErrClosed
		}
		if !errors.Is(err, layer.ErrFrozen) || attempt >= 8 {
			return err
		}
		// The background loop froze the layer meanwhile: use the new one.
		t.mu.Lock()
		open = t.open
		closed := t.closed
		if !closed {
			t.noteFloorLocked(open, pg.LSN(t.lastRecord.Load()), lo)
		}
		t.mu.Unlock()
		if closed {
			return ErrClosed
		}
	}
	if gated {
		t.advanceLastRecord(maxLSN)
	}
	// The versions are in place and lastRecord covers them: readers may
	// fill the cache again.
	published()
	if wrote && sync {
		if err := open.Sync(); err != nil {
			return err
		}
	}
	if gated {
		if err := t.releaseLocked(commit); err != nil {
			return err
		}
	}
	return nil
}

// maxFrozen bounds the frozen in-memory layers waiting for a flush.
const maxFrozen = 4

func insertVersion(vs []layer.Version, v layer.Version) []layer.Version {
	i := len(vs)
	for i > 0 && !v.Newer(&vs[i-1]) {
		i--
	}
	vs = append(vs, layer.Version{})
	copy(vs[i+1:], vs[i:])
	vs[i] = v
	return vs
}

// CommitAdvanced makes pending versions at or below the current commit LSN
// durable. The background loop calls it periodically; a CommitLSNSource
// owner may call it when the commit LSN moves, to cut the latency.
func (t *Timeline) CommitAdvanced() error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	return t.releaseLocked(t.d.Commit.CommitLSN())
}

// releaseLocked moves pending versions with LSN <= commit into the log.
// REQUIRES: t.writeMu held.
func (t *Timeline) releaseLocked(commit pg.LSN) error {
	t.mu.Lock()
	// Most calls come from a write while the commit LSN stands still:
	// nothing to release, and no scan of every pending version.
	if len(t.pending) == 0 || t.closed || t.pendingMin > commit {
		t.mu.Unlock()
		return nil
	}
	var keep, rel []layer.Version
	for _, v := range t.pending {
		if v.LSN <= commit {
			rel = append(rel, v)
		} else {
			keep = append(keep, v)
		}
	}
	if len(rel) == 0 {
		t.mu.Unlock()
		return nil
	}
	// Versions stay visible in pendingKeys until they are in the log.
	open := t.open
	t.noteFloorLocked(open, pg.LSN(t.lastRecord.Load()), minLSN(rel))
	if err := open.PutBatch(rel); err != nil {
		t.mu.Unlock()
		return err
	}
	t.mu.Unlock()
	if err := open.Sync(); err != nil {
		return err
	}
	t.mu.Lock()
	t.pending = keep
	t.pendingMin = minLSN(keep)
	for _, v := range rel {
		vs := t.pendingKeys[v.Key]
		for i := range vs {
			if vs[i].Seq == v.Seq {
				vs = append(vs[:i], vs[i+1:]...)
				break
			}
		}
		if len(vs) == 0 {
			delete(t.pendingKeys, v.Key)
		} else {
			t.pendingKeys[v.Key] = vs
		}
	}
	t.mu.Unlock()
	return nil
}

// minLSN returns the lowest LSN of vs, 0 when vs is empty.
func minLSN(vs []layer.Version) pg.LSN {
	var m pg.LSN
	for i, v := range vs {
		if i == 0 || v.LSN < m {
			m = v.LSN
		}
	}
	return m
}

func encodeSize(n uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, n)
	return b
}

// PageWrite is a page image written by the compute at WAL position W.
type PageWrite struct {
	Page pg.PageKey
	W    pg.LSN
	// Data is pg.BlockSize bytes, or empty for a page of zeros.
	Data []byte
}

// PutPages stores page images from the compute (gated, see Put) and extends
// the relations' sizes when a page lies past the end.
//
// A page whose W lies below the LSN of the newest image layer (made at
// most at the durable LSN, so at most at the highest W received) is
// stored at that LSN instead, above the image (putLocked): a write that
// arrives late, such as one racing with another write of the compute that
// let the durable LSN pass its W, is never hidden by an image made
// meanwhile. Reads at LSNs between its W and the image's do not see it.
// One compute writes a timeline, and psbackend tags every page of one send
// with at least the highest W it sent before, so this is rare
// (strata_pageserver_writes_raised_total).
//
// sizes are stored in the same write, after the pages (one log write for
// both): a fork's size at its W, which creates the fork if needed and, at
// the W of a page's extension, replaces that extension's size; or the
// fork's drop at its W.
//
// A page of zeros (empty Data, or 8 KiB of zeros) is stored as a
// tombstone: Postgres extends a relation by writing a zero page, then
// writes the page's content when it leaves shared_buffers, so every new
// page came twice. A tombstone holds no data in the log, the layers or
// the object store, hides the key's older versions as the zero page did,
// and reads as zeros (GetPage: a block within the fork's size without a
// version is a page of zeros; materialize: a WAL record applied on top
// of it starts from zeros).
func (t *Timeline) PutPages(ctx context.Context, ws []PageWrite, sizes ...SizeWrite) (pg.LSN, error) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	cs := make([]Change, 0, len(ws)+len(sizes))
	ext := map[pg.RelTag]uint32{}
	zeros := 0
	for _, w := range ws {
		switch {
		case len(w.Data) == 0 || pg.IsZeroPage(w.Data):
			cs = append(cs, Change{Key: keyspace.RelBlock(w.Page), LSN: w.W, Kind: layer.Tombstone})
			zeros++
		case len(w.Data) == pg.BlockSize:
			cs = append(cs, Change{Key: keyspace.RelBlock(w.Page), LSN: w.W, Kind: layer.Image, Data: w.Data})
		default:
			return 0, fmt.Errorf("timeline: page %s has %d bytes", w.Page, len(w.Data))
		}
		rel := w.Page.Tag()
		n, ok := ext[rel]
		if !ok {
			var err error
			n, _, err = t.Nblocks(ctx, rel, LatestLSN)
			if err != nil {
				return 0, err
			}
		}
		if w.Page.Block >= n {
			n = w.Page.Block + 1
			cs = append(cs, Change{Key: keyspace.RelSize(rel), LSN: w.W, Kind: layer.Image, Data: encodeSize(n)})
		}
		ext[rel] = n
	}
	for _, s := range sizes {
		if s.Drop {
			cs = append(cs, Change{Key: keyspace.RelSize(s.Rel), LSN: s.W, Kind: layer.Tombstone})
			continue
		}
		cs = append(cs, Change{Key: keyspace.RelSize(s.Rel), LSN: s.W, Kind: layer.Image, Data: encodeSize(s.Nblocks)})
	}
	if err := t.putLocked(cs, true, true); err != nil {
		return 0, err
	}
	t.d.Metrics.zeroPagesPut(zeros)
	return t.LSNs().Durable, nil
}

// SizeWrite is a relation fork's size written at the compute's WAL
// position W (PutPages).
type SizeWrite struct {
	Rel     pg.RelTag
	Nblocks uint32
	W       pg.LSN
	// Drop drops the fork at W instead (Nblocks is ignored).
	Drop bool
}

// SetRelSize creates a relation fork (if needed) or truncates/extends it
// to n blocks at W (gated).
func (t *Timeline) SetRelSize(ctx context.Context, rel pg.RelTag, n uint32, w pg.LSN) error {
	_, err := t.Put(ctx, []Change{{Key: keyspace.RelSize(rel), LSN: w, Kind: layer.Image, Data: encodeSize(n)}})
	return err
}

// DropRel drops a relation fork at W (gated).
func (t *Timeline) DropRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error {
	_, err := t.Put(ctx, []Change{{Key: keyspace.RelSize(rel), LSN: w, Kind: layer.Tombstone}})
	return err
}

// Non-relation files. A file's meta key holds size[8] then the path; its
// blocks are pg.BlockSize bytes each. Blocks past the size read as zeros.

func encodeMeta(path string, size int64) []byte {
	b := make([]byte, 8+len(path))
	binary.BigEndian.PutUint64(b, uint64(size))
	copy(b[8:], path)
	return b
}

func decodeMeta(b []byte) (string, int64, error) {
	if len(b) < 8 {
		return "", 0, fmt.Errorf("timeline: file meta of %d bytes", len(b))
	}
	return string(b[8:]), int64(binary.BigEndian.Uint64(b)), nil
}

// StatFile returns a file's size and whether it exists at lsn.
func (t *Timeline) StatFile(ctx context.Context, path string, lsn pg.LSN) (int64, bool, error) {
	d, err := t.Get(ctx, keyspace.FileMeta(path), lsn)
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	_, size, err := decodeMeta(d)
	return size, err == nil, err
}

func (t *Timeline) fileBlock(ctx context.Context, path string, blk uint32, lsn pg.LSN) ([]byte, error) {
	d, err := t.Get(ctx, keyspace.FileBlock(path, blk), lsn)
	if errors.Is(err, ErrNotFound) {
		return make([]byte, pg.BlockSize), nil
	}
	return d, err
}

// ReadFile returns the content of a non-relation file at lsn.
func (t *Timeline) ReadFile(ctx context.Context, path string, lsn pg.LSN) ([]byte, error) {
	size, ok, err := t.StatFile(ctx, path, lsn)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: file %s", ErrNotFound, path)
	}
	out := make([]byte, 0, size)
	for blk := uint32(0); int64(len(out)) < size; blk++ {
		b, err := t.fileBlock(ctx, path, blk, lsn)
		if err != nil {
			return nil, err
		}
		out = append(out, b[:min(int64(len(b)), size-int64(len(out)))]...)
	}
	return out, nil
}

// WriteFile writes data at off into a non-relation file at W (gated),
// creating it if needed. Bytes between the old end and off read as zeros.
func (t *Timeline) WriteFile(ctx context.Context, path string, off int64, data []byte, w pg.LSN) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	size, ok, err := t.StatFile(ctx, path, LatestLSN)
	if err != nil {
		return err
	}
	if !ok {
		size = 0
	}
	var cs []Change
	end := off + int64(len(data))
	for pos := off; pos < end; {
		blk := uint32(pos / pg.BlockSize)
		bo := pos % pg.BlockSize
		n := min(int64(pg.BlockSize)-bo, end-pos)
		var page []byte
		if bo == 0 && n == pg.BlockSize {
			page = data[pos-off : pos-off+n]
		} else {
			page = make([]byte, pg.BlockSize)
			if int64(blk)*pg.BlockSize < size {
				old, err := t.fileBlock(ctx, path, blk, LatestLSN)
				if err != nil {
					return err
				}
				copy(page, old)
				// Bytes past the old end are zeros, whatever a stale block holds.
				if keep := size - int64(blk)*pg.BlockSize; keep < pg.BlockSize {
					clear(page[keep:])
				}
			}
			copy(page[bo:], data[pos-off:pos-off+n])
		}
		cs = append(cs, Change{Key: keyspace.FileBlock(path, blk), LSN: w, Kind: layer.Image, Data: page})
		pos += n
	}
	// Whole blocks skipped between the old end and off must read as zeros.
	for blk := (size + pg.BlockSize - 1) / pg.BlockSize; blk*pg.BlockSize+pg.BlockSize <= off; blk++ {
		cs = append(cs, Change{Key: keyspace.FileBlock(path, uint32(blk)), LSN: w, Kind: layer.Tombstone})
	}
	if !ok || end > size {
		cs = append(cs, Change{Key: keyspace.FileMeta(path), LSN: w, Kind: layer.Image, Data: encodeMeta(path, max(size, end))})
	}
	return t.putLocked(cs, true, true)
}

// TruncateFile sets a file's size at W (gated), creating it if needed.
func (t *Timeline) TruncateFile(ctx context.Context, path string, size int64, w pg.LSN) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	old, _, err := t.StatFile(ctx, path, LatestLSN)
	if err != nil {
		return err
	}
	cs := []Change{{Key: keyspace.FileMeta(path), LSN: w, Kind: layer.Image, Data: encodeMeta(path, size)}}
	if tail := size % pg.BlockSize; tail != 0 && size < old {
		// Zero the cut part of the last block so an extension reads zeros.
		blk := uint32(size / pg.BlockSize)
		b, err := t.fileBlock(ctx, path, blk, LatestLSN)
		if err != nil {
			return err
		}
		b = bytes.Clone(b)
		clear(b[tail:])
		cs = append(cs, Change{Key: keyspace.FileBlock(path, blk), LSN: w, Kind: layer.Image, Data: b})
	}
	cs = append(cs, t.cutBlocks(path, size, old, w)...)
	return t.putLocked(cs, true, true)
}

// ReplaceFile makes data the whole content of a non-relation file at W
// (gated), creating it if needed, in one step: its blocks, the tombstones
// of the old blocks past the new end and the new size are stored
// together. A rename over an existing file (write-temp-then-rename) done
// as a write and a truncate could be torn between the two: the new
// content with the old tail.
func (t *Timeline) ReplaceFile(ctx context.Context, path string, data []byte, w pg.LSN) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	old, _, err := t.StatFile(ctx, path, LatestLSN)
	if err != nil {
		return err
	}
	var cs []Change
	for blk := int64(0); blk*pg.BlockSize < int64(len(data)); blk++ {
		page := data[blk*pg.BlockSize : min(int64(len(data)), (blk+1)*pg.BlockSize)]
		if len(page) < pg.BlockSize {
			// The last block: zeros past the end, so an extension reads zeros.
			page = append(page[:len(page):len(page)], make([]byte, pg.BlockSize-len(page))...)
		}
		cs = append(cs, Change{Key: keyspace.FileBlock(path, uint32(blk)), LSN: w, Kind: layer.Image, Data: page})
	}
	cs = append(cs, t.cutBlocks(path, int64(len(data)), old, w)...)
	cs = append(cs, Change{Key: keyspace.FileMeta(path), LSN: w, Kind: layer.Image, Data: encodeMeta(path, int64(len(data)))})
	return t.putLocked(cs, true, true)
}

// cutBlocks returns tombstones for the blocks wholly past size (up to the
// old size), so that a later extension reads zeros there.
func (t *Timeline) cutBlocks(path string, size, old int64, w pg.LSN) []Change {
	var cs []Change
	for blk := (size + pg.BlockSize - 1) / pg.BlockSize; blk*pg.BlockSize < old; blk++ {
		cs = append(cs, Change{Key: keyspace.FileBlock(path, uint32(blk)), LSN: w, Kind: layer.Tombstone})
	}
	return cs
}

// UnlinkFile removes a file at W (gated).
func (t *Timeline) UnlinkFile(ctx context.Context, path string, w pg.LSN) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	old, _, err := t.StatFile(ctx, path, LatestLSN)
	if err != nil {
		return err
	}
	cs := []Change{{Key: keyspace.FileMeta(path), LSN: w, Kind: layer.Tombstone}}
	cs = append(cs, t.cutBlocks(path, 0, old, w)...)
	return t.putLocked(cs, true, true)
}

// FileInfo names a non-relation file.
type FileInfo struct {
	Path string
	Size int64
}

// ListFiles returns the non-relation files that exist at lsn, by key order.
func (t *Timeline) ListFiles(ctx context.Context, lsn pg.LSN) ([]FileInfo, error) {
	var out []FileInfo
	err := t.ScanKeys(ctx, keyspace.FilesRange, lsn, func(k keyspace.Key) error {
		if !k.IsMeta() {
			return nil
		}
		d, err := t.Get(ctx, k, lsn)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		p, size, err := decodeMeta(d)
		if err == nil {
			out = append(out, FileInfo{Path: p, Size: size})
		}
		return err
	})
	return out, err
}

// RelSizeValue encodes a relation size for a Change on keyspace.RelSize.
func RelSizeValue(n uint32) []byte { return encodeSize(n) }

// FileMetaValue encodes a file's metadata for a Change on keyspace.FileMeta.
func FileMetaValue(path string, size int64) []byte { return encodeMeta(path, size) }
