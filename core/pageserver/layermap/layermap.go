// Package layermap indexes a timeline's layer files by key range and LSN
// range, answering "which layers can hold versions of key K at or below LSN
// X, newest first" without touching the layers themselves.
//
// A Map is an immutable value: changes (Insert, Replace) return a new Map,
// so readers take a snapshot with one atomic load and never lock. It does
// not own the layers and does no I/O.
package layermap

import (
	"sort"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// Item is what a Map holds: anything with a layer description. Desc must
// return the same value for the Item's whole life.
type Item interface {
	Desc() *layer.Desc
}

// Map is an immutable set of layers ordered by LSNEnd, newest first.
type Map[T Item] struct {
	items []T
}

// New returns a Map of items.
func New[T Item](items []T) *Map[T] {
	m := &Map[T]{items: append([]T(nil), items...)}
	sort.SliceStable(m.items, func(i, j int) bool {
		a, b := m.items[i].Desc(), m.items[j].Desc()
		if a.LSNEnd != b.LSNEnd {
			return a.LSNEnd > b.LSNEnd
		}
		return a.LSNStart > b.LSNStart
	})
	return m
}

// Len returns the number of layers.
func (m *Map[T]) Len() int { return len(m.items) }

// All returns every layer, newest LSNEnd first. The caller must not modify
// the returned slice.
func (m *Map[T]) All() []T { return m.items }

// Search calls fn for every layer whose key range contains k and whose LSN
// range starts at or below upto, in descending LSNEnd order. fn returns
// false to stop. Callers looking for the newest version of k at or below
// upto stop once LSNEnd is at or below the LSN of a base version found.
func (m *Map[T]) Search(k keyspace.Key, upto pg.LSN, fn func(T) bool) {
	for _, it := range m.items {
		d := it.Desc()
		if d.LSNStart <= upto && d.Keys.Contains(k) {
			if !fn(it) {
				return
			}
		}
	}
}

// Overlapping returns the layers whose key range overlaps r and whose LSN
// range starts at or below upto, newest first.
func (m *Map[T]) Overlapping(r keyspace.Range, upto pg.LSN) []T {
	var out []T
	for _, it := range m.items {
		d := it.Desc()
		if d.LSNStart <= upto && d.Keys.Overlaps(r) {
			out = append(out, it)
		}
	}
	return out
}

// Replace returns a new Map without the items for which drop returns true
// and with add inserted.
func (m *Map[T]) Replace(drop func(T) bool, add ...T) *Map[T] {
	out := make([]T, 0, len(m.items)+len(add))
	for _, it := range m.items {
		if drop == nil || !drop(it) {
			out = append(out, it)
		}
	}
	return New(append(out, add...))
}

// Stats counts layers by kind and level.
type Stats struct {
	Deltas, Images int
	ByLevel        map[int]int // delta layers per level
	Bytes          int64
}

// Stats returns counts of the layers in m.
func (m *Map[T]) Stats() Stats {
	s := Stats{ByLevel: map[int]int{}}
	for _, it := range m.items {
		d := it.Desc()
		s.Bytes += d.Size
		if d.IsDelta() {
			s.Deltas++
			s.ByLevel[d.Level]++
		} else {
			s.Images++
		}
	}
	return s
}
