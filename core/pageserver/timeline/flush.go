package timeline

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/internal/brief"
	"github.com/stratadb/strata/internal/pacedwrite"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// maybeFreeze freezes the open layer when it is too big, spans too many
// LSN bytes or is too old, and wakes the background loop. A timeline with
// an object store and no layer at all freezes its first data at once: a
// new timeline's first writes (initdb's output, which the compute stores
// in one gated batch) then reach the object store within a background
// round, not a checkpoint timeout later. Until then a pageserver that lost
// its disk would find nothing of the timeline, and the compute could not
// start; from an older copy it can (Postgres replays the WAL since that
// copy's checkpoint). REQUIRES: t.writeMu held, so that a freeze never
// splits a write (afterWriteLocked).
func (t *Timeline) maybeFreeze() {
	t.mu.Lock()
	b, _, lo, hi, _, created := t.open.Stats()
	first := t.d.Remote != nil && len(t.layers.All()) == 0 && len(t.frozen) == 0
	need := b >= t.opts.CheckpointDistance || (hi >= lo && uint64(hi-lo) >= t.opts.CheckpointLSNDistance) ||
		(b > 0 && (first || t.d.Now().Sub(created) >= t.opts.CheckpointTimeout))
	if need {
		if err := t.freezeLocked(); err != nil {
			t.log.Error().Err(err).Msg("freeze")
		}
	}
	t.mu.Unlock()
	if need {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// freezeLocked freezes the open layer and starts a new one. REQUIRES: t.mu.
func (t *Timeline) freezeLocked() error {
	if t.open.Empty() {
		return nil
	}
	if err := t.open.Freeze(); err != nil {
		return err
	}
	t.frozen = append(t.frozen, t.open)
	return t.newOpenLocked()
}

// Flush freezes the open layer and writes every frozen layer out as L0
// delta layer files, then saves the local manifest. Pending (gated)
// versions are not flushed.
func (t *Timeline) Flush(ctx context.Context) error {
	t.writeMu.Lock() // between writes (afterWriteLocked)
	t.mu.Lock()
	err := t.freezeLocked()
	t.mu.Unlock()
	t.writeMu.Unlock()
	if err != nil {
		return err
	}
	return t.flushFrozen(ctx)
}

func (t *Timeline) flushFrozen(ctx context.Context) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	// Flush the layers frozen so far; later ones wait for the next round so
	// that compaction, GC and upload are not starved by a busy writer.
	t.mu.RLock()
	n := len(t.frozen)
	t.mu.RUnlock()
	for ; n > 0; n-- {
		t.mu.RLock()
		if len(t.frozen) == 0 {
			t.mu.RUnlock()
			return nil
		}
		fz := t.frozen[0]
		t.mu.RUnlock()
		descs, err := layer.WriteFiles(t.dir, layer.DeltaLayer, fz.Sorted(), t.opts.LayerTargetSize, 0, 0)
		if err != nil {
			return fmt.Errorf("timeline: flush: %w", err)
		}
		var hs []*handle
		var bytes int64
		for _, d := range descs {
			hs = append(hs, t.newHandle(d))
			bytes += d.Size
		}
		_, _, _, hi, _, _ := fz.Stats()
		t.mu.Lock()
		t.layers = t.layers.Replace(nil, hs...)
		t.frozen = t.frozen[1:]
		delete(t.memFloor, fz)
		t.lsnTimes = append(t.lsnTimes, lsnTime{t: t.d.Now(), lsn: hi})
		if len(t.lsnTimes) > 4096 {
			t.lsnTimes = t.lsnTimes[len(t.lsnTimes)-2048:]
		}
		t.mu.Unlock()
		if err := t.saveLocal(); err != nil {
			return err
		}
		if err := fz.Remove(); err != nil {
			return err
		}
		if t.d.Metrics != nil {
			t.d.Metrics.flushedBytes.Add(float64(bytes))
		}
		t.log.Debug().Int("files", len(descs)).Int64("bytes", bytes).Msg("flushed in-memory layer")
	}
	return nil
}

// manifestLocked builds the manifest of the current layers. REQUIRES: t.mu.
func (t *Timeline) manifestLocked() *manifest.Manifest {
	m := &manifest.Manifest{
		Version:     1,
		Timeline:    t.id.String(),
		AncestorLSN: t.d.AncestorLSN,
		Generation:  t.gen,
		GCCutoff:    t.gcCutoff,
		MaxSeq:      t.seq.Load(),
		WrittenAt:   t.d.Now().UTC(),
	}
	if t.d.Ancestor != nil {
		m.Ancestor = t.d.Ancestor.id.String()
	}
	// Everything below the oldest version not yet in layer files is in
	// them; the LSN is also where a restarted timeline resumes WAL ingest,
	// so it is the floor of the in-memory layers (noteFloorLocked), not
	// just below their oldest version.
	dcl := pg.LSN(t.lastRecord.Load())
	for _, mem := range append([]*layer.InMem{t.open}, t.frozen...) {
		_, _, lo, hi, _, _ := mem.Stats()
		if hi < lo || lo == 0 {
			continue
		}
		f, ok := t.memFloor[mem]
		if !ok {
			f = lo - 1 // not reached: every write notes its floor first
		}
		dcl = min(dcl, f)
	}
	if len(t.pending) > 0 && t.pendingMin > 0 && t.pendingMin-1 < dcl {
		dcl = t.pendingMin - 1
	}
	m.DiskConsistentLSN = dcl
	for _, h := range t.layers.All() {
		d := h.desc
		h.mu.RLock()
		d.Uploaded = h.uploaded
		h.mu.RUnlock()
		m.Layers = append(m.Layers, d)
	}
	sort.Slice(m.Layers, func(i, j int) bool { return m.Layers[i].Name < m.Layers[j].Name })
	return m
}

// saveLocal writes the local manifest, unless its content is the same as
// the last one written. GC saves after every round (a raised cutoff must
// survive a restart); on a quiet timeline nothing changed, and each round
// encoded and fsynced the manifest for nothing. Under writes the content
// (the disk consistent LSN, the sequence) changes every round.
func (t *Timeline) saveLocal() error {
	t.saveMu.Lock()
	defer t.saveMu.Unlock()
	t.mu.RLock()
	m := t.manifestLocked()
	t.mu.RUnlock()
	if m.SameContent(t.lastSaved) {
		return nil
	}
	if err := manifest.SaveLocal(filepath.Join(t.dir, manifestFile), m); err != nil {
		return err
	}
	t.lastSaved = m
	if t.d.Metrics != nil {
		t.d.Metrics.manifestSaves.Inc()
	}
	return nil
}

// Publish flushes the in-memory layers to layer files and uploads them
// with the manifest: afterwards the object store alone holds every
// version the timeline had made durable when Publish was called.
func (t *Timeline) Publish(ctx context.Context) error {
	if err := t.Flush(ctx); err != nil {
		return err
	}
	return t.Upload(ctx)
}

// Upload uploads every layer file not yet in the object store (in
// parallel), then publishes the next manifest generation, then deletes the
// objects of layers that the new manifest no longer names. It returns
// manifest.ErrFenced when another pageserver published first. A failure
// is kept for UploadTrouble until an upload succeeds.
func (t *Timeline) Upload(ctx context.Context) error {
	err := t.upload(ctx)
	t.uploadMu.Lock()
	t.uploadTrouble.Note(t.d.Now(), err)
	t.uploadMu.Unlock()
	return err
}

// UploadTrouble returns the current run of failed uploads (the zero Run
// when the last one succeeded, or none was tried).
func (t *Timeline) UploadTrouble() trouble.Run {
	t.uploadMu.Lock()
	defer t.uploadMu.Unlock()
	return t.uploadTrouble
}

func (t *Timeline) upload(ctx context.Context) error {
	if t.d.Remote == nil {
		return nil
	}
	if err := t.publishMu.Lock(ctx); err != nil {
		return fmt.Errorf("timeline %s: waiting for the upload under way: %w", t.id, err)
	}
	defer t.publishMu.Unlock()
	t.mu.RLock()
	if t.fenced {
		t.mu.RUnlock()
		return manifest.ErrFenced
	}
	t.mu.RUnlock()
	if !t.remoteChecked.Load() {
		if err := t.checkRemote(ctx); err != nil {
			t.uploadFailed()
			return err
		}
	}
	t.mu.RLock()
	m := t.manifestLocked()
	removed := append([]string(nil), t.removed...)
	hs := append([]*handle(nil), t.layers.All()...)
	t.mu.RUnlock()
	var up []layer.Desc
	var bytes int64
	for i := range m.Layers {
		if !m.Layers[i].Uploaded { // as of manifestLocked
			up = append(up, m.Layers[i])
			bytes += m.Layers[i].Size
			m.Layers[i].Uploaded = true
		}
	}
	if len(up) == 0 && len(removed) == 0 && m.DiskConsistentLSN == pg.LSN(t.remoteLSN.Load()) && t.gen > 0 {
		return nil
	}
	byName := map[string]*handle{}
	for _, h := range hs {
		byName[h.desc.Name] = h
	}
	// A layer in the object store is marked at once, so a retry after a
	// partial failure uploads only the rest.
	markUploaded := func(name string) {
		if h := byName[name]; h != nil {
			h.mu.Lock()
			h.uploaded = true
			h.mu.Unlock()
		}
	}
	if err := t.d.Remote.UploadLayers(ctx, t.id, t.dir, up, markUploaded); err != nil {
		t.uploadFailed()
		return err
	}
	m.Generation = t.gen + 1
	if err := t.d.Remote.Publish(ctx, t.id, m); err != nil {
		if errors.Is(err, manifest.ErrFenced) {
			t.mu.Lock()
			t.fenced = true
			t.mu.Unlock()
			t.log.Error().Err(err).Msg("fenced: another pageserver owns this timeline; uploads stop")
		}
		t.uploadFailed()
		return err
	}
	if t.d.Metrics != nil {
		t.d.Metrics.uploadedBytes.Add(float64(bytes))
	}
	published := map[string]bool{}
	for _, d := range m.Layers {
		published[d.Name] = true
	}
	for _, h := range hs {
		if published[h.desc.Name] {
			h.mu.Lock()
			h.uploaded = true
			h.mu.Unlock()
		}
	}
	t.mu.Lock()
	t.gen = m.Generation
	t.removed = t.removed[len(removed):]
	t.mu.Unlock()
	t.remoteLSN.Store(uint64(m.DiskConsistentLSN))
	if err := t.saveLocal(); err != nil {
		return err
	}
	// Invariant 5: the objects go only now that a durable newer manifest
	// does not name them. Keep the previous manifest generation.
	if err := t.d.Remote.DeleteLayers(ctx, t.id, removed); err != nil {
		t.log.Warn().Err(err).Msg("deleting dropped layers (left as garbage)")
	}
	if m.Generation > 2 {
		if err := t.d.Remote.PruneManifests(ctx, t.id, m.Generation-1); err != nil {
			t.log.Warn().Err(err).Msg("pruning old manifests")
		}
	}
	return nil
}

// checkRemote runs before the first upload of a timeline opened from its
// local manifest. That manifest's "uploaded" marks and generation are about
// the object store this pageserver last uploaded to; the configured store
// may not be that one any more (another bucket or folder, a store emptied,
// or restored from an older copy), and a manifest published on wrong marks
// names layers the store does not hold: a pageserver started from the
// store alone would then miss them. So the marks are checked against the
// layer objects the store lists: a layer it lacks (or holds at another
// size) is uploaded again from its local copy, and one that is neither
// local nor in the store is an error that stops uploads (nothing else can
// bring it back). The store's newest manifest generation, when newer than
// the local one, is this pageserver's own when it names no layer the
// timeline does not know (a crash between publishing a manifest and saving
// it locally); it is adopted, so the next generation does not collide
// with it. A newer generation naming unknown layers is another
// pageserver's: the timeline is fenced. REQUIRES: t.publishMu held (or
// the open, before anything else runs).
func (t *Timeline) checkRemote(ctx context.Context) error {
	rm, err := t.d.Remote.Latest(ctx, t.id)
	if errors.Is(err, manifest.ErrNoManifest) {
		rm, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("timeline %s: reading the object store's newest manifest: %w", t.id, err)
	}
	objs, err := t.d.Remote.LayerSizes(ctx, t.id)
	if err != nil {
		return fmt.Errorf("timeline %s: listing the object store's layers: %w", t.id, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if rm != nil && rm.Generation > t.gen {
		known := map[string]bool{}
		for _, h := range t.layers.All() {
			known[h.desc.Name] = true
		}
		for _, n := range t.removed {
			known[n] = true
		}
		for _, d := range rm.Layers {
			if !known[d.Name] {
				t.fenced = true
				t.log.Error().Uint64("generation", rm.Generation).Uint64("local_generation", t.gen).Str("unknown_layer", d.Name).
					Msg("fenced: the object store holds a newer manifest of this timeline, published by another pageserver (or this folder is an older copy); this pageserver neither uploads nor, once it finds this at open, serves it")
				return fmt.Errorf("%w: the object store holds generation %d of %s (this pageserver's is %d), naming layer %s that this pageserver does not have (if this pageserver's folder %s is an older copy, move it away: the pageserver then starts from the object store)",
					manifest.ErrFenced, rm.Generation, t.id, t.gen, d.Name, t.dir)
			}
		}
		t.log.Info().Uint64("generation", rm.Generation).Uint64("local_generation", t.gen).
			Msg("the object store holds a newer manifest of this timeline naming only its own layers (published before a crash): adopting its generation")
		t.gen = rm.Generation
	}
	var again, lost []string
	for _, h := range t.layers.All() {
		h.mu.Lock()
		size, ok := objs[h.desc.Name]
		switch {
		case ok && size == h.desc.Size:
			h.uploaded = true
		case h.uploaded && !h.gone && h.isLocal():
			h.uploaded = false
			again = append(again, h.desc.Name)
		case h.uploaded && !h.gone:
			lost = append(lost, h.desc.Name)
		}
		h.mu.Unlock()
	}
	if len(lost) > 0 {
		return fmt.Errorf("timeline %s: %d layer files (%s) are neither on local disk nor in the object store: was objectstore changed in the config? Point it back at the store this pageserver uploaded to, or copy that store's objects into the new one",
			t.id, len(lost), brief.Join(lost, 3))
	}
	if len(again) > 0 {
		t.log.Warn().Int("layers", len(again)).Str("first", again[0]).
			Msg("layers this pageserver uploaded are missing from the object store (was objectstore changed in the config, or the store emptied?): uploading them again")
	} else if rm != nil {
		t.remoteLSN.Store(uint64(rm.DiskConsistentLSN)) // what the store holds
	}
	t.remoteChecked.Store(true)
	return nil
}

func (t *Timeline) uploadFailed() {
	if t.d.Metrics != nil {
		t.d.Metrics.uploadErrors.Inc()
	}
}

// replaceLayers swaps layers in the map, saves the local manifest, and
// deletes the dropped files locally (and, after the next upload, remotely).
// REQUIRES: t.flushMu held, and t.publishMu too when drop is not empty.
func (t *Timeline) replaceLayers(drop []*handle, add []*handle) error {
	gone := map[*handle]bool{}
	for _, h := range drop {
		gone[h] = true
	}
	t.mu.Lock()
	t.layers = t.layers.Replace(func(h *handle) bool { return gone[h] }, add...)
	for _, h := range drop {
		h.mu.RLock()
		up := h.uploaded
		h.mu.RUnlock()
		if up {
			t.removed = append(t.removed, h.desc.Name)
		}
	}
	t.mu.Unlock()
	if err := t.saveLocal(); err != nil {
		return err
	}
	for _, h := range drop {
		h.remove()
	}
	t.d.Metrics.observeLayers(t)
	return nil
}

// Compact merges the L0 delta layers into L1 delta layers split by key
// range, when there are at least CompactionThreshold of them (force: at
// least 2). Versions hidden below a base version at or below the GC cutoff
// are dropped on the way.
func (t *Timeline) Compact(ctx context.Context, force bool) error {
	if err := t.publishMu.Lock(ctx); err != nil {
		return err
	}
	defer t.publishMu.Unlock()
	return t.compact(ctx, force)
}

// compact is Compact. REQUIRES: t.publishMu held.
func (t *Timeline) compact(ctx context.Context, force bool) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.RLock()
	var l0, images []*handle
	for _, h := range t.layers.All() {
		if h.desc.IsDelta() && h.desc.Level == 0 {
			l0 = append(l0, h)
		}
		if !h.desc.IsDelta() {
			images = append(images, h)
		}
	}
	cutoff := t.gcCutoff
	t.mu.RUnlock()
	if len(l0) < 2 || (!force && len(l0) < t.opts.CompactionThreshold) {
		return nil
	}
	// Output files do not cross the ranges of the newest image files: an
	// L1 file that held keys of two ranges would span the ranges between
	// them, and GC could not drop it until those, unchanged, were
	// rewritten too (image passes rewrite the changed ranges only).
	var bounds []keyspace.Key
	if front := imageFrontier(images); front != nil {
		for _, f := range front[1:] {
			bounds = append(bounds, f.desc.Keys.Start)
		}
	}
	rangeOf := func(k keyspace.Key) int {
		return sort.Search(len(bounds), func(i int) bool { return k.Less(bounds[i]) })
	}
	lsnStart, lsnEnd := ^pg.LSN(0), pg.LSN(0)
	var rs []*layer.Reader
	released := false
	releaseAll := func() {
		if !released {
			for _, h := range l0[:len(rs)] {
				h.release()
			}
			released = true
		}
	}
	defer releaseAll()
	for _, h := range l0 {
		r, err := h.acquire(ctx)
		if err != nil {
			return err
		}
		rs = append(rs, r)
		lsnStart, lsnEnd = min(lsnStart, h.desc.LSNStart), max(lsnEnd, h.desc.LSNEnd)
	}
	// K-way merge of the inputs, one key's versions at a time, into files
	// rolled at the target size.
	iw := &imageWriter{t: t, kind: layer.DeltaLayer, tight: true, lsn: lsnStart, lsnEnd: lsnEnd}
	var hs []*handle
	var group []layer.Version
	flushGroup := func() error {
		if iw.w != nil && iw.w.Count() > 0 && rangeOf(iw.start) != rangeOf(group[0].Key) {
			h, err := iw.finish(keyspace.MaxKey)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		for _, v := range dropHidden(group, cutoff) {
			if err := iw.add(&v); err != nil {
				return err
			}
		}
		group = group[:0]
		if iw.w != nil && iw.w.Size() >= t.opts.LayerTargetSize {
			h, err := iw.finish(keyspace.MaxKey)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		return nil
	}
	err := mergeReaders(rs, func(v layer.Version) error {
		if len(group) > 0 && group[0].Key != v.Key {
			if err := flushGroup(); err != nil {
				return err
			}
		}
		group = append(group, v)
		return nil
	})
	if err == nil && len(group) > 0 {
		err = flushGroup()
	}
	if err == nil && iw.w != nil {
		var h *handle
		if h, err = iw.finish(keyspace.MaxKey); err == nil {
			hs = append(hs, h)
		}
	}
	releaseAll() // replaceLayers takes the inputs' locks to delete them
	if err != nil {
		iw.abort()
		for _, h := range hs {
			h.remove()
		}
		return fmt.Errorf("timeline: compaction: %w", err)
	}
	for _, h := range hs {
		h.desc.Level = 1
	}
	t.log.Debug().Int("inputs", len(l0)).Int("outputs", len(hs)).Msg("compacted L0")
	return t.replaceLayers(l0, hs)
}

// mergeReaders calls fn with every version of rs in (Key, LSN, Seq) order.
func mergeReaders(rs []*layer.Reader, fn func(layer.Version) error) error {
	pos := make([]int, len(rs))
	h := &entryHeap{}
	for i, r := range rs {
		if r.Len() > 0 {
			heap.Push(h, heapItem{e: r.Entry(0), src: i})
		}
	}
	for h.Len() > 0 {
		it := heap.Pop(h).(heapItem)
		v, err := rs[it.src].Version(it.e)
		if err != nil {
			return err
		}
		if err := fn(v); err != nil {
			return err
		}
		pos[it.src]++
		if pos[it.src] < rs[it.src].Len() {
			heap.Push(h, heapItem{e: rs[it.src].Entry(pos[it.src]), src: it.src})
		}
	}
	return nil
}

type heapItem struct {
	e   layer.Entry
	src int
}

type entryHeap []heapItem

func (h entryHeap) Len() int { return len(h) }
func (h entryHeap) Less(i, j int) bool {
	a, b := h[i].e, h[j].e
	if c := a.Key.Compare(b.Key); c != 0 {
		return c < 0
	}
	if a.LSN != b.LSN {
		return a.LSN < b.LSN
	}
	return a.Seq < b.Seq
}
func (h entryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *entryHeap) Push(x any)   { *h = append(*h, x.(heapItem)) }
func (h *entryHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// dropHidden removes duplicates and, per key, the versions older than the
// newest base version at or below cutoff (no read at or above the cutoff
// can need them). vs is sorted by (Key, LSN, Seq).
func dropHidden(vs []layer.Version, cutoff pg.LSN) []layer.Version {
	out := vs[:0]
	for i := 0; i < len(vs); {
		j := i
		for j < len(vs) && vs[j].Key == vs[i].Key {
			j++
		}
		start := i
		for k := j - 1; k >= i; k-- {
			if vs[k].LSN <= cutoff && vs[k].Kind.IsBase() {
				start = k
				break
			}
		}
		for k := start; k < j; k++ {
			if k > start && vs[k].LSN == vs[k-1].LSN && vs[k].Seq == vs[k-1].Seq {
				continue
			}
			out = append(out, vs[k])
		}
		i = j
	}
	return out
}

// imageWriter writes layer files one after the other (image layers; and
// with tight set, compaction output whose ranges are exactly their keys).
type imageWriter struct {
	t      *Timeline
	lsn    pg.LSN // image LSN; for deltas lsnEnd > 0 gives the range
	lsnEnd pg.LSN
	kind   layer.FileKind
	tight  bool
	start  keyspace.Key
	last   keyspace.Key
	f      *os.File
	w      *layer.Writer
}

func (iw *imageWriter) open() error {
	if iw.w != nil {
		return nil
	}
	f, err := os.CreateTemp(iw.t.dir, "tmp-layer-*")
	if err != nil {
		return err
	}
	kind := iw.kind
	if kind == 0 {
		kind = layer.ImageLayer
	}
	iw.f, iw.w = f, layer.NewWriter(pacedwrite.New(f), kind)
	return nil
}

func (iw *imageWriter) add(v *layer.Version) error {
	if err := iw.open(); err != nil {
		return err
	}
	if iw.tight && iw.w.Count() == 0 {
		iw.start = v.Key
	}
	iw.last = v.Key
	return iw.w.Add(v)
}

// finish closes the current file, declaring its range [start, end).
func (iw *imageWriter) finish(end keyspace.Key) (*handle, error) {
	if err := iw.open(); err != nil { // an empty file: no keys in [start, end)
		return nil, err
	}
	lo, hi := iw.lsn, iw.lsn+1
	if iw.lsnEnd > 0 {
		hi = iw.lsnEnd
	}
	if iw.tight {
		end = iw.last.Next()
	}
	d, err := iw.w.Finish(keyspace.Range{Start: iw.start, End: end}, lo, hi)
	if err == nil {
		err = iw.f.Sync()
	}
	if err == nil {
		d.Name = layer.NewName(d.Kind, d.Keys, d.LSNStart, d.LSNEnd)
		err = os.Rename(iw.f.Name(), filepath.Join(iw.t.dir, d.Name))
	}
	iw.f.Close()
	if err != nil {
		os.Remove(iw.f.Name())
		iw.f, iw.w = nil, nil
		return nil, err
	}
	iw.f, iw.w, iw.start = nil, nil, end
	return iw.t.newHandle(d), nil
}

func (iw *imageWriter) abort() {
	if iw.f != nil {
		iw.f.Close()
		os.Remove(iw.f.Name())
	}
}

// SetRetainLSNs tells the timeline which LSNs its children branch at; GC
// keeps what reads at those LSNs need.
func (t *Timeline) SetRetainLSNs(ls []pg.LSN) {
	t.mu.Lock()
	t.retain = append([]pg.LSN(nil), ls...)
	t.mu.Unlock()
}

// gcCutoffLocked computes the cutoff that retention allows now: below the last
// record by GCHorizon, older than PITR, and not above any branch point or
// leased LSN; unchanged during the lease grace after a restart. It is
// called under mu, held for writing by whoever raises the cutoff to it: a
// lease taken meanwhile would not be seen.
func (t *Timeline) gcCutoffLocked() pg.LSN {
	last := pg.LSN(t.lastRecord.Load())
	if uint64(last) <= t.opts.GCHorizon || t.d.Now().Before(t.graceEnd) {
		return t.gcCutoff
	}
	c := last - pg.LSN(t.opts.GCHorizon)
	if t.opts.PITR > 0 {
		// The newest LSN known to exist by now - pitr: history after it
		// is kept.
		limit := t.d.Now().Add(-t.opts.PITR)
		var p pg.LSN
		for _, lt := range t.lsnTimes {
			if !lt.t.After(limit) {
				p = max(p, lt.lsn)
			}
		}
		c = min(c, p)
	}
	for _, r := range t.retain {
		c = min(c, r)
	}
	now := t.d.Now()
	t.dropEndedLeasesLocked(now)
	if l := t.oldestLeaseLocked(now); l > 0 {
		c = min(c, l)
	}
	return max(c, t.gcCutoff)
}

// GC raises the GC cutoff as retention allows and deletes the layer files
// that no read at or above the cutoff needs: a layer wholly below the
// cutoff with image layers newer than it (and at or below the cutoff)
// covering its whole key range. An image layer at the LSN of a layer's
// newest versions is newer if it was made after them (imageHides): the
// last delta layer flushed before an image pass ends at the pass's LSN,
// and once passes rewrite only the changed key ranges, no later pass may
// rewrite all of its range. It returns the number of layers removed.
func (t *Timeline) GC(ctx context.Context) (int, error) {
	if err := t.publishMu.Lock(ctx); err != nil {
		return 0, err
	}
	defer t.publishMu.Unlock()
	return t.gc(ctx)
}

// gc is GC. REQUIRES: t.publishMu held.
func (t *Timeline) gc(ctx context.Context) (int, error) {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	t.gcCutoff = t.gcCutoffLocked()
	t.gcCut.Store(uint64(t.gcCutoff))
	cutoff := t.gcCutoff
	all := t.layers.All()
	t.mu.Unlock()
	var images []*handle
	for _, h := range all {
		if !h.desc.IsDelta() && h.desc.LSNStart <= cutoff {
			images = append(images, h)
		}
	}
	var drop []*handle
	for _, h := range all {
		if h.desc.LSNEnd > cutoff || h.desc.LSNEnd == 0 {
			continue
		}
		var cover []keyspace.Range
		for _, im := range images {
			if im != h && im.desc.Name != h.desc.Name && imageHides(im.desc, h.desc) && im.desc.Keys.Overlaps(h.desc.Keys) {
				cover = append(cover, im.desc.Keys)
			}
		}
		if covers(cover, h.desc.Keys) {
			drop = append(drop, h)
		}
	}
	if len(drop) == 0 {
		return 0, t.saveLocal()
	}
	t.log.Debug().Int("layers", len(drop)).Stringer("cutoff", cutoff).Msg("gc")
	return len(drop), t.replaceLayers(drop, nil)
}

// covers reports whether the union of rs covers r.
func covers(rs []keyspace.Range, r keyspace.Range) bool {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Less(rs[j].Start) })
	at := r.Start
	for _, x := range rs {
		if at.Less(x.Start) {
			return false
		}
		if at.Less(x.End) {
			at = x.End
		}
		if !at.Less(r.End) {
			return true
		}
	}
	return !at.Less(r.End)
}

// EvictCold deletes local copies of uploaded layers, least recently used
// first, until the local layer bytes are at most MaxLocalBytes. Evicted
// layers are fetched again on demand.
func (t *Timeline) EvictCold() int {
	if t.opts.MaxLocalBytes <= 0 || t.d.Remote == nil || !t.remoteChecked.Load() {
		return 0
	}
	t.mu.RLock()
	all := append([]*handle(nil), t.layers.All()...)
	t.mu.RUnlock()
	var local []*handle
	var used int64
	for _, h := range all {
		if h.isLocal() {
			local = append(local, h)
			used += h.desc.Size
		}
	}
	sort.Slice(local, func(i, j int) bool { return local[i].lastUse.Load() < local[j].lastUse.Load() })
	n := 0
	for _, h := range local {
		if used <= t.opts.MaxLocalBytes {
			break
		}
		if h.evict() {
			used -= h.desc.Size
			n++
			if t.d.Metrics != nil {
				t.d.Metrics.evictions.Inc()
			}
		}
	}
	return n
}

// LocalBytes returns the bytes of layer files on local disk.
func (t *Timeline) LocalBytes() int64 {
	t.mu.RLock()
	all := t.layers.All()
	t.mu.RUnlock()
	var n int64
	for _, h := range all {
		if st, err := os.Stat(h.path()); err == nil {
			n += st.Size()
		}
	}
	return n
}

// Layers returns the descriptions of the current layer files.
func (t *Timeline) Layers() []layer.Desc {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []layer.Desc
	for _, h := range t.layers.All() {
		out = append(out, h.desc)
	}
	return out
}

// background runs the periodic work: release gated versions, freeze by
// age, flush, compact, create image layers, GC, upload, evict.
func (t *Timeline) background() {
	defer t.wg.Done()
	tick := time.NewTicker(t.opts.BackgroundInterval)
	defer tick.Stop()
	// A failed image layer is retried later, not at the next round: it
	// may materialize every page of the database before it fails, and a page
	// the redo engine cannot rebuild (an index whose WAL it does not
	// replay, allowed by an operator in redo mode) fails every attempt.
	images := retryAfter{min: 30 * time.Second, max: 30 * time.Minute}
	// lockPublish takes publishMu for compaction or GC when no upload
	// holds it. After skipRounds turns lost in a row (uploads back to
	// back on a slow link) it asks the uploader to pause (wantPublish)
	// until it has had one, so compaction and GC are not starved; this
	// loop itself never waits for the store (it also releases gated and
	// ingested versions).
	const skipRounds = 10
	skipped := 0
	lockPublish := func() bool {
		if !t.publishMu.TryLock() {
			if skipped++; skipped >= skipRounds {
				t.wantPublish.Store(true)
			}
			return false
		}
		skipped = 0
		t.wantPublish.Store(false)
		return true
	}
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		case <-t.kick:
		}
		ctx := context.Background()
		t0 := time.Now()
		if err := t.CommitAdvanced(); err != nil {
			t.log.Error().Err(err).Msg("releasing gated versions")
		}
		if err := t.SyncIngested(); err != nil {
			t.log.Error().Err(err).Msg("syncing ingested WAL")
		}
		t.writeMu.Lock() // between writes (afterWriteLocked)
		t.maybeFreeze()
		t.writeMu.Unlock()
		t1 := time.Now()
		if err := t.flushFrozen(ctx); err != nil {
			t.log.Error().Err(err).Msg("flush")
		}
		t2 := time.Now()
		// Compaction and GC replace layers an upload may be publishing:
		// while one runs (the uploader's, which may wait minutes for a
		// slow store), they wait for a later round rather than hold up
		// this loop's flushes, but not for ever (lockPublish).
		if lockPublish() {
			if err := t.compact(ctx, false); err != nil {
				t.log.Error().Err(err).Msg("compaction")
			}
			t.publishMu.Unlock()
		}
		if n, b, img := t.deltasSinceImage(); n > 0 && t.d.Policy.WantImageLayer(n, b, img) && images.due(t.d.Now()) {
			if err := t.CreateImageLayer(ctx, t.LSNs().Durable); err != nil {
				t.log.Error().Err(err).Dur("retry_in", images.failed(t.d.Now())).Msg("image layer")
			} else {
				images.succeeded()
			}
		}
		t3 := time.Now()
		if lockPublish() {
			if _, err := t.gc(ctx); err != nil {
				t.log.Error().Err(err).Msg("gc")
			}
			t.publishMu.Unlock()
		}
		t4 := time.Now()
		t.EvictCold()
		t.d.Metrics.observeLayers(t)
		if d := time.Since(t0); d > 5*time.Second {
			t.log.Warn().Dur("commit", t1.Sub(t0)).Dur("flush", t2.Sub(t1)).Dur("compact_images", t3.Sub(t2)).
				Dur("gc", t4.Sub(t3)).Dur("evict", time.Since(t4)).Msg("slow background round")
		}
	}
}

// uploader uploads the timeline's new layers and manifest once every
// BackgroundInterval, on a goroutine of its own: an upload to a slow or
// stalled store (each attempt bounded by the store's stall timeout and
// retries) holds neither the flushes nor the background loop. A failed
// upload is tried again after a backoff. Close cancels an upload under
// way; what it had not published stays on the local disk.
func (t *Timeline) uploader() {
	defer t.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(t.opts.BackgroundInterval)
	defer tick.Stop()
	upload := retryAfter{min: 100 * time.Millisecond, max: 10 * time.Second}
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		if !upload.due(t.d.Now()) || t.wantPublish.Load() {
			continue // the background loop's turn (lockPublish)
		}
		start := time.Now()
		if err := t.Upload(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			t.log.Warn().Err(err).Dur("retry_in", upload.failed(t.d.Now())).Msg("upload")
			continue
		}
		upload.succeeded()
		if d := time.Since(start); d > 5*time.Second {
			t.log.Info().Dur("took", d).Msg("slow upload (flushes went on meanwhile)")
		}
	}
}

// retryAfter spaces the attempts of a failing background step: after a
// failure the next one waits min, then twice as long after each further
// failure, at most max; a success resets it.
type retryAfter struct {
	min, max time.Duration
	wait     time.Duration
	next     time.Time
}

// due says whether the step may run at now.
func (r *retryAfter) due(now time.Time) bool { return !now.Before(r.next) }

// failed records a failure at now and returns the wait before the next
// attempt.
func (r *retryAfter) failed(now time.Time) time.Duration {
	r.wait = min(max(2*r.wait, r.min), r.max)
	r.next = now.Add(r.wait)
	return r.wait
}

// succeeded resets the wait.
func (r *retryAfter) succeeded() { r.wait, r.next = 0, time.Time{} }
