package postgres

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// SP-GiST redo: spgxlog.c. Every SP-GiST page has an 8-byte special space
// (SpGistPageOpaqueData: flags, nRedirection, nPlaceholder, page id).
//
// Postgres redoes all blocks of a record in one function; here each block
// reference is redone on its own. No SP-GiST record reads another block's
// page: the tuples come from the record, and the other blocks contribute
// only their block numbers (the target of a downlink or a redirect).
const (
	spgAddLeaf        = 0x10
	spgMoveLeafs      = 0x20
	spgAddNode        = 0x30
	spgSplitTuple     = 0x40
	spgPickSplit      = 0x50
	spgVacuumLeaf     = 0x60
	spgVacuumRoot     = 0x70
	spgVacuumRedirect = 0x80

	spgOpaqueSize = 8
	spgPageID     = 0xFF82
	spgLeafPage   = 1 << 2 // SPGIST_LEAF
	spgNullsPage  = 1 << 3 // SPGIST_NULLS

	// Tuple states, the low two bits of every tuple's first word.
	spgLive        = 0
	spgRedirect    = 1
	spgDead        = 2
	spgPlaceholder = 3

	spgDeadTupleSize = 16 // SGDTSIZE
	spgInnerHdrSize  = 8  // SGITHDRSZ
)

func (p page) spgSetNRedirection(n uint16) { p.put16(p.special()+2, n) }
func (p page) spgNRedirection() uint16     { return p.u16(p.special() + 2) }
func (p page) spgNPlaceholder() uint16     { return p.u16(p.special() + 4) }
func (p page) spgSetNPlaceholder(n uint16) { p.put16(p.special()+4, n) }

// spgInit is SpGistInitPage.
func (p page) spgInit(flags uint16) {
	p.init(spgOpaqueSize)
	p.put16(p.special(), flags)
	p.put16(p.special()+6, spgPageID)
}

// spgLeafFlags are the flags of a leaf page, in the nulls tree or not.
func spgLeafFlags(nulls bool) uint16 {
	if nulls {
		return spgLeafPage | spgNullsPage
	}
	return spgLeafPage
}

func spgNullsFlag(nulls bool) uint16 {
	if nulls {
		return spgNullsPage
	}
	return 0
}

// spgLeafTuple returns the leaf tuple at the start of d (unaligned in the
// record); its size is the upper 30 bits of the first word.
func spgLeafTuple(d []byte) ([]byte, error) {
	if len(d) < 12 {
		return nil, errShort
	}
	n := int(binary.LittleEndian.Uint32(d) >> 2)
	if n < 12 || n > len(d) {
		return nil, fmt.Errorf("%w: SP-GiST leaf tuple of %d bytes, %d left", errRecord, n, len(d))
	}
	return d[:n], nil
}

// spgInnerTuple returns the inner tuple at the start of d; its size is the
// uint16 after the bit fields.
func spgInnerTuple(d []byte) ([]byte, error) {
	if len(d) < spgInnerHdrSize {
		return nil, errShort
	}
	n := int(binary.LittleEndian.Uint16(d[4:]))
	if n < spgInnerHdrSize || n > len(d) {
		return nil, fmt.Errorf("%w: SP-GiST inner tuple of %d bytes, %d left", errRecord, n, len(d))
	}
	return d[:n], nil
}

// spgDeadTuple is spgFormDeadTuple: a redirect points at (blkno, off) and
// carries the inserting xid; placeholders and dead tuples carry an invalid
// pointer and xid 0. The next-offset field is 0.
func spgDeadTuple(state int, blkno uint32, off int, xid uint32) []byte {
	t := make([]byte, spgDeadTupleSize)
	binary.LittleEndian.PutUint32(t, uint32(state)|spgDeadTupleSize<<2)
	if state != spgRedirect {
		blkno, off, xid = invalidBlock, 0, 0
	}
	setDownlink(t[6:], blkno)
	binary.LittleEndian.PutUint16(t[10:], uint16(off))
	binary.LittleEndian.PutUint32(t[12:], xid)
	return t
}

// spgAddOrReplace is addOrReplaceTuple: a tuple goes at off, replacing
// the placeholder there if off is an existing item.
func (p page) spgAddOrReplace(tup []byte, off int) error {
	if off <= p.maxOff() {
		old, err := p.item(off)
		if err != nil {
			return err
		}
		if len(old) < 4 || old[0]&3 != spgPlaceholder {
			return fmt.Errorf("%w: SP-GiST tuple %d to be replaced is not a placeholder", errPage, off)
		}
		p.spgSetNPlaceholder(p.spgNPlaceholder() - 1)
		if err := p.indexTupleDelete(off); err != nil {
			return err
		}
	}
	return p.addItem(tup, off, false, false)
}

// spgReplace deletes the item at off and adds tup in its place
// (PageIndexTupleDelete then PageAddItem at the same offset).
func (p page) spgReplace(tup []byte, off int) error {
	if err := p.indexTupleDelete(off); err != nil {
		return err
	}
	return p.addItem(tup, off, false, false)
}

// spgMultiDelete is spgPageIndexMultiDelete: the items go, and dead tuples
// take their offsets, the first listed one in state first, the others in
// state rest; the page's redirect and placeholder counts follow.
func (p page) spgMultiDelete(items []int, first, rest int, blkno uint32, off int, xid uint32) error {
	if len(items) == 0 {
		return nil
	}
	sorted := slices.Clone(items)
	slices.Sort(sorted)
	if err := p.indexMultiDelete(sorted); err != nil {
		return err
	}
	for _, it := range sorted {
		state := rest
		if it == items[0] {
			state = first
		}
		if err := p.addItem(spgDeadTuple(state, blkno, off, xid), it, false, false); err != nil {
			return err
		}
		switch state {
		case spgRedirect:
			p.spgSetNRedirection(p.spgNRedirection() + 1)
		case spgPlaceholder:
			p.spgSetNPlaceholder(p.spgNPlaceholder() + 1)
		}
	}
	return nil
}

// spgUpdateNodeLink is spgUpdateNodeLink: node nodeI of the inner tuple at
// off points to (blkno, to).
func (p page) spgUpdateNodeLink(off, nodeI int, blkno uint32, to int) error {
	t, err := p.item(off)
	if err != nil {
		return err
	}
	if len(t) < spgInnerHdrSize {
		return fmt.Errorf("%w: SP-GiST inner tuple %d of %d bytes", errPage, off, len(t))
	}
	w := binary.LittleEndian.Uint32(t)
	nNodes, prefix := int(w>>3)&0x1FFF, int(w>>16)
	o := spgInnerHdrSize + prefix
	for i := 0; i < nNodes; i++ {
		if o+8 > len(t) {
			break
		}
		if i == nodeI {
			setDownlink(t[o:], blkno)
			binary.LittleEndian.PutUint16(t[o+4:], uint16(to))
			return nil
		}
		n := indexTupleSize(t[o:])
		if n == 0 {
			break
		}
		o += n
	}
	return fmt.Errorf("%w: no node %d in SP-GiST inner tuple %d", errPage, nodeI, off)
}

// spgState is spgxlogState: the xid a redirect carries, and whether the
// index was being built (then moved tuples leave placeholders).
type spgState struct {
	xid     uint32
	isBuild bool
}

func spgStateAt(m []byte, o int) spgState {
	return spgState{binary.LittleEndian.Uint32(m[o:]), m[o+4] != 0}
}

// spgOffsets reads n offset numbers at *o in m and advances *o.
func spgOffsets(m []byte, o *int, n int) ([]int, error) {
	if len(m) < *o+2*n {
		return nil, errShort
	}
	out := offsets(m[*o : *o+2*n])
	*o += 2 * n
	return out, nil
}

// spgBlockNumber is the block number of the record's block reference id.
func spgBlockNumber(r *wal.Record, id uint8) (uint32, error) {
	b := r.Block(id)
	if b == nil {
		return 0, fmt.Errorf("%w: %s without block %d", errRecord, RecordName(r), id)
	}
	return b.Page.Block, nil
}

func redoSPGist(r *wal.Record, blk *wal.BlockRef, p page) error {
	var touched bool
	var err error
	switch r.RmInfo() {
	case spgAddLeaf:
		touched, err = spgRedoAddLeaf(r, blk, p)
	case spgMoveLeafs:
		touched, err = spgRedoMoveLeafs(r, blk, p)
	case spgAddNode:
		touched, err = spgRedoAddNode(r, blk, p)
	case spgSplitTuple:
		touched, err = spgRedoSplitTuple(r, blk, p)
	case spgPickSplit:
		touched, err = spgRedoPickSplit(r, blk, p)
	case spgVacuumLeaf:
		touched, err = true, spgRedoVacuumLeaf(r, p)
	case spgVacuumRoot:
		touched, err = true, spgRedoVacuumRoot(r, p)
	case spgVacuumRedirect:
		touched, err = true, spgRedoVacuumRedirect(r, p)
	default:
		return unsupported(r)
	}
	if err != nil || !touched {
		return err
	}
	p.setLSN(r.EndLSN)
	return nil
}

// The functions below redo one block reference of a record and report
// whether Postgres' redo changes that block (then its LSN is set); a block
// it does not read is left alone.

// spgRedoAddLeaf: block 0 gets the leaf tuple, block 1 (if any) holds the
// parent whose downlink now points to it.
func spgRedoAddLeaf(r *wal.Record, blk *wal.BlockRef, p page) (bool, error) {
	m := r.MainData
	if err := needMain(r, 10); err != nil {
		return false, err
	}
	newPage, nulls := m[0] != 0, m[1] != 0
	offLeaf := int(binary.LittleEndian.Uint16(m[2:]))
	offHead := int(binary.LittleEndian.Uint16(m[4:]))
	offParent := int(binary.LittleEndian.Uint16(m[6:]))
	nodeI := int(binary.LittleEndian.Uint16(m[8:]))
	tup, err := spgLeafTuple(m[10:])
	if err != nil {
		return false, err
	}
	switch blk.ID {
	case 0:
		if newPage {
			p.spgInit(spgLeafFlags(nulls))
		}
		if offLeaf == offHead {
			// A DEAD tuple is replaced.
			return true, p.spgReplace(tup, offLeaf)
		}
		if err := p.spgAddOrReplace(tup, offLeaf); err != nil {
			return false, err
		}
		if offHead != 0 {
			// The chain's head now links to the new tuple, which took
			// over the head's old link.
			head, err := p.item(offHead)
			if err != nil {
				return false, err
			}
			if len(head) < 6 {
				return false, fmt.Errorf("%w: SP-GiST chain head %d of %d bytes", errPage, offHead, len(head))
			}
			spgSetNextOffset(head, offLeaf)
		}
		return true, nil
	case 1:
		if offParent == 0 {
			return false, nil
		}
		leaf, err := spgBlockNumber(r, 0)
		if err != nil {
			return false, err
		}
		return true, p.spgUpdateNodeLink(offParent, nodeI, leaf, offLeaf)
	}
	return false, nil
}

// spgSetNextOffset is SGLT_SET_NEXTOFFSET: the low 14 bits of t_info.
func spgSetNextOffset(t []byte, off int) {
	info := binary.LittleEndian.Uint16(t[4:])
	binary.LittleEndian.PutUint16(t[4:], info&0xC000|uint16(off)&0x3FFF)
}

// spgRedoMoveLeafs: block 1 gets the moved tuples (and the new one), block
// 0 loses them (the first listed replaced by a redirect to the last tuple
// added, the rest by placeholders), block 2's downlink points to that
// tuple.
func spgRedoMoveLeafs(r *wal.Record, blk *wal.BlockRef, p page) (bool, error) {
	m := r.MainData
	if err := needMain(r, 20); err != nil {
		return false, err
	}
	nMoves := int(binary.LittleEndian.Uint16(m))
	newPage, replaceDead, nulls := m[2] != 0, m[3] != 0, m[4] != 0
	offParent := int(binary.LittleEndian.Uint16(m[6:]))
	nodeI := int(binary.LittleEndian.Uint16(m[8:]))
	st := spgStateAt(m, 12)
	// A replaced DEAD tuple is not copied: only the new tuple is added.
	nInsert := nMoves + 1
	if replaceDead {
		nInsert = 1
	}
	o := 20
	toDelete, err := spgOffsets(m, &o, nMoves)
	if err != nil {
		return false, err
	}
	toInsert, err := spgOffsets(m, &o, nInsert)
	if err != nil {
		return false, err
	}
	dst, err := spgBlockNumber(r, 1)
	if err != nil {
		return false, err
	}
	last := toInsert[nInsert-1]
	switch blk.ID {
	case 1:
		if newPage {
			p.spgInit(spgLeafFlags(nulls))
		}
		d := m[o:]
		for _, to := range toInsert {
			tup, err := spgLeafTuple(d)
			if err != nil {
				return false, err
			}
			if err := p.spgAddOrReplace(tup, to); err != nil {
				return false, err
			}
			d = d[len(tup):]
		}
		return true, nil
	case 0:
		first := spgRedirect
		if st.isBuild {
			first = spgPlaceholder
		}
		return true, p.spgMultiDelete(toDelete, first, spgPlaceholder, dst, last, st.xid)
	case 2:
		return true, p.spgUpdateNodeLink(offParent, nodeI, dst, last)
	}
	return false, nil
}

// spgRedoAddNode: the inner tuple at block 0 grows a node. If it still
// fits it is replaced in place (no block 1); otherwise it moves to block 1
// and leaves a redirect (a placeholder during a build), and the parent's
// downlink, on the block parentBlk names (0, 1 or 2), follows it.
func spgRedoAddNode(r *wal.Record, blk *wal.BlockRef, p page) (bool, error) {
	m := r.MainData
	if err := needMain(r, 20); err != nil {
		return false, err
	}
	off := int(binary.LittleEndian.Uint16(m))
	offNew := int(binary.LittleEndian.Uint16(m[2:]))
	newPage, parentBlk := m[4] != 0, int(int8(m[5]))
	offParent := int(binary.LittleEndian.Uint16(m[6:]))
	nodeI := int(binary.LittleEndian.Uint16(m[8:]))
	st := spgStateAt(m, 12)
	tup, err := spgInnerTuple(m[20:])
	if err != nil {
		return false, err
	}
	if r.Block(1) == nil {
		if blk.ID != 0 {
			return false, nil
		}
		return true, p.spgReplace(tup, off)
	}
	blkNew, err := spgBlockNumber(r, 1)
	if err != nil {
		return false, err
	}
	switch blk.ID {
	case 1:
		if newPage {
			p.spgInit(0) // never a nulls page
		}
		if err := p.spgAddOrReplace(tup, offNew); err != nil {
			return false, err
		}
	case 0:
		state := spgRedirect
		if st.isBuild {
			state = spgPlaceholder
		}
		if err := p.spgReplace(spgDeadTuple(state, blkNew, offNew, st.xid), off); err != nil {
			return false, err
		}
		if st.isBuild {
			p.spgSetNPlaceholder(p.spgNPlaceholder() + 1)
		} else {
			p.spgSetNRedirection(p.spgNRedirection() + 1)
		}
	case 2:
		if parentBlk != 2 {
			return false, nil
		}
	default:
		return false, nil
	}
	if int(blk.ID) == parentBlk {
		if err := p.spgUpdateNodeLink(offParent, nodeI, blkNew, offNew); err != nil {
			return false, err
		}
	}
	return true, nil
}

// spgRedoSplitTuple: block 0's inner tuple is replaced by the prefix
// tuple; the postfix tuple goes to block 1, or to block 0 too.
func spgRedoSplitTuple(r *wal.Record, blk *wal.BlockRef, p page) (bool, error) {
	m := r.MainData
	if err := needMain(r, 6); err != nil {
		return false, err
	}
	offPrefix := int(binary.LittleEndian.Uint16(m))
	offPostfix := int(binary.LittleEndian.Uint16(m[2:]))
	newPage, same := m[4] != 0, m[5] != 0
	prefix, err := spgInnerTuple(m[6:])
	if err != nil {
		return false, err
	}
	postfix, err := spgInnerTuple(m[6+len(prefix):])
	if err != nil {
		return false, err
	}
	switch blk.ID {
	case 1:
		if same {
			return false, nil
		}
		if newPage {
			p.spgInit(0) // never a nulls page
		}
		return true, p.spgAddOrReplace(postfix, offPostfix)
	case 0:
		if err := p.spgReplace(prefix, offPrefix); err != nil {
			return false, err
		}
		if same {
			return true, p.spgAddOrReplace(postfix, offPostfix)
		}
		return true, nil
	}
	return false, nil
}

// spgRedoPickSplit: a leaf page's tuples are split between itself (block
// 0, absent in a root split) and a new leaf page (block 1), under a new
// inner tuple (block 2, the root in a root split); the parent (block 3, or
// block 2 itself) points to the inner tuple.
func spgRedoPickSplit(r *wal.Record, blk *wal.BlockRef, p page) (bool, error) {
	m := r.MainData
	if err := needMain(r, 28); err != nil {
		return false, err
	}
	rootSplit := m[0] != 0
	nDelete := int(binary.LittleEndian.Uint16(m[2:]))
	nInsert := int(binary.LittleEndian.Uint16(m[4:]))
	initSrc, initDest := m[6] != 0, m[7] != 0
	offInner := int(binary.LittleEndian.Uint16(m[8:]))
	initInner, nulls, innerIsParent := m[10] != 0, m[11] != 0, m[12] != 0
	offParent := int(binary.LittleEndian.Uint16(m[14:]))
	nodeI := int(binary.LittleEndian.Uint16(m[16:]))
	st := spgStateAt(m, 20)
	o := 28
	toDelete, err := spgOffsets(m, &o, nDelete)
	if err != nil {
		return false, err
	}
	toInsert, err := spgOffsets(m, &o, nInsert)
	if err != nil {
		return false, err
	}
	if len(m) < o+nInsert {
		return false, errShort
	}
	selects := m[o : o+nInsert] // per leaf tuple: 0 the source, else the destination
	o += nInsert
	inner, err := spgInnerTuple(m[o:])
	if err != nil {
		return false, err
	}
	leaves := m[o+len(inner):]
	blkInner, err := spgBlockNumber(r, 2)
	if err != nil {
		return false, err
	}
	switch blk.ID {
	case 0:
		switch {
		case rootSplit:
			return false, nil
		case initSrc:
			p.spgInit(spgLeafFlags(nulls))
		case st.isBuild:
			err = p.spgMultiDelete(toDelete, spgPlaceholder, spgPlaceholder, invalidBlock, 0, st.xid)
		default:
			err = p.spgMultiDelete(toDelete, spgRedirect, spgPlaceholder, blkInner, offInner, st.xid)
		}
		if err != nil {
			return false, err
		}
		return true, p.spgAddLeaves(leaves, toInsert, selects, false)
	case 1:
		if initDest {
			p.spgInit(spgLeafFlags(nulls))
		}
		return true, p.spgAddLeaves(leaves, toInsert, selects, true)
	case 2:
		if initInner {
			p.spgInit(spgNullsFlag(nulls))
		}
		if err := p.spgAddOrReplace(inner, offInner); err != nil {
			return false, err
		}
		if innerIsParent {
			return true, p.spgUpdateNodeLink(offParent, nodeI, blkInner, offInner)
		}
		return true, nil
	case 3:
		return true, p.spgUpdateNodeLink(offParent, nodeI, blkInner, offInner)
	}
	return false, nil
}

// spgAddLeaves adds the PICKSPLIT leaf tuples whose selector names this
// page (dest: the destination page, else the source) at their offsets.
func (p page) spgAddLeaves(d []byte, to []int, selects []byte, dest bool) error {
	for i, off := range to {
		tup, err := spgLeafTuple(d)
		if err != nil {
			return err
		}
		d = d[len(tup):]
		if (selects[i] != 0) != dest {
			continue
		}
		if err := p.spgAddOrReplace(tup, off); err != nil {
			return err
		}
	}
	return nil
}

// spgRedoVacuumLeaf: on a leaf page, tuples become dead or placeholders,
// live tuples move down into earlier slots (their line pointers swapped,
// the old slot becoming a placeholder), and chain links are rewritten.
func spgRedoVacuumLeaf(r *wal.Record, p page) error {
	m := r.MainData
	if err := needMain(r, 16); err != nil {
		return err
	}
	nDead := int(binary.LittleEndian.Uint16(m))
	nPlaceholder := int(binary.LittleEndian.Uint16(m[2:]))
	nMove := int(binary.LittleEndian.Uint16(m[4:]))
	nChain := int(binary.LittleEndian.Uint16(m[6:]))
	o := 16
	var lists [6][]int
	for i, n := range []int{nDead, nPlaceholder, nMove, nMove, nChain, nChain} {
		var err error
		if lists[i], err = spgOffsets(m, &o, n); err != nil {
			return err
		}
	}
	toDead, toPlaceholder, moveSrc, moveDest, chainSrc, chainDest := lists[0], lists[1], lists[2], lists[3], lists[4], lists[5]
	if err := p.spgMultiDelete(toDead, spgDead, spgDead, invalidBlock, 0, 0); err != nil {
		return err
	}
	if err := p.spgMultiDelete(toPlaceholder, spgPlaceholder, spgPlaceholder, invalidBlock, 0, 0); err != nil {
		return err
	}
	for i := range moveSrc {
		s, d := moveSrc[i], moveDest[i]
		if s < 1 || d < 1 || s > p.maxOff() || d > p.maxOff() {
			return fmt.Errorf("%w: SP-GiST move %d -> %d of %d items", errPage, s, d, p.maxOff())
		}
		is, id := p.itemID(s), p.itemID(d)
		p.setItemID(s, id)
		p.setItemID(d, is)
	}
	if err := p.spgMultiDelete(moveSrc, spgPlaceholder, spgPlaceholder, invalidBlock, 0, 0); err != nil {
		return err
	}
	for i := range chainSrc {
		t, err := p.item(chainSrc[i])
		if err != nil {
			return err
		}
		if len(t) < 6 {
			return fmt.Errorf("%w: SP-GiST leaf tuple %d of %d bytes", errPage, chainSrc[i], len(t))
		}
		spgSetNextOffset(t, chainDest[i])
	}
	return nil
}

// spgRedoVacuumRoot: tuples are deleted from a root page that is a leaf.
func spgRedoVacuumRoot(r *wal.Record, p page) error {
	m := r.MainData
	if err := needMain(r, 12); err != nil {
		return err
	}
	o := 12
	toDelete, err := spgOffsets(m, &o, int(binary.LittleEndian.Uint16(m)))
	if err != nil {
		return err
	}
	return p.indexMultiDelete(toDelete)
}

// spgRedoVacuumRedirect: redirects old enough become placeholders (their
// xid kept, their pointer invalid), and the placeholders from
// firstPlaceholder to the end of the page are removed.
func spgRedoVacuumRedirect(r *wal.Record, p page) error {
	m := r.MainData
	if err := needMain(r, 8); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint16(m))
	firstPlaceholder := int(binary.LittleEndian.Uint16(m[2:]))
	o := 8
	toPlaceholder, err := spgOffsets(m, &o, n)
	if err != nil {
		return err
	}
	for _, off := range toPlaceholder {
		t, err := p.item(off)
		if err != nil {
			return err
		}
		if len(t) < 12 {
			return fmt.Errorf("%w: SP-GiST redirect %d of %d bytes", errPage, off, len(t))
		}
		t[0] = t[0]&^3 | spgPlaceholder
		setDownlink(t[6:], invalidBlock)
		binary.LittleEndian.PutUint16(t[10:], 0)
	}
	p.spgSetNRedirection(p.spgNRedirection() - uint16(n))
	p.spgSetNPlaceholder(p.spgNPlaceholder() + uint16(n))
	if firstPlaceholder != 0 {
		var toDelete []int
		for off := firstPlaceholder; off <= p.maxOff(); off++ {
			toDelete = append(toDelete, off)
		}
		p.spgSetNPlaceholder(p.spgNPlaceholder() - uint16(len(toDelete)))
		if err := p.indexMultiDelete(toDelete); err != nil {
			return err
		}
	}
	return nil
}

// maskSPGist is spg_mask: the LSN, the hint bits, and the unused space
// when pd_lower looks set.
func maskSPGist(p page) {
	maskCommon(p)
}
