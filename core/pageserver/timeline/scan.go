package timeline

import (
	"container/heap"
	"context"
	"errors"
	"slices"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// scanWindowKeys is how many keys of the layer files ScanKeys gathers at
// once. A scan of a large range (a full image pass walks the whole
// database) goes window by window: the layer files' indexes are merged in
// key order up to this many keys, and fn is called for them with no layer
// held. Before, a scan gathered every key of the range in one map, then
// sorted them: close to a gigabyte for the 13 million pages of 100 GB.
const scanWindowKeys = 1 << 16

// ScanKeys calls fn, in key order, for every key in r that has any version
// at or below upto (including keys whose newest version is a tombstone).
// fn runs with no lock or layer held, so it may read the timeline. An upto
// below the GC cutoff fails with ErrBelowGCCutoff, as a read there does.
func (t *Timeline) ScanKeys(ctx context.Context, r keyspace.Range, upto pg.LSN, fn func(keyspace.Key) error) error {
	limit := t.opts.scanWindow
	if limit <= 0 {
		limit = scanWindowKeys
	}
	var keys []keyspace.Key
	for start := r.Start; start.Less(r.End); {
		w := keyspace.Range{Start: start, End: r.End}
		var err error
		keys, w.End, err = t.windowKeys(ctx, w, upto, limit, keys[:0])
		if err != nil {
			return err
		}
		// Each window's keys are whole only if GC has not passed upto
		// by its end (checkCutoff).
		if err := t.checkCutoff(upto); err != nil {
			return err
		}
		for _, k := range keys {
			if err := fn(k); err != nil {
				return err
			}
		}
		start = w.End
	}
	return nil
}

// windowKeys appends to out, sorted, the keys in r with a version at or
// below upto, from r.Start up to the end of the window: out holds at most
// limit keys of the layer files (plus those of the in-memory layers and
// pending versions there, which their size bounds), and end is where the
// next window starts (r.End after the last).
func (t *Timeline) windowKeys(ctx context.Context, r keyspace.Range, upto pg.LSN, limit int, out []keyspace.Key) ([]keyspace.Key, keyspace.Key, error) {
	var cs cursors
	defer cs.release()
	if err := t.openCursors(ctx, r, upto, &cs); err != nil {
		return nil, r.End, err
	}
	heap.Init(&cs)
	end := r.End
	n := 0
	for cs.Len() > 0 {
		k := cs.c[0].key
		if n == limit && (n == 0 || k != out[len(out)-1]) {
			end = k
			break
		}
		if len(out) == 0 || k != out[len(out)-1] {
			out = append(out, k)
			n++
		}
		if cs.c[0].next() {
			heap.Fix(&cs, 0)
		} else {
			heap.Pop(&cs)
		}
	}
	cs.release()
	// The pending versions and in-memory layers below the window's end
	// (theirs and the ancestors'; no layer file is read again).
	mem := map[keyspace.Key]bool{}
	if err := t.scanWith(ctx, keyspace.Range{Start: r.Start, End: end}, upto, mem, func(keyspace.Key) bool { return true }, nil); err != nil {
		return nil, r.End, err
	}
	if len(mem) > 0 {
		from := len(out) - n
		for k := range mem {
			out = append(out, k)
		}
		slices.SortFunc(out[from:], func(a, b keyspace.Key) int { return a.Compare(b) })
		out = append(out[:from], slices.Compact(out[from:])...)
	}
	return out, end, nil
}

// openCursors adds a cursor, at its first key in r with a version at or
// below upto, for each layer file of t and its ancestors that has one.
func (t *Timeline) openCursors(ctx context.Context, r keyspace.Range, upto pg.LSN, cs *cursors) error {
	t.mu.RLock()
	lm := t.layers
	t.mu.RUnlock()
	for _, h := range lm.Overlapping(r, upto) {
		rd, err := h.acquire(ctx)
		if errors.Is(err, errLayerGone) {
			continue // its versions are in the layers that replaced it
		}
		if err != nil {
			return err
		}
		c := &cursor{h: h, rd: rd, i: rd.Seek(r.Start) - 1, end: r.End, upto: upto}
		cs.held = append(cs.held, h)
		if c.next() {
			cs.c = append(cs.c, c)
		}
	}
	if a := t.d.Ancestor; a != nil {
		return a.openCursors(ctx, r, min(upto, t.d.AncestorLSN), cs)
	}
	return nil
}

// cursor walks the distinct keys of one layer file's index that have a
// version at or below upto, below end.
type cursor struct {
	h    *handle
	rd   *layer.Reader
	i    int
	key  keyspace.Key
	seen bool // key holds a key of the file
	end  keyspace.Key
	upto pg.LSN
}

// next moves to the next such key; false at the end.
func (c *cursor) next() bool {
	for c.i++; c.i < c.rd.Len(); c.i++ {
		e := c.rd.Entry(c.i)
		if !e.Key.Less(c.end) {
			return false
		}
		// A key's entries are sorted by LSN: its first is its oldest.
		if c.seen && e.Key == c.key {
			continue
		}
		c.key, c.seen = e.Key, true
		if e.LSN <= c.upto {
			return true
		}
	}
	return false
}

// cursors is a min-heap of cursors by key, with the handles they hold.
type cursors struct {
	c    []*cursor
	held []*handle
}

func (cs *cursors) Len() int           { return len(cs.c) }
func (cs *cursors) Less(i, j int) bool { return cs.c[i].key.Less(cs.c[j].key) }
func (cs *cursors) Swap(i, j int)      { cs.c[i], cs.c[j] = cs.c[j], cs.c[i] }
func (cs *cursors) Push(x any)         { cs.c = append(cs.c, x.(*cursor)) }
func (cs *cursors) Pop() any {
	c := cs.c[len(cs.c)-1]
	cs.c = cs.c[:len(cs.c)-1]
	return c
}

// release lets go of every handle (once).
func (cs *cursors) release() {
	for _, h := range cs.held {
		h.release()
	}
	cs.held, cs.c = nil, nil
}
