package postgres

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// B-tree page layout (nbtree.h).
const (
	btOpaqueSize        = 16
	btpLeaf             = 0x0001
	btpRoot             = 0x0002
	btpDeleted          = 0x0004
	btpMeta             = 0x0008
	btpHalfDead         = 0x0010
	btpSplitEnd         = 0x0020
	btpHasGarbage       = 0x0040
	btpIncompleteSplit  = 0x0080
	btpHasFullXID       = 0x0100
	btreeMagic          = 0x053162
	indexSizeMask       = 0x1FFF
	indexAltTIDMask     = 0x2000
	btMetaSize          = 48
	btDeletedPageDataSz = 8
)

type btOpaque struct{ p page }

func (o btOpaque) base() int         { return o.p.special() }
func (o btOpaque) prev() uint32      { return o.p.u32(o.base()) }
func (o btOpaque) next() uint32      { return o.p.u32(o.base() + 4) }
func (o btOpaque) flags() uint16     { return o.p.u16(o.base() + 12) }
func (o btOpaque) setPrev(v uint32)  { o.p.put32(o.base(), v) }
func (o btOpaque) setNext(v uint32)  { o.p.put32(o.base()+4, v) }
func (o btOpaque) setLevel(v uint32) { o.p.put32(o.base()+8, v) }
func (o btOpaque) setFlags(v uint16) { o.p.put16(o.base()+12, v) }
func (o btOpaque) setCycle(v uint16) { o.p.put16(o.base()+14, v) }
func (p page) bt() btOpaque          { return btOpaque{p} }
func (p page) btInit()               { p.init(btOpaqueSize) }
func indexTupleSize(t []byte) int    { return int(binary.LittleEndian.Uint16(t[6:]) & indexSizeMask) }
func downlink(t []byte) uint32 {
	return uint32(binary.LittleEndian.Uint16(t))<<16 | uint32(binary.LittleEndian.Uint16(t[2:]))
}
func setDownlink(t []byte, b uint32) {
	binary.LittleEndian.PutUint16(t, uint16(b>>16))
	binary.LittleEndian.PutUint16(t[2:], uint16(b))
}

// restoreItems is _bt_restore_page: the data is a page's tuple area dump,
// lowest address (highest offset) first.
func (p page) restoreItems(d []byte) error {
	var items [][]byte
	for len(d) > 0 {
		if len(d) < 8 {
			return errShort
		}
		sz := maxAlign(indexTupleSize(d))
		if sz == 0 || sz > len(d) {
			return errShort
		}
		items = append(items, d[:sz])
		d = d[sz:]
	}
	n := len(items)
	for i := n - 1; i >= 0; i-- {
		if err := p.addItem(items[i], n-i, false, false); err != nil {
			return err
		}
	}
	return nil
}

// restoreMeta is _bt_restore_meta from xl_btree_metadata.
func restoreMeta(r *wal.Record, d []byte, p page) error {
	if len(d) < 25 {
		return errShort
	}
	p.btInit()
	m := pageHeaderSize
	p.put32(m, btreeMagic)
	for i := 0; i < 6; i++ { // version, root, level, fastroot, fastlevel, last_cleanup_num_delpages
		p.put32(m+4+4*i, binary.LittleEndian.Uint32(d[4*i:]))
	}
	binary.LittleEndian.PutUint64(p[m+32:], math.Float64bits(-1.0))
	p[m+40] = d[24]
	p.bt().setFlags(btpMeta)
	p.setLower(m + btMetaSize)
	p.setLSN(r.EndLSN)
	return nil
}

func clearIncompleteSplit(r *wal.Record, p page) error {
	o := p.bt()
	o.setFlags(o.flags() &^ btpIncompleteSplit)
	p.setLSN(r.EndLSN)
	return nil
}

func redoBtree(r *wal.Record, blk *wal.BlockRef, p page) error {
	info := r.RmInfo()
	m := r.MainData
	switch info {
	case 0x00, 0x10, 0x20, 0x50: // INSERT_LEAF, INSERT_UPPER, INSERT_META, INSERT_POST
		if err := needMain(r, 2); err != nil {
			return err
		}
		switch blk.ID {
		case 0:
			off := int(binary.LittleEndian.Uint16(m))
			item := blk.Data
			if info == 0x50 {
				if len(item) < 10 {
					return errShort
				}
				postingOff := int(binary.LittleEndian.Uint16(item))
				item = append([]byte(nil), item[2:]...)
				op, err := p.item(off - 1)
				if err != nil {
					return err
				}
				np, err := swapPosting(item, op, postingOff)
				if err != nil {
					return err
				}
				copy(op, np[:min(len(np), maxAlign(indexTupleSize(np)))])
			}
			if err := p.addItem(item, off, false, false); err != nil {
				return err
			}
			p.setLSN(r.EndLSN)
			return nil
		case 1:
			if info != 0x00 {
				return clearIncompleteSplit(r, p)
			}
		case 2:
			if info == 0x20 {
				return restoreMeta(r, blk.Data, p)
			}
		}
		return fmt.Errorf("%w: unexpected block %d", errRecord, blk.ID)
	case 0x30, 0x40: // SPLIT_L, SPLIT_R
		return redoBtreeSplit(r, blk, p, info == 0x30)
	case 0xC0, 0x70: // VACUUM, DELETE
		var ndel, nupd int
		if info == 0xC0 {
			if err := needMain(r, 4); err != nil {
				return err
			}
			ndel, nupd = int(binary.LittleEndian.Uint16(m)), int(binary.LittleEndian.Uint16(m[2:]))
		} else {
			if err := needMain(r, 8); err != nil {
				return err
			}
			ndel, nupd = int(binary.LittleEndian.Uint16(m[4:])), int(binary.LittleEndian.Uint16(m[6:]))
		}
		offs := offsets(blk.Data)
		if len(offs) < ndel {
			return errShort
		}
		if nupd > 0 {
			if err := applyPostingUpdates(p, blk.Data[2*ndel:], nupd); err != nil {
				return err
			}
		}
		if ndel > 0 {
			if err := p.indexMultiDelete(offs[:ndel]); err != nil {
				return err
			}
		}
		o := p.bt()
		o.setFlags(o.flags() &^ btpHasGarbage)
		p.setLSN(r.EndLSN)
		return nil
	case 0xB0: // MARK_PAGE_HALFDEAD
		if err := needMain(r, 20); err != nil {
			return err
		}
		if blk.ID == 1 {
			poff := int(binary.LittleEndian.Uint16(m))
			nt, err := p.item(poff + 1)
			if err != nil {
				return err
			}
			right := downlink(nt)
			t, err := p.item(poff)
			if err != nil {
				return err
			}
			setDownlink(t, right)
			if err := p.indexTupleDelete(poff + 1); err != nil {
				return err
			}
			p.setLSN(r.EndLSN)
			return nil
		}
		return halfDeadLeaf(r, p, binary.LittleEndian.Uint32(m[8:]), binary.LittleEndian.Uint32(m[12:]), binary.LittleEndian.Uint32(m[16:]))
	case 0x80, 0x90: // UNLINK_PAGE, UNLINK_PAGE_META
		if err := needMain(r, 36); err != nil {
			return err
		}
		left, right, level := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint32(m[4:]), binary.LittleEndian.Uint32(m[8:])
		switch blk.ID {
		case 0:
			p.btInit()
			o := p.bt()
			o.setPrev(left)
			o.setNext(right)
			o.setLevel(level)
			o.setFlags((o.flags() &^ btpHalfDead) | btpDeleted | btpHasFullXID)
			p.setLower(pageHeaderSize + btDeletedPageDataSz)
			p.setUpper(p.special())
			copy(p[pageHeaderSize:pageHeaderSize+8], m[16:24])
			if level == 0 {
				o.setFlags(o.flags() | btpLeaf)
			}
			o.setCycle(0)
		case 1:
			p.bt().setNext(right)
		case 2:
			p.bt().setPrev(left)
		case 3:
			return halfDeadLeaf(r, p, binary.LittleEndian.Uint32(m[24:]), binary.LittleEndian.Uint32(m[28:]), binary.LittleEndian.Uint32(m[32:]))
		case 4:
			return restoreMeta(r, blk.Data, p)
		}
		p.setLSN(r.EndLSN)
		return nil
	case 0xA0: // NEWROOT
		if err := needMain(r, 8); err != nil {
			return err
		}
		level := binary.LittleEndian.Uint32(m[4:])
		switch blk.ID {
		case 0:
			p.btInit()
			o := p.bt()
			flags := uint16(btpRoot)
			if level == 0 {
				flags |= btpLeaf
			}
			o.setFlags(flags)
			o.setLevel(level)
			if level > 0 {
				if err := p.restoreItems(blk.Data); err != nil {
					return err
				}
			}
			p.setLSN(r.EndLSN)
			return nil
		case 1:
			return clearIncompleteSplit(r, p)
		case 2:
			return restoreMeta(r, blk.Data, p)
		}
	case 0x60: // DEDUP
		if err := needMain(r, 2); err != nil {
			return err
		}
		if err := redoDedup(int(binary.LittleEndian.Uint16(m)), blk.Data, p); err != nil {
			return err
		}
		p.setLSN(r.EndLSN)
		return nil
	case 0xE0: // META_CLEANUP
		return restoreMeta(r, blk.Data, p)
	case 0xD0: // REUSE_PAGE touches no page
		return nil
	}
	return unsupported(r)
}

func halfDeadLeaf(r *wal.Record, p page, left, right, topParent uint32) error {
	p.btInit()
	o := p.bt()
	o.setPrev(left)
	o.setNext(right)
	o.setFlags(btpHalfDead | btpLeaf)
	var t [8]byte
	setDownlink(t[:], topParent)
	binary.LittleEndian.PutUint16(t[6:], 8|indexAltTIDMask)
	if err := p.addItem(t[:], 1, false, false); err != nil {
		return err
	}
	p.setLSN(r.EndLSN)
	return nil
}

func redoBtreeSplit(r *wal.Record, blk *wal.BlockRef, p page, newItemOnLeft bool) error {
	if err := needMain(r, 10); err != nil {
		return err
	}
	m := r.MainData
	level := binary.LittleEndian.Uint32(m)
	firstRight := int(binary.LittleEndian.Uint16(m[4:]))
	newItemOff := int(binary.LittleEndian.Uint16(m[6:]))
	postingOff := binary.LittleEndian.Uint16(m[8:])
	isLeaf := level == 0
	orig, right := r.Block(0), r.Block(1)
	if orig == nil || right == nil {
		return fmt.Errorf("%w: split without blocks 0 and 1", errRecord)
	}
	var sib uint32
	if s := r.Block(2); s != nil {
		sib = s.Page.Block
	}
	switch blk.ID {
	case 1:
		p.btInit()
		o := p.bt()
		o.setPrev(orig.Page.Block)
		o.setNext(sib)
		o.setLevel(level)
		if isLeaf {
			o.setFlags(btpLeaf)
		}
		if err := p.restoreItems(blk.Data); err != nil {
			return err
		}
		p.setLSN(r.EndLSN)
		return nil
	case 2:
		p.bt().setPrev(right.Page.Block)
		p.setLSN(r.EndLSN)
		return nil
	case 3:
		return clearIncompleteSplit(r, p)
	case 0:
	default:
		return fmt.Errorf("%w: unexpected block %d", errRecord, blk.ID)
	}
	d := blk.Data
	var newItem, nposting []byte
	replaceOff := -1
	if newItemOnLeft || postingOff != 0 {
		if len(d) < 8 {
			return errShort
		}
		sz := maxAlign(indexTupleSize(d))
		if sz > len(d) {
			return errShort
		}
		newItem, d = append([]byte(nil), d[:sz]...), d[sz:]
		if postingOff != 0 {
			replaceOff = newItemOff - 1
			op, err := p.item(replaceOff)
			if err != nil {
				return err
			}
			if nposting, err = swapPosting(newItem, op, int(postingOff)); err != nil {
				return err
			}
		}
	}
	if len(d) < 8 {
		return errShort
	}
	hsz := maxAlign(indexTupleSize(d))
	if hsz > len(d) {
		return errShort
	}
	hikey := d[:hsz]
	oo := p.bt()
	firstData := 2
	if oo.next() == 0 {
		firstData = 1
	}
	left := make(page, len(p))
	left.init(len(p) - p.special())
	copy(left[left.special():], p[p.special():])
	if err := left.addItem(hikey, 1, false, false); err != nil {
		return err
	}
	lo := 2
	off := firstData
	for ; off < firstRight; off++ {
		if off == replaceOff {
			if err := left.addItem(nposting[:maxAlign(indexTupleSize(nposting))], lo, false, false); err != nil {
				return err
			}
			lo++
			continue
		}
		if newItemOnLeft && off == newItemOff {
			if err := left.addItem(newItem, lo, false, false); err != nil {
				return err
			}
			lo++
		}
		it, err := p.item(off)
		if err != nil {
			return err
		}
		if err := left.addItem(it, lo, false, false); err != nil {
			return err
		}
		lo++
	}
	if newItemOnLeft && off == newItemOff {
		if err := left.addItem(newItem, lo, false, false); err != nil {
			return err
		}
	}
	copy(p, left)
	o := p.bt()
	flags := uint16(btpIncompleteSplit)
	if isLeaf {
		flags |= btpLeaf
	}
	o.setFlags(flags)
	o.setNext(right.Page.Block)
	o.setCycle(0)
	p.setLSN(r.EndLSN)
	return nil
}
