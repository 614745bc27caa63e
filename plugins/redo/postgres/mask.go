package postgres

import (
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// Mask blanks, in place, the parts of a page that Postgres ignores when it
// checks redo consistency for resource manager rm (heap_mask, btree_mask,
// seq_mask): the LSN and checksum, hint bits and flags, unused space, and
// per-tuple hint bits. It reports false for resource managers without a
// mask (their pages are compared whole).
func Mask(rm wal.RmgrID, pg8k []byte, blkno uint32) bool {
	p := page(pg8k)
	switch rm {
	case wal.RmHeap, wal.RmHeap2:
		maskCommon(p)
		for off := 1; off <= p.maxOff(); off++ {
			id := p.itemID(off)
			o := lpOff(id)
			if lpFlags(id) == lpNormal && o+htupSize <= len(p) {
				t := p[o:]
				im := tupU16(t, tInfomask)
				if im&heapXminFrozen != heapXminFrozen {
					im &^= heapXactMask
				} else {
					im &^= heapXmaxInvalid | heapXmaxCommit
				}
				tupPut16(t, tInfomask, im)
				tupPut32(t, tField3, 0)
				if tupU16(t, tCtid+4) == 0xfffe { // speculative token
					setCtid(t, blkno, uint16(off))
				}
			}
			if lpHasStorage(id) {
				l := lpLen(id)
				if end := o + maxAlign(l); end <= len(p) {
					clear(p[o+l : end])
				}
			}
		}
		return true
	case wal.RmBtree:
		maskCommon(p)
		if sp := p.special(); p.hasSpecial(16) {
			flags := p.u16(sp + 12)
			if flags&btpLeaf != 0 {
				maskLPFlags(p)
			}
			p.put16(sp+12, flags&^(btpHasGarbage|btpSplitEnd))
			p.put16(sp+14, 0)
		}
		return true
	case wal.RmSequence:
		maskLSN(p)
		maskUnused(p)
		return true
	case wal.RmBRIN:
		maskBrin(p)
		return true
	case wal.RmHash:
		maskHash(p)
		return true
	case wal.RmGist:
		maskGist(p)
		return true
	case wal.RmGin:
		maskGin(p)
		return true
	case wal.RmSPGist:
		maskSPGist(p)
		return true
	case wal.RmGeneric:
		maskLSN(p)
		maskUnused(p)
		return true
	}
	return false
}

func maskLSN(p page) {
	p.put32(0, 0)
	p.put32(4, 0)
	p.put16(8, 0)
}

func maskHints(p page) {
	p.setPruneXID(0)
	p.setFlags(p.flags() &^ (pdPageFull | pdHasFreeLines | pdAllVisible))
}

func maskUnused(p page) {
	lo, up := p.lower(), p.upper()
	if lo < pageHeaderSize || lo > up || up > p.special() || p.special() > len(p) {
		return // Postgres errors out here; leave the page as is so the comparison fails
	}
	clear(p[lo:up])
}

// maskLPFlags is mask_lp_flags: every used line pointer reads as unused
// (LP_DEAD marks are hints).
func maskLPFlags(p page) {
	for off := 1; off <= p.maxOff(); off++ {
		if id := p.itemID(off); lpIsUsed(id) {
			p.setItemID(off, makeLP(lpOff(id), lpUnused, lpLen(id)))
		}
	}
}

// maskCommon is how the heap and index masks begin (mask_page_lsn_and_checksum,
// mask_page_hint_bits, mask_unused_space).
func maskCommon(p page) {
	maskLSN(p)
	maskHints(p)
	maskUnused(p)
}

// hasSpecial reports whether a special space of size bytes lies within the
// page where its header says (a mask reads flags there).
func (p page) hasSpecial(size int) bool {
	o := p.special()
	return o >= pageHeaderSize && o+size <= len(p)
}
