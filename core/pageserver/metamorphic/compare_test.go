package metamorphic

import (
	"encoding/binary"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

func pageWith(special, upper uint16) []byte { return pageWithID(special, upper, 0) }

// pageWithID is pageWith with the special space's last uint16 set to id.
func pageWithID(special, upper, id uint16) []byte {
	p := make([]byte, pg.BlockSize)
	binary.LittleEndian.PutUint16(p[pg.BlockSize-2:], id)
	binary.LittleEndian.PutUint16(p[12:], 24)
	binary.LittleEndian.PutUint16(p[14:], upper)
	binary.LittleEndian.PutUint16(p[16:], special)
	return p
}

// seqPage is a sequence page: its special space holds the magic 0x1717.
func seqPage() []byte {
	p := pageWith(pg.BlockSize-8, 8000)
	binary.LittleEndian.PutUint32(p[pg.BlockSize-8:], 0x1717)
	return p
}

func TestPageKind(t *testing.T) {
	for _, c := range []struct {
		p    []byte
		want wal.RmgrID
		ok   bool
	}{
		{pageWith(pg.BlockSize, 8000), wal.RmHeap, true},
		{pageWith(pg.BlockSize-16, 8000), wal.RmBtree, true},
		{seqPage(), wal.RmSequence, true},
		{pageWith(pg.BlockSize-8, 8000), wal.RmGin, true},         // an internal entry page: flags 0
		{pageWithID(pg.BlockSize-8, 8000, 0x03), wal.RmGin, true}, // a posting-tree leaf
		{pageWithID(pg.BlockSize-8, 8000, 0xFF82), wal.RmSPGist, true},
		{pageWithID(pg.BlockSize-16, 8000, 0xFF80), wal.RmHash, true},
		{pageWithID(pg.BlockSize-16, 8000, 0xFF81), wal.RmGist, true},
		{pageWithID(pg.BlockSize-16, 8000, 0xFF82), 0, false}, // SP-GiST's id in a 16-byte special space: no such page
		{pageWithID(pg.BlockSize-8, 8000, 0xF093), wal.RmBRIN, true},
		{pageWith(pg.BlockSize-24, 8000), 0, false},
		{make([]byte, pg.BlockSize), 0, false},
	} {
		if k, ok := PageKind(c.p); k != c.want || ok != c.ok {
			t.Errorf("special %d: %v %v, want %v %v", binary.LittleEndian.Uint16(c.p[16:]), k, ok, c.want, c.ok)
		}
	}
}

func TestVMComparison(t *testing.T) {
	a := pageWith(pg.BlockSize, pg.BlockSize)
	a[100], a[200] = 0xFF, 0x03
	b := append([]byte(nil), a...)
	b[3] = 0x77 // LSN differs
	if !Equal(pg.VMFork, 0, a, b) {
		t.Fatal("VM pages differing in LSN only are not equal")
	}
	b[100] = 0x0F // fewer bits
	if Equal(pg.VMFork, 0, a, b) || !VMBitsSubset(a, b) {
		t.Fatal("fewer VM bits: want unequal but a subset")
	}
	b[300] = 0x01 // a bit a lacks
	if VMBitsSubset(a, b) {
		t.Fatal("an extra VM bit accepted")
	}
	c := append([]byte(nil), a...)
	c[12] = 40 // pd_lower differs
	if VMBitsSubset(a, c) {
		t.Fatal("a different header accepted")
	}
}

// GiST pages that differ only in their NSN are not equal, though gist_mask
// hides it: a wrong NSN makes index scans return tuples twice.
func TestGistNSNCompared(t *testing.T) {
	a := pageWithID(pg.BlockSize-16, 8000, 0xFF81)
	a[pg.BlockSize-4] = 1 // F_LEAF
	binary.LittleEndian.PutUint32(a[pg.BlockSize-12:], 0x0504e628)
	b := append([]byte(nil), a...)
	b[3] = 0x77 // the page LSN, masked
	if !Equal(pg.MainFork, 7, a, b) {
		t.Fatal("GiST pages differing in their LSN only are not equal")
	}
	binary.LittleEndian.PutUint32(b[pg.BlockSize-16:], 0x0504e628)
	binary.LittleEndian.PutUint32(b[pg.BlockSize-12:], 0)
	if Equal(pg.MainFork, 7, a, b) {
		t.Fatal("GiST pages with the NSN's halves swapped are equal")
	}
	b = append(b[:0], a...)
	b[pg.BlockSize-4] |= 1 << 3 // F_FOLLOW_RIGHT
	if Equal(pg.MainFork, 7, a, b) {
		t.Fatal("GiST pages differing in the follow-right flag are equal")
	}
}
