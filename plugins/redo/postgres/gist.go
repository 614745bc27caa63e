package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// GiST redo: gistxlog.c. Every GiST page has a 16-byte special space
// (GISTPageOpaqueData: the NSN as a page LSN, rightlink, flags, page id).
const (
	gistPageUpdate = 0x00
	gistDelete     = 0x10
	gistPageReuse  = 0x20
	gistPageSplit  = 0x30
	gistPageDelete = 0x60
	gistAssignLSN  = 0x70

	gistOpaqueSize  = 16
	gistPageID      = 0xFF81
	gistLeaf        = 1 << 0
	gistDeleted     = 1 << 1
	gistTuplesDel   = 1 << 2
	gistFollowRight = 1 << 3
	gistHasGarbage  = 1 << 4
)

func (p page) gistFlags() uint16     { return p.u16(p.special() + 12) }
func (p page) gistSetFlags(f uint16) { p.put16(p.special()+12, f) }
func (p page) gistSetRight(b uint32) { p.put32(p.special()+8, b) }
func (p page) gistSetNSN(l uint64) {
	p.put32(p.special(), uint32(l>>32))
	p.put32(p.special()+4, uint32(l))
}

// gistInit is gistinitpage.
func (p page) gistInit(flags uint16) {
	p.init(gistOpaqueSize)
	p.gistSetRight(invalidBlock)
	p.gistSetFlags(flags)
	p.put16(p.special()+14, gistPageID)
}

// gistClearFollowRight is gistRedoClearFollowRight: the left half of a
// split got its downlink; it runs on a restored full page image too (the
// image was taken before the NSN was known).
func (p page) gistClearFollowRight(r *wal.Record) {
	p.gistSetNSN(uint64(r.EndLSN))
	p.gistSetFlags(p.gistFlags() &^ gistFollowRight)
	p.setLSN(r.EndLSN)
}

// gistAfterImage applies what Postgres' GiST redo applies after restoring
// a block's full page image (BLK_RESTORED): the follow-right clear of a
// split's left half.
func gistAfterImage(r *wal.Record, blk *wal.BlockRef, p page) {
	switch {
	case r.RmInfo() == gistPageUpdate && blk.ID == 1, r.RmInfo() == gistPageSplit && blk.ID == 0:
		p.gistClearFollowRight(r)
	}
}

// addIndexTuples adds the index tuples packed in d (IndexTupleSize each,
// unaligned in a record) from offset off on, and returns how many.
func (p page) addIndexTuples(d []byte, off int) (int, error) {
	n := 0
	for len(d) > 0 {
		if len(d) < 8 {
			return n, errShort
		}
		sz := indexTupleSize(d)
		if sz < 8 || sz > len(d) {
			return n, errShort
		}
		if err := p.addItem(d[:sz], off+n, false, false); err != nil {
			return n, err
		}
		d = d[sz:]
		n++
	}
	return n, nil
}

func redoGist(r *wal.Record, blk *wal.BlockRef, p page) error {
	m := r.MainData
	switch r.RmInfo() {
	case gistPageUpdate:
		if err := needMain(r, 4); err != nil {
			return err
		}
		if blk.ID == 1 {
			p.gistClearFollowRight(r)
			return nil
		}
		ndel, nins := int(binary.LittleEndian.Uint16(m)), int(binary.LittleEndian.Uint16(m[2:]))
		d := blk.Data
		switch {
		case ndel == 1 && nins == 1:
			if len(d) < 2+8 {
				return errShort
			}
			off := int(binary.LittleEndian.Uint16(d))
			sz := indexTupleSize(d[2:])
			if sz > len(d)-2 {
				return errShort
			}
			if err := p.indexTupleOverwrite(off, d[2:2+sz]); err != nil {
				return err
			}
			d = d[2+sz:]
		case ndel > 0:
			if len(d) < 2*ndel {
				return errShort
			}
			if err := p.indexMultiDelete(offsets(d[:2*ndel])); err != nil {
				return err
			}
			d = d[2*ndel:]
			if p.gistFlags()&gistLeaf != 0 {
				p.gistSetFlags(p.gistFlags() | gistTuplesDel)
			}
		}
		if len(d) > 0 {
			off := 1
			if p.lower() > pageHeaderSize { // !PageIsEmpty
				off = p.maxOff() + 1
			}
			if _, err := p.addIndexTuples(d, off); err != nil {
				return err
			}
		}
	case gistDelete:
		if err := needMain(r, 6); err != nil {
			return err
		}
		if len(m) > 6 {
			n := int(binary.LittleEndian.Uint16(m[4:]))
			if len(m) < 6+2*n {
				return errShort
			}
			if err := p.indexMultiDelete(offsets(m[6 : 6+2*n])); err != nil {
				return err
			}
		}
		p.gistSetFlags(p.gistFlags()&^gistHasGarbage | gistTuplesDel)
	case gistPageSplit:
		if err := needMain(r, 21); err != nil {
			return err
		}
		if blk.ID == 0 {
			p.gistClearFollowRight(r)
			return nil
		}
		rlink := binary.LittleEndian.Uint32(m)
		nsn := binary.LittleEndian.Uint64(m[8:]) // orignsn, an XLogRecPtr (not a page LSN's two halves)
		leaf, npage, follow := m[16] != 0, int(binary.LittleEndian.Uint16(m[18:])), m[20] != 0
		i := int(blk.ID) - 1
		if i >= npage {
			return fmt.Errorf("%w: GiST split block %d of %d pages", errRecord, blk.ID, npage)
		}
		rootSplit := false
		for j := 1; j <= int(blk.ID); j++ {
			if b := r.Block(uint8(j)); b != nil && b.Page.Block == 0 {
				rootSplit = true
			}
		}
		isRoot := blk.Page.Block == 0
		var flags uint16
		if leaf && !isRoot {
			flags = gistLeaf
		}
		p.gistInit(flags)
		if len(blk.Data) < 4 {
			return errShort
		}
		if _, err := p.addIndexTuples(blk.Data[4:], 1); err != nil {
			return err
		}
		if n := int(int32(binary.LittleEndian.Uint32(blk.Data))); n != p.maxOff() {
			return fmt.Errorf("%w: GiST split page with %d tuples, %d in the record", errRecord, p.maxOff(), n)
		}
		p.gistSetNSN(nsn)
		switch {
		case isRoot:
			p.gistSetRight(invalidBlock)
		case i < npage-1:
			next := r.Block(uint8(i + 2))
			if next == nil {
				return fmt.Errorf("%w: GiST split without block %d", errRecord, i+2)
			}
			p.gistSetRight(next.Page.Block)
		default:
			p.gistSetRight(rlink)
		}
		if !isRoot && i < npage-1 && !rootSplit && follow {
			p.gistSetFlags(p.gistFlags() | gistFollowRight)
		} else {
			p.gistSetFlags(p.gistFlags() &^ gistFollowRight)
		}
	case gistPageDelete:
		if err := needMain(r, 10); err != nil {
			return err
		}
		switch blk.ID {
		case 0: // GistPageSetDeleted
			p.gistSetFlags(p.gistFlags() | gistDeleted)
			p.setLower(pageHeaderSize + 8)
			copy(p[pageHeaderSize:], m[:8])
		case 1:
			if err := p.indexTupleDelete(int(binary.LittleEndian.Uint16(m[8:]))); err != nil {
				return err
			}
		}
	case gistPageReuse, gistAssignLSN:
		return nil // no page changes
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

// maskGist is gist_mask.
func maskGist(p page) {
	maskCommon(p)
	if !p.hasSpecial(gistOpaqueSize) {
		return
	}
	p.gistSetNSN(0)
	p.gistSetFlags(p.gistFlags() | gistFollowRight)
	if p.gistFlags()&gistLeaf != 0 {
		maskLPFlags(p)
	}
	p.gistSetFlags(p.gistFlags() &^ gistHasGarbage)
}
