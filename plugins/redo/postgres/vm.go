package postgres

import (
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// VMClear is a change a heap record makes to a visibility-map page that
// it does not reference as a block: Postgres' heap redo clears the bits of
// the heap block it modifies directly (visibilitymap_clear).
type VMClear struct {
	Page      pg.PageKey // the visibility-map page (VM fork)
	HeapBlock uint32
	Bits      uint8 // VISIBILITYMAP_ALL_VISIBLE (1) and/or ALL_FROZEN (2)
}

// VMClears returns the visibility-map changes record r implies. A
// pageserver must apply them to the VM pages as well as the record's block
// references.
func VMClears(r *wal.Record) []VMClear {
	m := r.MainData
	clr := func(blk *wal.BlockRef, bits uint8, out []VMClear) []VMClear {
		if blk == nil {
			return out
		}
		k := blk.Page
		k.Fork = pg.VMFork
		k.Block = blk.Page.Block / heapBlocksPerVMPage
		return append(out, VMClear{Page: k, HeapBlock: blk.Page.Block, Bits: bits})
	}
	var out []VMClear
	switch r.RmID {
	case wal.RmHeap:
		switch r.RmInfo() & 0x70 {
		case 0x00:
			if len(m) >= 3 && m[2]&0x01 != 0 {
				out = clr(r.Block(0), 3, out)
			}
		case 0x10:
			if len(m) >= 8 && m[7]&0x01 != 0 {
				out = clr(r.Block(0), 3, out)
			}
		case 0x20, 0x40:
			if len(m) >= 8 {
				old := r.Block(1)
				if old == nil {
					old = r.Block(0)
				}
				if m[7]&0x01 != 0 {
					out = clr(old, 3, out)
				}
				if m[7]&0x02 != 0 {
					out = clr(r.Block(0), 3, out)
				}
			}
		case 0x60:
			if len(m) >= 8 && m[7]&0x01 != 0 {
				out = clr(r.Block(0), 2, out)
			}
		}
	case wal.RmHeap2:
		switch r.RmInfo() & 0x70 {
		case 0x50:
			if len(m) >= 1 && m[0]&0x01 != 0 {
				out = clr(r.Block(0), 3, out)
			}
		case 0x60:
			if len(m) >= 8 && m[7]&0x01 != 0 {
				out = clr(r.Block(0), 2, out)
			}
		}
	}
	return out
}

// ApplyVMClear applies c to the visibility-map page pg8k (initializing a
// new page as vm_readbuf does). Clearing does not change the page LSN.
func ApplyVMClear(c VMClear, pg8k []byte) {
	p := page(pg8k)
	if p.isNew() {
		p.init(0)
	}
	hb := c.HeapBlock % heapBlocksPerVMPage
	i, shift := pageHeaderSize+int(hb/4), (hb%4)*2
	p[i] &^= c.Bits << shift
}

// vmBitsAt returns the two bits of heap block hb in a VM page (for tests).
func vmBitsAt(pg8k []byte, hb uint32) uint8 {
	hb %= heapBlocksPerVMPage
	return pg8k[pageHeaderSize+int(hb/4)] >> ((hb % 4) * 2) & 3
}
