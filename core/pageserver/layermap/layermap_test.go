package layermap

import (
	"testing"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

type item struct{ d layer.Desc }

func (i *item) Desc() *layer.Desc { return &i.d }

func mk(name string, start, end byte, lo, hi pg.LSN, kind layer.FileKind) *item {
	return &item{layer.Desc{Name: name, Kind: kind, Keys: keyspace.Range{Start: keyspace.Key{start}, End: keyspace.Key{end}}, LSNStart: lo, LSNEnd: hi, Size: 10}}
}

func TestSearchOrderAndRanges(t *testing.T) {
	a := mk("a", 0, 10, 0, 100, layer.DeltaLayer)
	b := mk("b", 5, 20, 100, 200, layer.DeltaLayer)
	c := mk("c", 0, 255, 150, 151, layer.ImageLayer)
	d := mk("d", 30, 40, 200, 300, layer.DeltaLayer)
	m := New([]*item{a, b, c, d})
	var got []string
	m.Search(keyspace.Key{7}, 250, func(i *item) bool { got = append(got, i.d.Name); return true })
	if len(got) != 3 || got[0] != "b" || got[1] != "c" || got[2] != "a" {
		t.Fatalf("search order %v", got)
	}
	got = nil
	m.Search(keyspace.Key{7}, 120, func(i *item) bool { got = append(got, i.d.Name); return true })
	if len(got) != 2 || got[0] != "b" || got[1] != "a" {
		t.Fatalf("search at 120: %v", got) // c starts at 150
	}
	got = nil
	m.Search(keyspace.Key{7}, 250, func(i *item) bool { got = append(got, i.d.Name); return false })
	if len(got) != 1 {
		t.Fatal("stop")
	}
	if o := m.Overlapping(keyspace.Range{Start: keyspace.Key{25}, End: keyspace.Key{35}}, 1000); len(o) != 2 {
		t.Fatalf("overlapping %d", len(o))
	}
	m2 := m.Replace(func(i *item) bool { return i == a }, mk("e", 0, 5, 300, 400, layer.DeltaLayer))
	if m.Len() != 4 || m2.Len() != 4 || m2.All()[0].d.Name != "e" {
		t.Fatal("Replace must leave the old map alone")
	}
	st := m2.Stats()
	if st.Deltas != 3 || st.Images != 1 || st.Bytes != 40 {
		t.Fatalf("stats %+v", st)
	}
}
