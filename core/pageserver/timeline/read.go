package timeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/layermap"
	"github.com/stratadb/strata/sdk/pg"
)

// cand is a version found by a read; h and e locate its data in a layer
// file when v.Data has not been read yet.
type cand struct {
	v layer.Version
	h *handle
	e layer.Entry
	// absent: not a stored version but an image layer's word that the key
	// did not exist at its LSN (a tombstone at the image's LSN).
	absent bool
}

// snapshot is a consistent view of a timeline's in-memory state and layers.
type snapshot struct {
	pending []layer.Version
	mems    []*layer.InMem
	layers  *layermap.Map[*handle]
}

// snap takes the snapshot for a read of k at upto. Of k's pending versions
// it keeps those a read at upto needs: at or below upto, from the newest
// base among them on (a relation extended page by page while the commit
// LSN stands still has one pending size version per page).
func (t *Timeline) snap(k keyspace.Key, upto pg.LSN) snapshot {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := snapshot{layers: t.layers}
	if p := t.pendingKeys[k]; len(p) > 0 {
		// p is oldest first.
		hi := len(p)
		for hi > 0 && p[hi-1].LSN > upto {
			hi--
		}
		lo := hi
		for lo > 0 {
			lo--
			if p[lo].Kind.IsBase() {
				break
			}
		}
		if lo < hi {
			s.pending = append([]layer.Version(nil), p[lo:hi]...) // writers edit p in place
		}
	}
	s.mems = append(make([]*layer.InMem, 0, 1+len(t.frozen)), t.open)
	s.mems = append(s.mems, t.frozen...)
	return s
}

// collect gathers the versions needed to materialize k at upto, newest
// first, ending with a base version if one exists (in this timeline or its
// ancestors). It also returns how many layer files it consulted.
func (t *Timeline) collect(ctx context.Context, k keyspace.Key, upto pg.LSN) ([]cand, int, error) {
	for attempt := 0; ; attempt++ {
		cs, n, err := t.collectOnce(ctx, k, upto)
		if errors.Is(err, errLayerGone) && attempt < 5 {
			continue
		}
		return cs, n, err
	}
}

func (t *Timeline) collectOnce(ctx context.Context, k keyspace.Key, upto pg.LSN) ([]cand, int, error) {
	s := t.snap(k, upto)
	var cs []cand
	for _, v := range s.pending {
		if v.LSN <= upto {
			cs = append(cs, cand{v: v})
		}
	}
	var vs []layer.Version
	for _, m := range s.mems {
		var err error
		vs, err = m.ReadVersions(vs[:0], k, upto)
		if errors.Is(err, layer.ErrClosed) {
			// Flushed and removed since the snapshot: a fresh snapshot
			// has its layer files.
			return nil, 0, errLayerGone
		}
		if err != nil {
			return nil, 0, err
		}
		for _, v := range vs {
			cs = append(cs, cand{v: v})
		}
	}
	base, found := newestBase(cs)
	var err error
	n := 0
	s.layers.Search(k, upto, func(h *handle) bool {
		if found && h.desc.LSNEnd <= base {
			return false
		}
		n++
		before := len(cs)
		cs, err = h.versions(ctx, cs, keyAt{key: k, upto: upto})
		if err != nil {
			return false
		}
		if b, ok := newestBase(cs[before:]); ok && (!found || b > base) {
			base, found = b, true
		}
		return true
	})
	if err != nil {
		return nil, n, err
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].v.Newer(&cs[j].v) })
	out := cs[:0]
	for i, c := range cs {
		if i > 0 && c.v.LSN == cs[i-1].v.LSN && c.v.Seq == cs[i-1].v.Seq && c.v.Kind == cs[i-1].v.Kind {
			continue // the same version from a log and a layer file
		}
		out = append(out, c)
		if c.v.Kind.IsBase() {
			return out, n, nil
		}
	}
	if a := t.d.Ancestor; a != nil && (len(out) == 0 || !out[len(out)-1].v.Kind.IsBase()) {
		acs, an, err := a.collect(ctx, k, min(upto, t.d.AncestorLSN))
		return append(out, acs...), n + an, err
	}
	return out, n, nil
}

func newestBase(cs []cand) (pg.LSN, bool) {
	var b pg.LSN
	found := false
	for _, c := range cs {
		if c.v.Kind.IsBase() && (!found || c.v.LSN > b) {
			b, found = c.v.LSN, true
		}
	}
	return b, found
}

// Get returns the value of k at LSN upto (LatestLSN: the newest), or
// ErrNotFound. The caller owns the returned slice... but must not modify
// it: it may be shared with the page cache.
func (t *Timeline) Get(ctx context.Context, k keyspace.Key, upto pg.LSN) ([]byte, error) {
	if err := t.checkCutoff(upto); err != nil {
		return nil, err
	}
	if d, ok, hit := t.cache.get(k, upto); hit {
		t.d.Metrics.read(true, 0)
		if !ok {
			return nil, ErrNotFound
		}
		return d, nil
	}
	epoch := t.epoch.Load()
	fill := t.writing.Load() == 0 // a write in progress may be half visible
	latest := upto >= pg.LSN(t.lastRecord.Load())
	cs, n, err := t.collect(ctx, k, upto)
	t.d.Metrics.read(false, n)
	if err != nil {
		return nil, err
	}
	d, deltas, err := t.materialize(ctx, k, upto, cs)
	if err == nil && k.IsRelBlock() {
		t.d.Metrics.reconstructed(deltas)
	}
	if fill && latest && len(cs) > 0 && (err == nil || errors.Is(err, ErrNotFound)) {
		// cs[0] is the key's newest version: the value answers every
		// read at or above its LSN until the next write to k.
		t.cache.putIf(k, cs[0].v.LSN, d, &t.epoch, epoch)
	}
	return d, err
}

// materialize rebuilds k from its versions cs (newest first, ending at a
// base) and returns it with the number of WAL records it applied.
func (t *Timeline) materialize(ctx context.Context, k keyspace.Key, upto pg.LSN, cs []cand) ([]byte, int, error) {
	if len(cs) == 0 {
		return nil, 0, ErrNotFound
	}
	last := len(cs) - 1
	b := cs[last]
	if !b.v.Kind.IsBase() {
		return nil, 0, fmt.Errorf("%w: %s at %s", ErrMissingBase, k, upto)
	}
	if err := t.fill(ctx, &cs[last]); err != nil {
		return nil, 0, err
	}
	if last == 0 {
		switch b.v.Kind {
		case layer.Tombstone:
			return nil, 0, ErrNotFound
		case layer.Image:
			return cs[0].v.Data, 0, nil
		}
	}
	if t.d.Redo == nil {
		return nil, 0, fmt.Errorf("%w: %s at %s", ErrNoRedo, k, upto)
	}
	var base []byte
	var recs [][]byte
	switch cs[last].v.Kind {
	case layer.Image:
		base = cs[last].v.Data
	case layer.WillInit:
		recs = append(recs, cs[last].v.Data)
	case layer.Tombstone:
		if k.IsRelBlock() && !cs[last].absent {
			// A compute's page of zeros (PutPages stores it as a
			// tombstone): WAL applied on top starts from zeros, as it
			// did when the zero page was stored whole.
			base = make([]byte, pg.BlockSize)
		}
	}
	for i := last - 1; i >= 0; i-- {
		if err := t.fill(ctx, &cs[i]); err != nil {
			return nil, 0, err
		}
		recs = append(recs, cs[i].v.Data)
	}
	d, err := t.d.Redo.Apply(k, cs[0].v.LSN, base, recs)
	return d, len(recs), err
}

func (t *Timeline) fill(ctx context.Context, c *cand) error {
	if c.h == nil || c.v.Data != nil {
		return nil
	}
	d, err := c.h.read(ctx, c.e)
	c.v.Data = d
	return err
}

// checkCutoff refuses a read at upto below the GC cutoff: the versions it
// needs may be gone. A scan of keys checks again when it is done (GC may
// have passed upto meanwhile, and a scan finds no error of its own, only
// fewer keys).
func (t *Timeline) checkCutoff(upto pg.LSN) error {
	if c := t.gcCutoffLSN(); upto != LatestLSN && upto < c {
		return fmt.Errorf("%w: %s < %s", ErrBelowGCCutoff, upto, c)
	}
	return nil
}

// gcCutoffLSN takes no lock: it is on every read's path.
func (t *Timeline) gcCutoffLSN() pg.LSN { return pg.LSN(t.gcCut.Load()) }

// WaitLSN waits until the timeline has ingested (or been put) everything up
// to lsn, for at most the configured WaitLSNTimeout.
func (t *Timeline) WaitLSN(ctx context.Context, lsn pg.LSN) error {
	if lsn == LatestLSN {
		return nil
	}
	var timer *time.Timer
	for {
		if pg.LSN(t.lastRecord.Load()) >= lsn {
			return nil
		}
		t.walWaitMu.Lock()
		ch := t.walWait
		t.walWaitMu.Unlock()
		if pg.LSN(t.lastRecord.Load()) >= lsn {
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(t.opts.WaitLSNTimeout)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%w: waited %s for %s, have %s", ErrWaitLSNTimeout, t.opts.WaitLSNTimeout, lsn, pg.LSN(t.lastRecord.Load()))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// GetPage returns the page at requestLSN, first waiting for WAL up to
// notModifiedSince when the timeline has not reached it. A page that was
// never written but lies inside the relation reads as zeros.
func (t *Timeline) GetPage(ctx context.Context, pk pg.PageKey, requestLSN, notModifiedSince pg.LSN) ([]byte, error) {
	if err := t.WaitLSN(ctx, notModifiedSince); err != nil {
		return nil, err
	}
	d, err := t.Get(ctx, keyspace.RelBlock(pk), requestLSN)
	if errors.Is(err, ErrNotFound) {
		n, ok, serr := t.Nblocks(ctx, pk.Tag(), requestLSN)
		if serr == nil && ok && pk.Block < n {
			return make([]byte, pg.BlockSize), nil
		}
	}
	return d, err
}

// Nblocks returns the size of a relation fork in blocks and whether it exists.
func (t *Timeline) Nblocks(ctx context.Context, rel pg.RelTag, lsn pg.LSN) (uint32, bool, error) {
	d, err := t.Get(ctx, keyspace.RelSize(rel), lsn)
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if len(d) != 4 {
		return 0, false, fmt.Errorf("timeline: size of %s is %d bytes", rel, len(d))
	}
	return binary.BigEndian.Uint32(d), true, nil
}

// scanWith adds to set the keys in r that have a version at or below upto
// and that keep accepts: those of the pending versions, the in-memory
// layers, the layer files (walk reads a file's index; nil: no file is
// read, ScanKeys merges them itself) and the ancestor's.
func (t *Timeline) scanWith(ctx context.Context, r keyspace.Range, upto pg.LSN, set map[keyspace.Key]bool,
	keep func(keyspace.Key) bool, walk func(rd *layer.Reader, r keyspace.Range, upto pg.LSN, set map[keyspace.Key]bool)) error {
	t.mu.RLock()
	for _, p := range t.pending {
		if p.LSN <= upto && r.Contains(p.Key) && keep(p.Key) {
			set[p.Key] = true
		}
	}
	mems := append([]*layer.InMem{t.open}, t.frozen...)
	lm := t.layers
	t.mu.RUnlock()
	add := func(k keyspace.Key) {
		if keep(k) {
			set[k] = true
		}
	}
	for _, m := range mems {
		m.Keys(r, upto, add)
	}
	for _, h := range lm.Overlapping(r, upto) {
		if walk == nil {
			break
		}
		rd, err := h.acquire(ctx)
		if errors.Is(err, errLayerGone) {
			continue // its versions are in the layers that replaced it
		}
		if err != nil {
			return err
		}
		walk(rd, r, upto, set)
		h.release()
	}
	if a := t.d.Ancestor; a != nil {
		return a.scanWith(ctx, r, min(upto, t.d.AncestorLSN), set, keep, walk)
	}
	return nil
}

// relSizeKeys returns, in key order, the relation size keys in r that
// have any version at or below upto (tombstones included): ScanKeys of
// the size keys alone. In a layer file it jumps from a relation fork's
// first key to its size key and from there to the next fork, so that it
// costs a few lookups per fork and file, not a visit of every page
// version (a large database has millions).
func (t *Timeline) relSizeKeys(ctx context.Context, r keyspace.Range, upto pg.LSN) ([]keyspace.Key, error) {
	if err := t.checkCutoff(upto); err != nil {
		return nil, err
	}
	set := map[keyspace.Key]bool{}
	if err := t.scanWith(ctx, r, upto, set, keyspace.Key.IsRelSize, walkRelSizes); err != nil {
		return nil, err
	}
	if err := t.checkCutoff(upto); err != nil {
		return nil, err
	}
	return sortedKeys(set), nil
}

func sortedKeys(set map[keyspace.Key]bool) []keyspace.Key {
	keys := make([]keyspace.Key, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	return keys
}

// walkRelSizes adds the relation size keys of a layer file in r with a
// version at or below upto, jumping from a fork's first key to its size
// key and from there to the next fork.
func walkRelSizes(rd *layer.Reader, r keyspace.Range, upto pg.LSN, set map[keyspace.Key]bool) {
	for i := rd.Seek(r.Start); i < rd.Len(); {
		e := rd.Entry(i)
		if !e.Key.Less(r.End) {
			break
		}
		if !e.Key.IsRelSize() {
			i = rd.Seek(keyspace.RelSize(e.Key.Rel()))
			continue
		}
		// A key's entries are sorted by LSN: the first is its oldest.
		if e.LSN <= upto {
			set[e.Key] = true
		}
		i = rd.Seek(e.Key.Next())
	}
}

// ListRels returns the relation forks that exist at lsn in range r (use
// keyspace.DBRange or keyspace.RelsRange).
func (t *Timeline) ListRels(ctx context.Context, r keyspace.Range, lsn pg.LSN) ([]pg.RelTag, error) {
	keys, err := t.relSizeKeys(ctx, r, lsn)
	if err != nil {
		return nil, err
	}
	var out []pg.RelTag
	for _, k := range keys {
		_, err := t.Get(ctx, k, lsn)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, k.Rel())
	}
	return out, nil
}

// DBSize returns the total size in bytes of the relations of a database.
func (t *Timeline) DBSize(ctx context.Context, spc, db uint32, lsn pg.LSN) (int64, error) {
	rels, err := t.ListRels(ctx, keyspace.DBRange(spc, db), lsn)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, r := range rels {
		n, _, err := t.Nblocks(ctx, r, lsn)
		if err != nil {
			return 0, err
		}
		total += int64(n) * pg.BlockSize
	}
	return total, nil
}
