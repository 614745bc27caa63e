package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/stratadb/strata/sdk/pg"
)

// Page layout constants (bufpage.h, itemid.h).
const (
	pageHeaderSize = 24
	pdHasFreeLines = 0x0001
	pdPageFull     = 0x0002
	pdAllVisible   = 0x0004
	layoutVersion  = 4

	lpUnused   = 0
	lpNormal   = 1
	lpRedirect = 2
	lpDead     = 3
)

var errPage = errors.New("postgres: corrupt page")

// page wraps an 8 KiB page for in-place edits.
type page []byte

func (p page) u16(off int) uint16      { return binary.LittleEndian.Uint16(p[off:]) }
func (p page) put16(off int, v uint16) { binary.LittleEndian.PutUint16(p[off:], v) }
func (p page) u32(off int) uint32      { return binary.LittleEndian.Uint32(p[off:]) }
func (p page) put32(off int, v uint32) { binary.LittleEndian.PutUint32(p[off:], v) }
func (p page) lsn() pg.LSN             { return pg.LSN(uint64(p.u32(0))<<32 | uint64(p.u32(4))) }
func (p page) setLSN(l pg.LSN)         { p.put32(0, uint32(l>>32)); p.put32(4, uint32(l)) }
func (p page) flags() uint16           { return p.u16(10) }
func (p page) setFlags(f uint16)       { p.put16(10, f) }
func (p page) lower() int              { return int(p.u16(12)) }
func (p page) upper() int              { return int(p.u16(14)) }
func (p page) special() int            { return int(p.u16(16)) }
func (p page) setLower(v int)          { p.put16(12, uint16(v)) }
func (p page) setUpper(v int)          { p.put16(14, uint16(v)) }
func (p page) pruneXID() uint32        { return p.u32(20) }
func (p page) setPruneXID(x uint32)    { p.put32(20, x) }
func (p page) isNew() bool             { return p.upper() == 0 }
func (p page) maxOff() int {
	l := p.lower()
	if l <= pageHeaderSize {
		return 0
	}
	return (l - pageHeaderSize) / 4
}

func maxAlign(n int) int { return (n + 7) &^ 7 }

// init is PageInit: zero the page and set the header.
func (p page) init(specialSize int) {
	clear(p)
	specialSize = maxAlign(specialSize)
	p.setLower(pageHeaderSize)
	p.setUpper(pg.BlockSize - specialSize)
	p.put16(16, uint16(pg.BlockSize-specialSize))
	p.put16(18, pg.BlockSize|layoutVersion)
}

// itemID returns the raw line pointer of offset off (1-based).
func (p page) itemID(off int) uint32 { return p.u32(pageHeaderSize + (off-1)*4) }
func (p page) setItemID(off int, v uint32) {
	p.put32(pageHeaderSize+(off-1)*4, v)
}

func lpOff(id uint32) int   { return int(id & 0x7fff) }
func lpFlags(id uint32) int { return int(id>>15) & 3 }
func lpLen(id uint32) int   { return int(id >> 17) }
func makeLP(off, flags, length int) uint32 {
	return uint32(off&0x7fff) | uint32(flags&3)<<15 | uint32(length&0x7fff)<<17
}
func lpHasStorage(id uint32) bool { return lpLen(id) != 0 }
func lpIsUsed(id uint32) bool     { return lpFlags(id) != lpUnused }

func (p page) setUnused(off int) { p.setItemID(off, 0) }
func (p page) setDead(off int)   { p.setItemID(off, makeLP(0, lpDead, 0)) }
func (p page) setRedirect(off, to int) {
	p.setItemID(off, makeLP(to, lpRedirect, 0))
}

// item returns the bytes of the item at off (its unaligned length).
func (p page) item(off int) ([]byte, error) {
	if off < 1 || off > p.maxOff() {
		return nil, fmt.Errorf("%w: offset %d beyond %d items", errPage, off, p.maxOff())
	}
	id := p.itemID(off)
	o, l := lpOff(id), lpLen(id)
	if o+l > pg.BlockSize || o < pageHeaderSize {
		return nil, fmt.Errorf("%w: item %d at %d+%d", errPage, off, o, l)
	}
	return p[o : o+l], nil
}

func (p page) checkPointers() error {
	lo, up, sp := p.lower(), p.upper(), p.special()
	if lo < pageHeaderSize || lo > up || up > sp || sp > pg.BlockSize {
		return fmt.Errorf("%w: lower %d upper %d special %d", errPage, lo, up, sp)
	}
	return nil
}

// addItem is PageAddItemExtended with an explicit offset. overwrite allows
// reusing an unused slot; otherwise later line pointers shift up. isHeap
// caps the offset at MaxHeapTuplesPerPage.
func (p page) addItem(item []byte, off int, overwrite, isHeap bool) error {
	dst, err := p.reserveItem(len(item), off, overwrite, isHeap)
	if err != nil {
		return err
	}
	copy(dst, item)
	return nil
}

// reserveItem does PageAddItemExtended's bookkeeping for an item of size
// bytes and returns where the caller must write it.
func (p page) reserveItem(size, off int, overwrite, isHeap bool) ([]byte, error) {
	if err := p.checkPointers(); err != nil {
		return nil, err
	}
	limit := p.maxOff() + 1
	shuffle := false
	if off < 1 {
		return nil, fmt.Errorf("%w: invalid offset %d", errPage, off)
	}
	if overwrite {
		if off < limit {
			id := p.itemID(off)
			if lpIsUsed(id) || lpHasStorage(id) {
				return nil, fmt.Errorf("%w: will not overwrite used item %d", errPage, off)
			}
		}
	} else if off < limit {
		shuffle = true
	}
	if off > limit {
		return nil, fmt.Errorf("%w: item offset %d too large (max %d)", errPage, off, limit)
	}
	if isHeap && off > maxHeapTuplesPerPage {
		return nil, fmt.Errorf("%w: more than MaxHeapTuplesPerPage items", errPage)
	}
	lower := p.lower()
	if off == limit || shuffle {
		lower += 4
	}
	upper := p.upper() - maxAlign(size)
	if lower > upper {
		return nil, fmt.Errorf("%w: no room for %d bytes", errPage, size)
	}
	if shuffle {
		base := pageHeaderSize + (off-1)*4
		copy(p[base+4:], p[base:pageHeaderSize+(limit-1)*4])
	}
	p.setItemID(off, makeLP(upper, lpNormal, size))
	p.setLower(lower)
	p.setUpper(upper)
	return p[upper : upper+size], nil
}

const maxHeapTuplesPerPage = (pg.BlockSize - pageHeaderSize) / (24 + 4) // MaxHeapTuplesPerPage = 291

type compactItem struct{ idx, off, alen int }

// compactify moves the stored items (in line-pointer order: idx is the
// line pointer to update, off and alen where the item lies now) to the end
// of the page, as compactify_tuples does.
func (p page) compactify(items []compactItem) {
	var scratch [pg.BlockSize]byte
	from := p.special()
	for _, it := range items {
		from = min(from, it.off)
	}
	copy(scratch[from:], p[from:])
	upper := p.special()
	for _, it := range items {
		upper -= it.alen
		copy(p[upper:upper+it.alen], scratch[it.off:it.off+it.alen])
		id := p.itemID(it.idx)
		p.setItemID(it.idx, makeLP(upper, lpFlags(id), lpLen(id)))
	}
	p.setUpper(upper)
}

// repairFragmentation is PageRepairFragmentation.
func (p page) repairFragmentation() error {
	if err := p.checkPointers(); err != nil {
		return err
	}
	nline := p.maxOff()
	var offs []compactItem
	nunused, finalUsed, total := 0, 0, 0
	for i := 1; i <= nline; i++ {
		id := p.itemID(i)
		if lpIsUsed(id) {
			if lpHasStorage(id) {
				if lpOff(id) < p.upper() || lpOff(id) >= p.special() {
					return fmt.Errorf("%w: corrupted line pointer %d", errPage, lpOff(id))
				}
				offs = append(offs, compactItem{i, lpOff(id), maxAlign(lpLen(id))})
				total += maxAlign(lpLen(id))
			}
			finalUsed = i
		} else {
			p.setUnused(i)
			nunused++
		}
	}
	if len(offs) == 0 {
		p.setUpper(p.special())
	} else {
		if total > p.special()-p.lower() {
			return fmt.Errorf("%w: item lengths %d exceed space", errPage, total)
		}
		p.compactify(offs)
	}
	if finalUsed != nline {
		end := nline - finalUsed
		nunused -= end
		p.setLower(p.lower() - 4*end)
	}
	if nunused > 0 {
		p.setFlags(p.flags() | pdHasFreeLines)
	} else {
		p.setFlags(p.flags() &^ pdHasFreeLines)
	}
	return nil
}

// truncateLinePointerArray is PageTruncateLinePointerArray.
func (p page) truncateLinePointerArray() {
	countDone, setHint := false, false
	nend := 0
	for i := p.maxOff(); i >= 1; i-- {
		used := lpIsUsed(p.itemID(i))
		if !countDone && i > 1 {
			if !used {
				nend++
			} else {
				countDone = true
			}
		} else if !used {
			setHint = true
			break
		}
	}
	if nend > 0 {
		p.setLower(p.lower() - 4*nend)
	}
	if setHint {
		p.setFlags(p.flags() | pdHasFreeLines)
	} else {
		p.setFlags(p.flags() &^ pdHasFreeLines)
	}
}

// setPrunable is PageSetPrunable.
func (p page) setPrunable(xid uint32) {
	cur := p.pruneXID()
	if cur == 0 || xidPrecedes(xid, cur) {
		p.setPruneXID(xid)
	}
}

// xidPrecedes is TransactionIdPrecedes (modulo-2^32 comparison for
// normal xids).
func xidPrecedes(a, b uint32) bool {
	if a < 3 || b < 3 {
		return a < b
	}
	return int32(a-b) < 0
}

// deleteTarget checks the page and item off for a tuple deletion and
// returns the item's MAXALIGNed size, its offset and the page's number of
// line pointers.
func (p page) deleteTarget(off int) (size, o, nline int, err error) {
	if err := p.checkPointers(); err != nil {
		return 0, 0, 0, err
	}
	nline = p.maxOff()
	if off < 1 || off > nline {
		return 0, 0, 0, fmt.Errorf("%w: delete offset %d of %d", errPage, off, nline)
	}
	id := p.itemID(off)
	size, o = lpLen(id), lpOff(id)
	if o < p.upper() || o+size > p.special() || o != maxAlign(o) {
		return 0, 0, 0, fmt.Errorf("%w: corrupted item pointer %d+%d", errPage, o, size)
	}
	return maxAlign(size), o, nline, nil
}

// indexTupleDelete is PageIndexTupleDelete.
func (p page) indexTupleDelete(off int) error {
	size, o, nline, err := p.deleteTarget(off)
	if err != nil {
		return err
	}
	up := p.upper()
	base := pageHeaderSize + (off-1)*4
	copy(p[base:], p[base+4:p.lower()])
	if o > up {
		copy(p[up+size:], p[up:o])
	}
	p.setUpper(up + size)
	p.setLower(p.lower() - 4)
	if p.lower() > pageHeaderSize { // !PageIsEmpty
		for i := 1; i <= nline-1; i++ {
			ii := p.itemID(i)
			if lpOff(ii) <= o {
				p.setItemID(i, makeLP(lpOff(ii)+size, lpFlags(ii), lpLen(ii)))
			}
		}
	}
	return nil
}

// indexMultiDelete is PageIndexMultiDelete; offs must be sorted.
func (p page) indexMultiDelete(offs []int) error {
	if len(offs) <= 2 {
		for i := len(offs) - 1; i >= 0; i-- {
			if err := p.indexTupleDelete(offs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if err := p.checkPointers(); err != nil {
		return err
	}
	nline := p.maxOff()
	var items []compactItem
	var ids []uint32
	next, total := 0, 0
	for off := 1; off <= nline; off++ {
		id := p.itemID(off)
		size, o := lpLen(id), lpOff(id)
		if o < p.upper() || o+size > p.special() || o != maxAlign(o) {
			return fmt.Errorf("%w: corrupted item pointer %d+%d", errPage, o, size)
		}
		if next < len(offs) && off == offs[next] {
			next++
			continue
		}
		ids = append(ids, id)
		items = append(items, compactItem{len(ids), o, maxAlign(size)})
		total += maxAlign(size)
	}
	if next != len(offs) {
		return fmt.Errorf("%w: incorrect index offsets supplied", errPage)
	}
	for i, id := range ids {
		p.setItemID(i+1, id)
	}
	p.setLower(pageHeaderSize + 4*len(ids))
	if len(ids) > 0 {
		p.compactify(items)
	} else {
		p.setUpper(p.special())
	}
	return nil
}

// indexTupleOverwrite is PageIndexTupleOverwrite.
func (p page) indexTupleOverwrite(off int, tup []byte) error {
	if err := p.checkPointers(); err != nil {
		return err
	}
	n := p.maxOff()
	if off < 1 || off > n {
		return fmt.Errorf("%w: overwrite offset %d of %d", errPage, off, n)
	}
	id := p.itemID(off)
	oldSize, o := lpLen(id), lpOff(id)
	up := p.upper()
	if o < up || o+oldSize > p.special() || o != maxAlign(o) {
		return fmt.Errorf("%w: corrupted item pointer %d+%d", errPage, o, oldSize)
	}
	oldSize = maxAlign(oldSize)
	newAligned := maxAlign(len(tup))
	if newAligned > oldSize+(up-p.lower()) {
		return fmt.Errorf("%w: no room to overwrite item %d", errPage, off)
	}
	diff := oldSize - newAligned
	if diff != 0 {
		copy(p[up+diff:], p[up:o])
		p.setUpper(up + diff)
		for i := 1; i <= n; i++ {
			ii := p.itemID(i)
			if lpHasStorage(ii) && lpOff(ii) <= o {
				p.setItemID(i, makeLP(lpOff(ii)+diff, lpFlags(ii), lpLen(ii)))
			}
		}
	}
	id = p.itemID(off)
	p.setItemID(off, makeLP(o+diff, lpFlags(id), len(tup)))
	copy(p[o+diff:], tup)
	return nil
}
