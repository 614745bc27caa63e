package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// BRIN (block range index) redo: brin_xlog.c. Every BRIN page has an
// 8-byte special space whose last uint16 is the page type and the one
// before it the flags.
const (
	brinOpMask        = 0x70
	brinInitPage      = 0x80
	brinCreateIndex   = 0x00
	brinInsert        = 0x10
	brinUpdate        = 0x20
	brinSamepage      = 0x30
	brinRevmapExtend  = 0x40
	brinDesummarize   = 0x50
	brinSpecialSize   = 8
	brinTypeMeta      = 0xF091
	brinTypeRevmap    = 0xF092
	brinTypeRegular   = 0xF093
	brinEvacuatePage  = 1
	brinMetaMagic     = 0xA8109CFA
	brinMetaSize      = 16 // BrinMetaPageData: magic, version, pagesPerRange, lastRevmapPage
	brinRevmapMaxItem = (8192 - pageHeaderSize - brinSpecialSize) / 6
)

func (p page) brinType() uint16    { return p.u16(p.special() + 6) }
func (p page) brinFlagsOff() int   { return p.special() + 4 }
func (p page) brinInit(typ uint16) { p.init(brinSpecialSize); p.put16(p.special()+6, typ) }
func (p page) brinMetaInit(ppr uint32, version uint16) {
	p.brinInit(brinTypeMeta)
	c := pageHeaderSize
	p.put32(c, brinMetaMagic)
	p.put32(c+4, uint32(version))
	p.put32(c+8, ppr)
	p.put32(c+12, 0) // lastRevmapPage: the first revmap page comes with the index
	p.setLower(c + brinMetaSize)
}

// brinSetRevmap is brinSetHeapBlockItemptr: the revmap entry of the range
// holding heapBlk points at (blk, off); off 0 makes it invalid.
func (p page) brinSetRevmap(ppr, heapBlk, blk uint32, off uint16) error {
	if ppr == 0 {
		return fmt.Errorf("%w: BRIN pagesPerRange 0", errRecord)
	}
	i := (heapBlk / ppr) % brinRevmapMaxItem
	o := pageHeaderSize + 6*int(i)
	if off == 0 {
		blk = 0xFFFFFFFF
	}
	p.put16(o, uint16(blk>>16))
	p.put16(o+2, uint16(blk))
	p.put16(o+4, off)
	return nil
}

// indexTupleDeleteNoCompact is PageIndexTupleDeleteNoCompact: the line
// pointer stays (unused) unless it is the last one.
func (p page) indexTupleDeleteNoCompact(off int) error {
	size, o, nline, err := p.deleteTarget(off)
	if err != nil {
		return err
	}
	up := p.upper()
	if off < nline {
		p.setUnused(off)
	} else {
		p.setLower(p.lower() - 4)
		nline--
	}
	if o > up {
		copy(p[up+size:], p[up:o])
	}
	p.setUpper(up + size)
	if p.lower() > pageHeaderSize { // !PageIsEmpty
		for i := 1; i <= nline; i++ {
			ii := p.itemID(i)
			if lpHasStorage(ii) && lpOff(ii) <= o {
				p.setItemID(i, makeLP(lpOff(ii)+size, lpFlags(ii), lpLen(ii)))
			}
		}
	}
	return nil
}

func redoBrin(r *wal.Record, blk *wal.BlockRef, p page) error {
	info := r.RmInfo()
	m := r.MainData
	switch info & brinOpMask {
	case brinCreateIndex:
		if err := needMain(r, 6); err != nil {
			return err
		}
		p.brinMetaInit(binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]))
	case brinInsert, brinUpdate:
		ins := m
		if info&brinOpMask == brinUpdate {
			if err := needMain(r, 14); err != nil {
				return err
			}
			if blk.ID == 2 { // the old tuple's page
				if err := p.indexTupleDeleteNoCompact(int(binary.LittleEndian.Uint16(m))); err != nil {
					return err
				}
				break
			}
			ins = m[4:]
		} else if err := needMain(r, 10); err != nil {
			return err
		}
		heapBlk := binary.LittleEndian.Uint32(ins)
		ppr := binary.LittleEndian.Uint32(ins[4:])
		off := binary.LittleEndian.Uint16(ins[8:])
		switch blk.ID {
		case 0: // the regular page the tuple goes to
			if info&brinInitPage != 0 {
				p.brinInit(brinTypeRegular)
			}
			if int(off) > p.maxOff()+1 {
				return fmt.Errorf("%w: BRIN insert at offset %d past %d", errRecord, off, p.maxOff())
			}
			if err := p.addItem(blk.Data, int(off), true, false); err != nil {
				return err
			}
		case 1: // the revmap page
			reg := r.Block(0)
			if reg == nil {
				return fmt.Errorf("%w: BRIN insert without block 0", errRecord)
			}
			if err := p.brinSetRevmap(ppr, heapBlk, reg.Page.Block, off); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: BRIN insert block %d", errRecord, blk.ID)
		}
	case brinSamepage:
		if err := needMain(r, 2); err != nil {
			return err
		}
		if err := p.indexTupleOverwrite(int(binary.LittleEndian.Uint16(m)), blk.Data); err != nil {
			return err
		}
	case brinRevmapExtend:
		if err := needMain(r, 4); err != nil {
			return err
		}
		switch blk.ID {
		case 0: // the metapage
			p.put32(pageHeaderSize+12, binary.LittleEndian.Uint32(m))
			p.setLower(pageHeaderSize + brinMetaSize)
		case 1: // the new revmap page (never an image)
			p.brinInit(brinTypeRevmap)
		default:
			return fmt.Errorf("%w: BRIN revmap extension block %d", errRecord, blk.ID)
		}
	case brinDesummarize:
		if err := needMain(r, 10); err != nil {
			return err
		}
		switch blk.ID {
		case 0: // the revmap page
			if err := p.brinSetRevmap(binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint32(m[4:]), 0, 0); err != nil {
				return err
			}
		case 1: // the regular page
			if err := p.indexTupleDeleteNoCompact(int(binary.LittleEndian.Uint16(m[8:]))); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: BRIN desummarize block %d", errRecord, blk.ID)
		}
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

// maskBrin is brin_mask.
func maskBrin(p page) {
	maskLSN(p)
	maskHints(p)
	if !p.hasSpecial(brinSpecialSize) {
		return
	}
	if t := p.brinType(); t == brinTypeRegular || (t == brinTypeMeta && p.lower() > pageHeaderSize) {
		maskUnused(p)
	}
	p.put16(p.brinFlagsOff(), p.u16(p.brinFlagsOff())&^brinEvacuatePage)
}
