package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// GIN redo: ginxlog.c. Every GIN page has an 8-byte special space
// (GinPageOpaqueData: rightlink, maxoff, flags). Entry pages hold index
// tuples; posting-tree pages ("data" pages) hold, after a right-bound item
// pointer, either posting items (internal pages) or compressed posting
// list segments (leaf pages), with pd_lower marking the end of either.
const (
	ginCreatePTree        = 0x10
	ginInsert             = 0x20
	ginSplit              = 0x30
	ginVacuumPage         = 0x40
	ginDeletePage         = 0x50
	ginUpdateMetaPage     = 0x60
	ginInsertListPage     = 0x70
	ginDeleteListPage     = 0x80
	ginVacuumDataLeafPage = 0x90

	ginOpaqueSize = 8

	ginData            = 1 << 0
	ginLeaf            = 1 << 1
	ginDeleted         = 1 << 2
	ginMeta            = 1 << 3
	ginList            = 1 << 4
	ginListFullRow     = 1 << 5
	ginIncompleteSplit = 1 << 6
	ginCompressed      = 1 << 7

	ginInsertIsData = 0x01
	ginInsertIsLeaf = 0x02

	// ginDataStart is GinDataPageGetData: the page contents after the
	// MAXALIGNed right-bound item pointer.
	ginDataStart = pageHeaderSize + 8
	// ginDataMax is GinDataPageMaxDataSize.
	ginDataMax = 8192 - ginDataStart - ginOpaqueSize
	// postingItemSize is sizeof(PostingItem): a child block id and a key.
	postingItemSize = 4 + tidSize
	// ginMetaSize is sizeof(GinMetaPageData), trailing padding included.
	ginMetaSize = 56

	ginSegmentDelete   = 1
	ginSegmentInsert   = 2
	ginSegmentReplace  = 3
	ginSegmentAddItems = 4
)

func (p page) ginRight() uint32         { return p.u32(p.special()) }
func (p page) ginSetRight(b uint32)     { p.put32(p.special(), b) }
func (p page) ginMaxOff() int           { return int(p.u16(p.special() + 4)) }
func (p page) ginSetMaxOff(n int)       { p.put16(p.special()+4, uint16(n)) }
func (p page) ginFlags() uint16         { return p.u16(p.special() + 6) }
func (p page) ginSetFlags(f uint16)     { p.put16(p.special()+6, f) }
func (p page) ginSetDataSize(n int)     { p.setLower(ginDataStart + n) }
func (p page) ginPostingItem(i int) int { return ginDataStart + (i-1)*postingItemSize }

// ginInit is GinInitPage.
func (p page) ginInit(flags uint16) {
	p.init(ginOpaqueSize)
	p.ginSetFlags(flags)
	p.ginSetRight(invalidBlock)
}

// ginInitMeta is GinInitMetabuffer followed by the copy of the record's
// metadata over the fresh one, as the metapage records' redo does.
func (p page) ginInitMeta(meta []byte) error {
	if len(meta) < ginMetaSize {
		return errShort
	}
	p.ginInit(ginMeta)
	copy(p[pageHeaderSize:], meta[:ginMetaSize])
	p.setLower(pageHeaderSize + ginMetaSize)
	return nil
}

// ginAddTuples adds the n index tuples packed in d from offset off on.
func (p page) ginAddTuples(d []byte, n, off int) error {
	added, err := p.addIndexTuples(d, off)
	if err == nil && added != n {
		err = fmt.Errorf("%w: %d GIN tuples, %d in the record", errRecord, added, n)
	}
	return err
}

// A tid is an ItemPointerData's six bytes: the block number as two 16-bit
// halves, high first, then the offset.
func tidBlock(t []byte) uint32 {
	return uint32(binary.LittleEndian.Uint16(t))<<16 | uint32(binary.LittleEndian.Uint16(t[2:]))
}
func tidOff(t []byte) uint16   { return binary.LittleEndian.Uint16(t[4:]) }
func tidKey(t []byte) uint64   { return uint64(tidBlock(t))<<11 | uint64(tidOff(t)) } // itemptr_to_uint64
func tidOrder(t []byte) uint64 { return uint64(tidBlock(t))<<32 | uint64(tidOff(t)) } // ginCompareItemPointers
func putTidKey(t []byte, v uint64) {
	binary.LittleEndian.PutUint16(t[4:], uint16(v&(1<<11-1)))
	b := uint32(v >> 11)
	binary.LittleEndian.PutUint16(t, uint16(b>>16))
	binary.LittleEndian.PutUint16(t[2:], uint16(b))
}

// ginSegmentSize is SizeOfGinPostingList of the segment at the start of d.
func ginSegmentSize(d []byte) (int, error) {
	if len(d) < 8 {
		return 0, errShort
	}
	n := 8 + int(binary.LittleEndian.Uint16(d[6:])+1)&^1
	if n > len(d) {
		return 0, fmt.Errorf("%w: GIN posting list segment of %d bytes in %d", errRecord, n, len(d))
	}
	return n, nil
}

// ginDecodeSegment is ginPostingListDecode: the segment's item pointers,
// six bytes each.
func ginDecodeSegment(seg []byte) ([]byte, error) {
	nbytes := int(binary.LittleEndian.Uint16(seg[6:]))
	if 8+nbytes > len(seg) {
		return nil, errShort
	}
	out := append([]byte(nil), seg[:tidSize]...)
	v := tidKey(seg)
	var t [tidSize]byte
	for b := seg[8 : 8+nbytes]; len(b) > 0; {
		var delta uint64
		for shift := 0; ; shift += 7 {
			if len(b) == 0 || shift > 42 {
				return nil, fmt.Errorf("%w: GIN varbyte past its segment", errRecord)
			}
			c := b[0]
			b = b[1:]
			if shift == 42 {
				delta |= uint64(c) << 42 // the seventh byte has no continuation bit
				break
			}
			delta |= uint64(c&0x7F) << shift
			if c&0x80 == 0 {
				break
			}
		}
		v += delta
		putTidKey(t[:], v)
		out = append(out, t[:]...)
	}
	return out, nil
}

// ginEncodeSegment is ginCompressPostingList with a whole page as the
// limit: every item must fit.
func ginEncodeSegment(items []byte) ([]byte, error) {
	n := len(items) / tidSize
	if n == 0 {
		return nil, fmt.Errorf("%w: empty GIN posting list", errRecord)
	}
	out := make([]byte, 8, 64)
	copy(out, items[:tidSize])
	prev := tidKey(items)
	for i := 1; i < n; i++ {
		v := tidKey(items[i*tidSize:])
		if v <= prev {
			return nil, fmt.Errorf("%w: GIN item pointers out of order", errRecord)
		}
		for d := v - prev; ; d >>= 7 {
			if d <= 0x7F {
				out = append(out, byte(d))
				break
			}
			out = append(out, 0x80|byte(d&0x7F))
		}
		prev = v
	}
	nbytes := len(out) - 8
	if 8+nbytes > 8192&^1 {
		return nil, fmt.Errorf("%w: GIN posting list of %d items does not fit a page", errRecord, n)
	}
	binary.LittleEndian.PutUint16(out[6:], uint16(nbytes))
	if nbytes%2 == 1 {
		out = append(out, 0)
	}
	return out, nil
}

// ginMergeItems is ginMergeItemPointers: the sorted union of a and b, an
// item in both kept once.
func ginMergeItems(a, b []byte) []byte {
	out := make([]byte, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		switch ka, kb := tidOrder(a), tidOrder(b); {
		case ka > kb:
			out, b = append(out, b[:tidSize]...), b[tidSize:]
		case ka == kb:
			out, b = append(out, b[:tidSize]...), b[tidSize:]
			a = a[tidSize:]
		default:
			out, a = append(out, a[:tidSize]...), a[tidSize:]
		}
	}
	out = append(out, a...)
	return append(out, b...)
}

// ginRecompress is ginRedoRecompress: it applies a leaf's segment actions
// (ginxlogRecompressDataLeaf) to its posting list. The new list is written
// from the list's start; bytes past its new end stay as they were, as in
// Postgres.
func (p page) ginRecompress(d []byte) error {
	if p.ginFlags()&ginCompressed == 0 {
		// A leaf in the pre-9.4 format: its items, uncompressed, become
		// one segment first.
		n := p.ginMaxOff()
		size := 0
		if n > 0 {
			if ginDataStart+n*tidSize > p.special() {
				return fmt.Errorf("%w: uncompressed GIN leaf of %d items", errPage, n)
			}
			seg, err := ginEncodeSegment(p[ginDataStart : ginDataStart+n*tidSize])
			if err != nil {
				return err
			}
			size = copy(p[ginDataStart:], seg)
		}
		p.ginSetDataSize(size)
		p.ginSetFlags(p.ginFlags() | ginCompressed)
		p.ginSetMaxOff(0)
	}
	end := p.lower()
	if end < ginDataStart || end > p.special() {
		return fmt.Errorf("%w: GIN leaf with pd_lower %d", errPage, end)
	}
	var old [][]byte
	for o := ginDataStart; o < end; {
		n, err := ginSegmentSize(p[o:end])
		if err != nil {
			return err
		}
		old = append(old, p[o:o+n])
		o += n
	}
	if len(d) < 2 {
		return errShort
	}
	nactions := int(binary.LittleEndian.Uint16(d))
	d = d[2:]
	var out []byte
	segno := 0
	for i := 0; i < nactions; i++ {
		if len(d) < 2 {
			return errShort
		}
		aseg, action := int(d[0]), d[1]
		d = d[2:]
		var newseg []byte
		switch action {
		case ginSegmentInsert, ginSegmentReplace:
			n, err := ginSegmentSize(d)
			if err != nil {
				return err
			}
			newseg, d = d[:n], d[n:]
		case ginSegmentAddItems:
			if len(d) < 2 {
				return errShort
			}
			n := int(binary.LittleEndian.Uint16(d)) * tidSize
			if len(d) < 2+n {
				return errShort
			}
			newseg, d = d[2:2+n], d[2+n:]
		case ginSegmentDelete:
		default:
			return fmt.Errorf("%w: GIN leaf action %d", errRecord, action)
		}
		if aseg < segno {
			return fmt.Errorf("%w: GIN leaf action on segment %d after %d", errRecord, aseg, segno)
		}
		for ; segno < aseg; segno++ {
			if segno >= len(old) {
				return fmt.Errorf("%w: GIN leaf action on segment %d of %d", errRecord, aseg, len(old))
			}
			out = append(out, old[segno]...)
		}
		if action != ginSegmentInsert && segno >= len(old) {
			return fmt.Errorf("%w: GIN leaf action %d past the last segment", errRecord, action)
		}
		if action == ginSegmentAddItems {
			items, err := ginDecodeSegment(old[segno])
			if err != nil {
				return err
			}
			if newseg, err = ginEncodeSegment(ginMergeItems(newseg, items)); err != nil {
				return err
			}
			action = ginSegmentReplace
		}
		switch action {
		case ginSegmentDelete:
			segno++
		case ginSegmentInsert:
			out = append(out, newseg...)
		case ginSegmentReplace:
			out = append(out, newseg...)
			segno++
		}
	}
	for ; segno < len(old); segno++ {
		out = append(out, old[segno]...)
	}
	if len(out) > ginDataMax {
		return fmt.Errorf("%w: GIN leaf posting list of %d bytes", errRecord, len(out))
	}
	copy(p[ginDataStart:], out)
	p.ginSetDataSize(len(out))
	return nil
}

// ginInsertEntry is ginRedoInsertEntry on an entry page: d is a
// ginxlogInsertEntry (offset, isDelete, pad, the tuple).
func (p page) ginInsertEntry(d []byte, right uint32) error {
	if len(d) < 4+8 {
		return errShort
	}
	off := int(binary.LittleEndian.Uint16(d))
	if right != invalidBlock {
		t, err := p.item(off)
		if err != nil {
			return err
		}
		if len(t) < 8 {
			return fmt.Errorf("%w: GIN tuple of %d bytes", errPage, len(t))
		}
		setDownlink(t, right) // GinSetDownlink
		binary.LittleEndian.PutUint16(t[4:], 0)
	}
	if d[2] != 0 {
		if err := p.indexTupleDelete(off); err != nil {
			return err
		}
	}
	t := d[4:]
	sz := indexTupleSize(t)
	if sz > len(t) || sz < 8 {
		return errShort
	}
	return p.addItem(t[:sz], off, false, false)
}

// ginInsertPostingItem is ginRedoInsertData on an internal posting-tree
// page: the downlink at the offset now points to the split's right half,
// and the new item (the left half's) goes in at the offset
// (GinDataPageAddPostingItem).
func (p page) ginInsertPostingItem(d []byte, right uint32) error {
	if len(d) < 2+postingItemSize {
		return errShort
	}
	off := int(binary.LittleEndian.Uint16(d))
	max := p.ginMaxOff()
	if off < 1 || off > max+1 || p.ginPostingItem(max+2) > p.special() {
		return fmt.Errorf("%w: GIN posting item %d of %d", errRecord, off, max)
	}
	setDownlink(p[p.ginPostingItem(off):], right)
	at := p.ginPostingItem(off)
	copy(p[at+postingItemSize:], p[at:p.ginPostingItem(max+1)])
	copy(p[at:], d[2:2+postingItemSize])
	p.ginSetMaxOff(max + 1)
	p.ginSetDataSize((max + 1) * postingItemSize)
	return nil
}

// ginDeletePostingItem is GinPageDeletePostingItem.
func (p page) ginDeletePostingItem(off int) error {
	max := p.ginMaxOff()
	if off < 1 || off > max || p.ginPostingItem(max+1) > p.special() {
		return fmt.Errorf("%w: GIN posting item %d of %d", errRecord, off, max)
	}
	copy(p[p.ginPostingItem(off):], p[p.ginPostingItem(off+1):p.ginPostingItem(max+1)])
	p.ginSetMaxOff(max - 1)
	p.ginSetDataSize((max - 1) * postingItemSize)
	return nil
}

func redoGin(r *wal.Record, blk *wal.BlockRef, p page) error {
	m := r.MainData
	switch r.RmInfo() {
	case ginCreatePTree:
		if err := needMain(r, 4); err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint32(m))
		if n > ginDataMax || len(m) < 4+n {
			return fmt.Errorf("%w: GIN posting tree of %d bytes in %d", errRecord, n, len(m)-4)
		}
		p.ginInit(ginData | ginLeaf | ginCompressed)
		copy(p[ginDataStart:], m[4:4+n])
		p.ginSetDataSize(n)
	case ginInsert:
		if err := needMain(r, 2); err != nil {
			return err
		}
		flags := binary.LittleEndian.Uint16(m)
		leaf := flags&ginInsertIsLeaf != 0
		right := uint32(invalidBlock)
		if !leaf {
			if err := needMain(r, 10); err != nil {
				return err
			}
			right = downlink(m[6:]) // the right child, a BlockIdData
		}
		switch {
		case blk.ID == 1 && !leaf: // the child whose split this completes
			p.ginSetFlags(p.ginFlags() &^ ginIncompleteSplit)
		case blk.ID != 0:
			return fmt.Errorf("%w: GIN insert block %d", errRecord, blk.ID)
		case flags&ginInsertIsData == 0:
			if err := p.ginInsertEntry(blk.Data, right); err != nil {
				return err
			}
		case leaf:
			if err := p.ginRecompress(blk.Data); err != nil {
				return err
			}
		default:
			if err := p.ginInsertPostingItem(blk.Data, right); err != nil {
				return err
			}
		}
	case ginSplit:
		// The halves and a new root are logged as full page images, which
		// RedoBlock restores before it gets here.
		if err := needMain(r, 26); err != nil {
			return err
		}
		if blk.ID != 3 || binary.LittleEndian.Uint16(m[24:])&ginInsertIsLeaf != 0 {
			return fmt.Errorf("%w: GIN split without a full page image of block %d", errRecord, blk.ID)
		}
		p.ginSetFlags(p.ginFlags() &^ ginIncompleteSplit)
	case ginVacuumPage:
		return fmt.Errorf("%w: GIN entry page vacuum without a full page image", errRecord)
	case ginVacuumDataLeafPage:
		if err := p.ginRecompress(blk.Data); err != nil {
			return err
		}
	case ginDeletePage:
		if err := needMain(r, 12); err != nil {
			return err
		}
		switch blk.ID {
		case 0:
			p.ginSetFlags(p.ginFlags() | ginDeleted)
			p.setPruneXID(binary.LittleEndian.Uint32(m[8:])) // GinPageSetDeleteXid
		case 1:
			if err := p.ginDeletePostingItem(int(binary.LittleEndian.Uint16(m))); err != nil {
				return err
			}
		case 2:
			p.ginSetRight(binary.LittleEndian.Uint32(m[4:]))
		}
	case ginUpdateMetaPage:
		// ginxlogUpdateMeta: node, the metadata (8-aligned), prevTail,
		// newRightlink, ntuples.
		if err := needMain(r, 84); err != nil {
			return err
		}
		if blk.ID == 0 {
			return p.ginFinish(r, p.ginInitMeta(m[16:]))
		}
		prevTail, newRight := binary.LittleEndian.Uint32(m[72:]), binary.LittleEndian.Uint32(m[76:])
		switch n := int(int32(binary.LittleEndian.Uint32(m[80:]))); {
		case n > 0: // tuples added to the pending list's tail page
			off := 1
			if p.lower() > pageHeaderSize { // !PageIsEmpty
				off = p.maxOff() + 1
			}
			if err := p.ginAddTuples(blk.Data, n, off); err != nil {
				return err
			}
			p.ginSetMaxOff(p.ginMaxOff() + 1) // one more heap tuple
		case prevTail != invalidBlock: // a new sublist after the old tail
			p.ginSetRight(newRight)
		default:
			return nil // Postgres does not touch the block
		}
	case ginInsertListPage:
		if err := needMain(r, 8); err != nil {
			return err
		}
		right := binary.LittleEndian.Uint32(m)
		p.ginInit(ginList)
		p.ginSetRight(right)
		if right == invalidBlock { // the sublist's tail ends a heap row
			p.ginSetFlags(p.ginFlags() | ginListFullRow)
			p.ginSetMaxOff(1)
		}
		if err := p.ginAddTuples(blk.Data, int(int32(binary.LittleEndian.Uint32(m[4:]))), 1); err != nil {
			return err
		}
	case ginDeleteListPage:
		if err := needMain(r, ginMetaSize+4); err != nil {
			return err
		}
		if blk.ID == 0 {
			return p.ginFinish(r, p.ginInitMeta(m))
		}
		p.ginInit(ginDeleted)
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

// ginFinish sets the page LSN unless err.
func (p page) ginFinish(r *wal.Record, err error) error {
	if err == nil {
		p.setLSN(r.EndLSN)
	}
	return err
}

// maskGin is gin_mask.
func maskGin(p page) {
	maskLSN(p)
	maskHints(p)
	switch {
	case p.hasSpecial(ginOpaqueSize) && p.ginFlags()&ginDeleted != 0:
		clear(p[pageHeaderSize:]) // mask_page_content
		p.setLower(0)
		p.setUpper(0)
	case p.lower() > pageHeaderSize:
		maskUnused(p)
	}
}
