package timeline

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// Image layers are written by key range. The newest image files of a
// timeline tile the key space (each pass declares ranges that tile what it
// rewrites); a range is rewritten only when something changed in it since
// its image: a delta layer above that image overlaps it, or a relation
// with pages in it was dropped since. The rest keep their image, which
// still holds every key of its range as of now. A write-hot part of a
// large database is then rewritten alone, not with the whole database.

// imagePlan is what an image pass at some LSN would do.
type imagePlan struct {
	// ranges to rewrite, sorted, adjacent ones merged: the whole key space
	// when the timeline's own image files do not tile it (none yet, as on
	// a new timeline or a branch).
	ranges []keyspace.Range
	full   bool
	// deltas and deltaBytes: the delta layers above the image of some
	// range they overlap (what the next pass puts below an image).
	deltas     int
	deltaBytes int64
	// imageBytes: the image files the pass replaces; keptBytes: those it
	// leaves as they are.
	imageBytes, keptBytes int64
	partitions, rewrite   int
}

// planImages plans an image pass at lsn. drops gives the relation forks
// dropped by a stored tombstone of their size key, with its LSN: a range
// holding pages of such a relation whose image is older than the drop is
// rewritten (without them) even if no delta layer overlaps it.
func (t *Timeline) planImages(ctx context.Context, lsn pg.LSN, drops map[pg.RelTag]pg.LSN) imagePlan {
	t.mu.RLock()
	all := t.layers.All()
	t.mu.RUnlock()
	var images, deltas []*handle
	for _, h := range all {
		if h.desc.IsDelta() {
			deltas = append(deltas, h)
		} else {
			images = append(images, h)
		}
	}
	var p imagePlan
	front := imageFrontier(images)
	if front == nil {
		var img pg.LSN
		for _, h := range images {
			img = max(img, h.desc.LSNStart)
		}
		for _, h := range deltas {
			if h.desc.LSNEnd > img+1 {
				p.deltas++
				p.deltaBytes += h.desc.Size
			}
		}
		for _, h := range images {
			if img > 0 && h.desc.LSNStart == img {
				p.imageBytes += h.desc.Size
			}
		}
		p.full, p.ranges = true, []keyspace.Range{keyspace.All}
		return p
	}
	// An image at or above lsn is already what a pass at lsn would write:
	// only older ones can be behind.
	dirty := make([]bool, len(front))
	for _, d := range deltas {
		counted := false
		for i, f := range front {
			if counted && dirty[i] {
				continue // nothing left to learn from d here
			}
			if f.desc.LSNStart < lsn && !imageHides(f.desc, d.desc) && d.desc.Keys.Overlaps(f.desc.Keys) && d.hasKeyIn(ctx, f.desc.Keys) {
				dirty[i] = true
				if !counted {
					p.deltas++
					p.deltaBytes += d.desc.Size
					counted = true
				}
			}
		}
	}
	for rel, at := range drops {
		for i, f := range front {
			if f.desc.LSNStart < lsn && at > f.desc.LSNStart && keyspace.RelRange(rel).Overlaps(f.desc.Keys) {
				dirty[i] = true
			}
		}
	}
	for i, f := range front {
		p.partitions++
		if !dirty[i] {
			p.keptBytes += f.desc.Size
			continue
		}
		p.rewrite++
		p.imageBytes += f.desc.Size
		if n := len(p.ranges); n > 0 && p.ranges[n-1].End == f.desc.Keys.Start {
			p.ranges[n-1].End = f.desc.Keys.End
		} else {
			p.ranges = append(p.ranges, f.desc.Keys)
		}
	}
	return p
}

// imageHides reports whether image file im holds, for each key of its
// range, a version newer than every version of file d there: d's are all
// below im's LSN, or at it and stored before the image was made (a
// smaller Seq; a write raised to the image's LSN after it has a larger
// one). An image file with no keys has no Seq and hides only what is
// below its LSN.
func imageHides(im, d layer.Desc) bool {
	return im.LSNStart >= d.LSNEnd || (im.LSNStart+1 == d.LSNEnd && im.MaxSeq > d.MaxSeq)
}

// hasKeyIn reports whether the layer holds a key in r. A delta layer's
// declared range is that of its keys, but one flushed from writes all
// over the key space (catalog pages and a hot table) spans what lies
// between them: only its keys make a range changed. If the file cannot be
// read it is taken to have one. The answer is remembered, so that a file
// is opened (and, if evicted, downloaded) once per range, not at every
// plan.
func (h *handle) hasKeyIn(ctx context.Context, r keyspace.Range) bool {
	if r.Covers(h.desc.Keys) {
		return true
	}
	h.keysMu.Lock()
	has, ok := h.keysIn[r]
	h.keysMu.Unlock()
	if ok {
		return has
	}
	lr, err := h.acquire(ctx)
	if err != nil {
		return true
	}
	i := lr.Seek(r.Start)
	has = i < lr.Len() && lr.Entry(i).Key.Less(r.End)
	h.release()
	h.keysMu.Lock()
	if h.keysIn == nil {
		h.keysIn = map[keyspace.Range]bool{}
	}
	h.keysIn[r] = has
	h.keysMu.Unlock()
	return has
}

// imageFrontier returns the image files that no newer image file overlaps,
// sorted by key, if they tile the whole key space; else nil.
func imageFrontier(images []*handle) []*handle {
	var out []*handle
	for _, h := range images {
		newest := true
		for _, o := range images {
			if o.desc.LSNStart > h.desc.LSNStart && o.desc.Keys.Overlaps(h.desc.Keys) {
				newest = false
				break
			}
		}
		if newest {
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].desc.Keys.Start.Less(out[j].desc.Keys.Start) })
	var at keyspace.Key
	for _, h := range out {
		if h.desc.Keys.Start != at {
			return nil // a gap, or two files over one range
		}
		at = h.desc.Keys.End
	}
	if at != keyspace.MaxKey {
		return nil
	}
	return out
}

// deltasSinceImage reports what the image policy weighs: the delta layers
// above the image of a range they overlap (count and bytes) and the bytes
// of the image files a pass at the durable LSN would replace.
func (t *Timeline) deltasSinceImage() (n int, b, image int64) {
	p := t.planImages(context.Background(), t.LSNs().Durable, nil)
	return p.deltas, p.deltaBytes, p.imageBytes
}

// CreateImageLayer materializes the keys of the timeline at lsn (its own
// keys and, for a branch, its ancestors') into image layer files: every
// key of the ranges that changed since their image (planImages), or of
// the whole key space on a timeline whose image files do not tile it yet.
// lsn must be at or below the durable LSN and no pending version may be
// at or below it.
func (t *Timeline) CreateImageLayer(ctx context.Context, lsn pg.LSN) error {
	l := t.LSNs()
	if lsn > l.Durable {
		return fmt.Errorf("timeline: image layer at %s above the durable LSN %s", lsn, l.Durable)
	}
	// Versions below lsn may still sit in in-memory layers: flush first.
	if err := t.Flush(ctx); err != nil {
		return err
	}
	if p := t.planImages(ctx, lsn, nil); len(p.ranges) == 0 {
		return nil // nothing changed since the images (a drop leaves a delta too)
	}
	// The images rank above every version that exists now and below any
	// later write at the same LSN. With writeMu held no write is half
	// stored: every smaller Seq is in memory or a layer file, where the
	// scan below sees it. From here on a gated write below lsn is raised
	// to lsn (putLocked), so no later write is hidden by these images.
	t.writeMu.Lock()
	t.mu.Lock()
	imgSeq := t.seq.Add(1)
	t.imageFloor = max(t.imageFloor, lsn)
	t.mu.Unlock()
	t.writeMu.Unlock()
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	dropped, err := t.droppedRels(ctx, lsn)
	if err != nil {
		return err
	}
	plan := t.planImages(ctx, lsn, dropped)
	// Stream: one key materialized at a time, files rolled over at the
	// target size at a key boundary; each range's files tile the range.
	var hs []*handle
	iw := &imageWriter{t: t, lsn: lsn}
	nkeys, skipped := 0, 0
	add := func(k keyspace.Key) error {
		cs, _, err := t.collect(ctx, k, lsn)
		if err != nil {
			return err
		}
		if k.IsRelBlock() && len(cs) > 0 {
			// A page of a dropped relation, not written since the drop:
			// it does not exist at lsn. Before, every image layer copied
			// such pages again, and GC could never let them go.
			//
			// Strictly below: a page written at or after the drop
			// (Postgres does not, without creating the fork again; the
			// model test does) stays, and so do the rare pages written at
			// the drop's very LSN.
			if at, ok := dropped[k.Rel()]; ok && cs[0].v.LSN < at {
				skipped++
				return nil
			}
		}
		d, _, err := t.materialize(ctx, k, lsn, cs)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		nkeys++
		if iw.w != nil && iw.w.Size() >= t.opts.LayerTargetSize {
			h, err := iw.finish(k)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		return iw.add(&layer.Version{Key: k, LSN: lsn, Seq: imgSeq, Kind: layer.Image, Data: d})
	}
	for _, r := range plan.ranges {
		iw.start = r.Start
		if err = t.ScanKeys(ctx, r, lsn, add); err != nil {
			break
		}
		var h *handle
		if h, err = iw.finish(r.End); err != nil {
			break
		}
		hs = append(hs, h)
	}
	if err != nil {
		iw.abort()
		for _, h := range hs {
			h.remove()
		}
		return err
	}
	var written int64
	for _, h := range hs {
		written += h.desc.Size
	}
	t.d.Metrics.imagePass(written, plan.keptBytes)
	t.log.Debug().Int("keys", nkeys).Int("dropped_pages", skipped).Int("files", len(hs)).Int64("bytes", written).
		Bool("full", plan.full).Int("ranges_rewritten", plan.rewrite).Int("ranges", plan.partitions).
		Int64("kept_bytes", plan.keptBytes).Stringer("lsn", lsn).Msg("created image layer")
	return t.replaceLayers(nil, hs)
}

// droppedRels returns the relation forks dropped (DropRel: a tombstone of
// the size key) at or below lsn whose drop is still a stored version, not
// yet below an image of the size key, with the drop's LSN: a page whose
// newest version is below it belongs to a dropped incarnation (the fork
// may have been created again since, under the same number). The first
// pass after the drop rewrites every range with such pages (planImages)
// and leaves them out; after it the size key reads as a tombstone at that
// image's LSN, which says nothing of the pages: those left are newer than
// the drop, and a range the pass did not rewrite holds pages older than
// that image's LSN that are not of a dropped incarnation.
func (t *Timeline) droppedRels(ctx context.Context, lsn pg.LSN) (map[pg.RelTag]pg.LSN, error) {
	keys, err := t.relSizeKeys(ctx, keyspace.RelsRange, lsn)
	if err != nil {
		return nil, err
	}
	out := map[pg.RelTag]pg.LSN{}
	for _, k := range keys {
		cs, _, err := t.collect(ctx, k, lsn)
		if err != nil {
			return nil, err
		}
		// Newest first, ending at a base: a tombstone is one, so the last
		// drop, if any, is the last candidate.
		if n := len(cs); n > 0 && cs[n-1].v.Kind == layer.Tombstone && !cs[n-1].absent {
			out[k.Rel()] = cs[n-1].v.LSN
		}
	}
	return out, nil
}
