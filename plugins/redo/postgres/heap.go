package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// Heap tuple header layout (htup_details.h).
const (
	htupSize         = 23 // SizeofHeapTupleHeader
	heapHeaderSize   = 5  // SizeOfHeapHeader (xl_heap_header)
	tXmin            = 0
	tXmax            = 4
	tField3          = 8
	tCtid            = 12
	tInfomask2       = 18
	tInfomask        = 20
	tHoff            = 22
	heapXmaxKeyshr   = 0x0010
	heapComboCID     = 0x0020
	heapXmaxExcl     = 0x0040
	heapXmaxLockOnly = 0x0080
	heapXminFrozen   = 0x0300
	heapXmaxCommit   = 0x0400
	heapXmaxInvalid  = 0x0800
	heapXmaxIsMulti  = 0x1000
	heapMoved        = 0xC000
	heapXmaxBits     = 0x1CD0
	heapXactMask     = 0xFFF0
	heapLockMask     = 0x0050
	heapKeysUpdated  = 0x2000
	heapHotUpdated   = 0x4000

	heapInitPage = 0x80
)

func setCtid(t []byte, blk uint32, off uint16) {
	binary.LittleEndian.PutUint16(t[tCtid:], uint16(blk>>16))
	binary.LittleEndian.PutUint16(t[tCtid+2:], uint16(blk))
	binary.LittleEndian.PutUint16(t[tCtid+4:], off)
}

func tupU16(t []byte, off int) uint16      { return binary.LittleEndian.Uint16(t[off:]) }
func tupPut16(t []byte, off int, v uint16) { binary.LittleEndian.PutUint16(t[off:], v) }
func tupPut32(t []byte, off int, v uint32) { binary.LittleEndian.PutUint32(t[off:], v) }

func fixInfomask(t []byte, bits uint8) {
	im, im2 := tupU16(t, tInfomask), tupU16(t, tInfomask2)
	im &^= heapXmaxIsMulti | heapXmaxLockOnly | heapXmaxKeyshr | heapXmaxExcl
	im2 &^= heapKeysUpdated
	if bits&0x01 != 0 {
		im |= heapXmaxIsMulti
	}
	if bits&0x02 != 0 {
		im |= heapXmaxLockOnly
	}
	if bits&0x04 != 0 {
		im |= heapXmaxExcl
	}
	if bits&0x08 != 0 {
		im |= heapXmaxKeyshr
	}
	if bits&0x10 != 0 {
		im2 |= heapKeysUpdated
	}
	tupPut16(t, tInfomask, im)
	tupPut16(t, tInfomask2, im2)
}

// clearXmaxBits is the common start of delete/update/lock redo.
func clearXmaxBits(t []byte) {
	tupPut16(t, tInfomask, tupU16(t, tInfomask)&^(heapXmaxBits|heapMoved))
	tupPut16(t, tInfomask2, tupU16(t, tInfomask2)&^heapKeysUpdated)
}

func setCmaxFirst(t []byte) {
	tupPut32(t, tField3, 0)
	tupPut16(t, tInfomask, tupU16(t, tInfomask)&^heapComboCID)
}

func (p page) normalTuple(off int) ([]byte, error) {
	if off < 1 || off > p.maxOff() || lpFlags(p.itemID(off)) != lpNormal {
		return nil, fmt.Errorf("%w: no normal tuple at offset %d", errPage, off)
	}
	return p.item(off)
}

func needMain(r *wal.Record, n int) error {
	if len(r.MainData) < n {
		return fmt.Errorf("%w: main data of %d bytes, want %d", errRecord, len(r.MainData), n)
	}
	return nil
}

// addHeapTuple adds, at offset off, a heap tuple built from an
// xl_heap_header-style header and the bytes after the fixed tuple header
// (body, then tail), with xmin, cmin 0 and the given ctid, as heap redo
// does; it returns the tuple in the page.
func (p page) addHeapTuple(off int, infomask2, infomask uint16, hoff uint8, xmin uint32, blk uint32, body, tail []byte) ([]byte, error) {
	t, err := p.reserveItem(htupSize+len(body)+len(tail), off, true, true)
	if err != nil {
		return nil, err
	}
	clear(t[:htupSize])
	copy(t[htupSize:], body)
	copy(t[htupSize+len(body):], tail)
	tupPut16(t, tInfomask2, infomask2)
	tupPut16(t, tInfomask, infomask)
	t[tHoff] = hoff
	tupPut32(t, tXmin, xmin)
	setCtid(t, blk, uint16(off))
	return t, nil
}

func redoHeap(r *wal.Record, blk *wal.BlockRef, p page) error {
	info := r.RmInfo()
	switch info & 0x70 {
	case 0x00: // INSERT
		if err := needMain(r, 3); err != nil {
			return err
		}
		off := binary.LittleEndian.Uint16(r.MainData)
		flags := r.MainData[2]
		if info&heapInitPage != 0 {
			p.init(0)
		}
		d := blk.Data
		if len(d) < heapHeaderSize {
			return fmt.Errorf("%w: heap insert without tuple", errRecord)
		}
		if _, err := p.addHeapTuple(int(off), binary.LittleEndian.Uint16(d), binary.LittleEndian.Uint16(d[2:]), d[4], r.XID, blk.Page.Block, d[heapHeaderSize:], nil); err != nil {
			return err
		}
		if flags&0x01 != 0 {
			p.setFlags(p.flags() &^ pdAllVisible)
		}
	case 0x10: // DELETE
		if err := needMain(r, 8); err != nil {
			return err
		}
		m := r.MainData
		xmax, off, bits, flags := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]), m[6], m[7]
		t, err := p.normalTuple(int(off))
		if err != nil {
			return err
		}
		clearXmaxBits(t)
		tupPut16(t, tInfomask2, tupU16(t, tInfomask2)&^heapHotUpdated)
		fixInfomask(t, bits)
		if flags&0x08 == 0 {
			tupPut32(t, tXmax, xmax)
		} else {
			tupPut32(t, tXmin, 0)
		}
		setCmaxFirst(t)
		p.setPrunable(r.XID)
		if flags&0x01 != 0 {
			p.setFlags(p.flags() &^ pdAllVisible)
		}
		if flags&0x10 != 0 {
			setCtid(t, 0xFFFFFFFF, 0xfffd)
		} else {
			setCtid(t, blk.Page.Block, off)
		}
	case 0x20, 0x40: // UPDATE, HOT_UPDATE
		return redoHeapUpdate(r, blk, p, info&0x70 == 0x40)
	case 0x50: // CONFIRM
		if err := needMain(r, 2); err != nil {
			return err
		}
		off := binary.LittleEndian.Uint16(r.MainData)
		t, err := p.normalTuple(int(off))
		if err != nil {
			return err
		}
		setCtid(t, blk.Page.Block, off)
	case 0x60: // LOCK
		if err := needMain(r, 8); err != nil {
			return err
		}
		m := r.MainData
		xid, off, bits := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]), m[6]
		t, err := p.normalTuple(int(off))
		if err != nil {
			return err
		}
		clearXmaxBits(t)
		fixInfomask(t, bits)
		im := tupU16(t, tInfomask)
		if im&heapXmaxLockOnly != 0 || im&(heapXmaxIsMulti|heapLockMask) == heapXmaxExcl {
			tupPut16(t, tInfomask2, tupU16(t, tInfomask2)&^heapHotUpdated)
			setCtid(t, blk.Page.Block, off)
		}
		tupPut32(t, tXmax, xid)
		setCmaxFirst(t)
	case 0x30: // TRUNCATE: for logical decoding, touches no page
		return nil
	case 0x70: // INPLACE
		if err := needMain(r, 2); err != nil {
			return err
		}
		off := binary.LittleEndian.Uint16(r.MainData)
		t, err := p.normalTuple(int(off))
		if err != nil {
			return err
		}
		hoff := int(t[tHoff])
		if len(t)-hoff != len(blk.Data) {
			return fmt.Errorf("%w: inplace update changes tuple length", errRecord)
		}
		copy(t[hoff:], blk.Data)
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

func redoHeapUpdate(r *wal.Record, blk *wal.BlockRef, p page, hot bool) error {
	if err := needMain(r, 14); err != nil {
		return err
	}
	m := r.MainData
	oldXmax, oldOff, oldBits, flags := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]), m[6], m[7]
	newXmax, newOff := binary.LittleEndian.Uint32(m[8:]), binary.LittleEndian.Uint16(m[12:])
	newBlk := r.Block(0)
	if newBlk == nil {
		return fmt.Errorf("%w: update without block 0", errRecord)
	}
	oldBlkRef := r.Block(1)
	if oldBlkRef == nil {
		oldBlkRef = newBlk
	}
	newBlock := newBlk.Page.Block
	var oldTup []byte
	if blk == oldBlkRef {
		t, err := p.normalTuple(int(oldOff))
		if err != nil {
			return err
		}
		oldTup = t
		clearXmaxBits(t)
		if hot {
			tupPut16(t, tInfomask2, tupU16(t, tInfomask2)|heapHotUpdated)
		} else {
			tupPut16(t, tInfomask2, tupU16(t, tInfomask2)&^heapHotUpdated)
		}
		fixInfomask(t, oldBits)
		tupPut32(t, tXmax, oldXmax)
		setCmaxFirst(t)
		setCtid(t, newBlock, newOff)
		p.setPrunable(r.XID)
		if flags&0x01 != 0 {
			p.setFlags(p.flags() &^ pdAllVisible)
		}
		p.setLSN(r.EndLSN)
	}
	if blk != newBlk {
		return nil
	}
	if blk != oldBlkRef && r.RmInfo()&heapInitPage != 0 {
		p.init(0)
	}
	d := blk.Data
	var prefix, suffix int
	if flags&0x20 != 0 {
		if len(d) < 2 {
			return errShort
		}
		prefix = int(binary.LittleEndian.Uint16(d))
		d = d[2:]
	}
	if flags&0x40 != 0 {
		if len(d) < 2 {
			return errShort
		}
		suffix = int(binary.LittleEndian.Uint16(d))
		d = d[2:]
	}
	if len(d) < heapHeaderSize {
		return errShort
	}
	im2, im, hoff := binary.LittleEndian.Uint16(d), binary.LittleEndian.Uint16(d[2:]), d[4]
	d = d[heapHeaderSize:]
	if (prefix > 0 || suffix > 0) && oldTup == nil {
		return fmt.Errorf("%w: prefix/suffix compression across pages", errRecord)
	}
	body := make([]byte, 0, len(d)+prefix+suffix)
	if prefix > 0 {
		n := int(hoff) - htupSize
		if n < 0 || n > len(d) || int(oldTup[tHoff])+prefix > len(oldTup) {
			return errShort
		}
		body = append(body, d[:n]...)
		body = append(body, oldTup[int(oldTup[tHoff]):int(oldTup[tHoff])+prefix]...)
		body = append(body, d[n:]...)
	} else {
		body = append(body, d...)
	}
	if suffix > 0 {
		if suffix > len(oldTup) {
			return errShort
		}
		body = append(body, oldTup[len(oldTup)-suffix:]...)
	}
	t, err := p.addHeapTuple(int(newOff), im2, im, hoff, r.XID, newBlock, body, nil)
	if err != nil {
		return err
	}
	tupPut32(t, tXmax, newXmax)
	if flags&0x02 != 0 {
		p.setFlags(p.flags() &^ pdAllVisible)
	}
	p.setLSN(r.EndLSN)
	return nil
}

func redoHeap2(r *wal.Record, blk *wal.BlockRef, p page, hintsLogged bool) error {
	info := r.RmInfo()
	d := blk.Data
	switch info & 0x70 {
	case 0x10: // PRUNE
		if err := needMain(r, 8); err != nil {
			return err
		}
		nred, ndead := int(binary.LittleEndian.Uint16(r.MainData[4:])), int(binary.LittleEndian.Uint16(r.MainData[6:]))
		offs := offsets(d)
		if len(offs) < 2*nred+ndead {
			return errShort
		}
		maxOff := p.maxOff()
		for _, o := range offs {
			if o < 1 || o > maxOff {
				return fmt.Errorf("%w: prune offset %d beyond %d", errRecord, o, maxOff)
			}
		}
		for i := 0; i < nred; i++ {
			p.setRedirect(offs[2*i], offs[2*i+1])
		}
		for _, o := range offs[2*nred : 2*nred+ndead] {
			p.setDead(o)
		}
		for _, o := range offs[2*nred+ndead:] {
			p.setUnused(o)
		}
		if err := p.repairFragmentation(); err != nil {
			return err
		}
	case 0x20: // VACUUM
		if err := needMain(r, 2); err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint16(r.MainData))
		offs := offsets(d)
		if len(offs) < n {
			return errShort
		}
		for _, o := range offs[:n] {
			if o < 1 || o > p.maxOff() {
				return fmt.Errorf("%w: vacuum offset %d", errRecord, o)
			}
			p.setUnused(o)
		}
		p.truncateLinePointerArray()
	case 0x30: // FREEZE_PAGE
		if err := needMain(r, 6); err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint16(r.MainData[4:]))
		const sz = 12 // sizeof(xl_heap_freeze_tuple)
		if len(d) < n*sz {
			return errShort
		}
		for i := 0; i < n; i++ {
			e := d[i*sz:]
			t, err := p.normalTuple(int(binary.LittleEndian.Uint16(e[4:])))
			if err != nil {
				return err
			}
			tupPut32(t, tXmax, binary.LittleEndian.Uint32(e))
			if e[10]&0x02 != 0 {
				tupPut32(t, tField3, 2) // FrozenTransactionId as xvac
			}
			if e[10]&0x04 != 0 {
				tupPut32(t, tField3, 0)
			}
			tupPut16(t, tInfomask, binary.LittleEndian.Uint16(e[8:]))
			tupPut16(t, tInfomask2, binary.LittleEndian.Uint16(e[6:]))
		}
	case 0x40: // VISIBLE: block 0 is the VM page, block 1 the heap page
		if err := needMain(r, 5); err != nil {
			return err
		}
		if blk.ID == 1 {
			p.setFlags(p.flags() | pdAllVisible)
			if hintsLogged {
				p.setLSN(r.EndLSN)
			}
			return nil
		}
		if p.isNew() {
			p.init(0)
		}
		heap := r.Block(1)
		if heap == nil {
			return fmt.Errorf("%w: VISIBLE without heap block", errRecord)
		}
		vmFlags := r.MainData[4]
		if r.EndLSN > p.lsn() {
			hb := heap.Page.Block % heapBlocksPerVMPage
			byteOff, shift := pageHeaderSize+int(hb/4), (hb%4)*2
			if (p[byteOff]>>shift)&3 != vmFlags {
				p[byteOff] |= vmFlags << shift
				p.setLSN(r.EndLSN)
			}
		}
		return nil
	case 0x50: // MULTI_INSERT
		return redoMultiInsert(r, blk, p)
	case 0x60: // LOCK_UPDATED
		if err := needMain(r, 8); err != nil {
			return err
		}
		m := r.MainData
		xmax, off, bits := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]), m[6]
		t, err := p.normalTuple(int(off))
		if err != nil {
			return err
		}
		clearXmaxBits(t)
		fixInfomask(t, bits)
		tupPut32(t, tXmax, xmax)
	case 0x70, 0x00: // NEW_CID, REWRITE: logical decoding only, no pages
		return nil
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

const heapBlocksPerVMPage = (8192 - pageHeaderSize) * 4

func offsets(d []byte) []int {
	out := make([]int, len(d)/2)
	for i := range out {
		out[i] = int(binary.LittleEndian.Uint16(d[2*i:]))
	}
	return out
}

func redoMultiInsert(r *wal.Record, blk *wal.BlockRef, p page) error {
	if err := needMain(r, 4); err != nil {
		return err
	}
	flags := r.MainData[0]
	n := int(binary.LittleEndian.Uint16(r.MainData[2:]))
	isInit := r.RmInfo()&heapInitPage != 0
	if !isInit && len(r.MainData) < 4+2*n {
		return errShort
	}
	if isInit {
		p.init(0)
	}
	d := blk.Data
	pos := 0
	for i := 0; i < n; i++ {
		off := i + 1
		if !isInit {
			off = int(binary.LittleEndian.Uint16(r.MainData[4+2*i:]))
		}
		pos = (pos + 1) &^ 1 // SHORTALIGN
		if pos+7 > len(d) {
			return errShort
		}
		dl := int(binary.LittleEndian.Uint16(d[pos:]))
		im2, im, hoff := binary.LittleEndian.Uint16(d[pos+2:]), binary.LittleEndian.Uint16(d[pos+4:]), d[pos+6]
		pos += 7
		if pos+dl > len(d) {
			return errShort
		}
		if _, err := p.addHeapTuple(off, im2, im, hoff, r.XID, blk.Page.Block, d[pos:pos+dl], nil); err != nil {
			return err
		}
		pos += dl
	}
	if pos != len(d) {
		return fmt.Errorf("%w: multi-insert data has %d extra bytes", errRecord, len(d)-pos)
	}
	p.setLSN(r.EndLSN)
	if flags&0x01 != 0 {
		p.setFlags(p.flags() &^ pdAllVisible)
	}
	if flags&0x20 != 0 {
		p.setFlags(p.flags() | pdAllVisible)
	}
	return nil
}
