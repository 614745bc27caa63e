package postgres

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// Hash index redo: hash_xlog.c. Every hash page has a 16-byte special
// space (HashPageOpaqueData: prevblkno, nextblkno, bucket, flag, page_id);
// the metapage (HashMetaPageData) and a bitmap page's bits start right
// after the page header.
const (
	hashInitMetaPage   = 0x00
	hashInitBitmapPage = 0x10
	hashInsert         = 0x20
	hashAddOvflPage    = 0x30
	hashSplitAllocate  = 0x40
	hashSplitPage      = 0x50
	hashSplitComplete  = 0x60
	hashMovePage       = 0x70
	hashSqueezePage    = 0x80
	hashDelete         = 0x90
	hashSplitCleanup   = 0xA0
	hashUpdateMeta     = 0xB0
	hashVacuumOnePage  = 0xC0

	hashOpaqueSize = 16
	hashPageID     = 0xFF80
	hashMagic      = 0x6440640
	hashVersion    = 4
	invalidBlock   = 0xFFFFFFFF

	lhUnusedPage        = 0
	lhOverflowPage      = 1 << 0
	lhBucketPage        = 1 << 1
	lhBitmapPage        = 1 << 2
	lhMetaPage          = 1 << 3
	lhNeedsSplitCleanup = 1 << 6
	lhPageHasDead       = 1 << 7
	lhPageType          = lhOverflowPage | lhBucketPage | lhBitmapPage | lhMetaPage

	// HashMetaPageData, from the page contents (page header end).
	hmNTuples     = 8
	hmFFactor     = 16
	hmBSize       = 18
	hmBMSize      = 20
	hmBMShift     = 22
	hmMaxBucket   = 24
	hmHighMask    = 28
	hmLowMask     = 32
	hmOvflPoint   = 36
	hmFirstFree   = 40
	hmNMaps       = 44
	hmProcID      = 48
	hmSpares      = 52
	hashMaxSplit  = (32-10)*4 + 10 // HASH_MAX_SPLITPOINTS
	hmMapp        = hmSpares + 4*hashMaxSplit
	hashMaxBitmap = 1024
	hashMetaSize  = (hmMapp + 4*hashMaxBitmap + 7) &^ 7 // sizeof: padded to the double's alignment
)

func (p page) hashOpaque() int { return p.special() }

// hashSetOpaque writes the special space.
func (p page) hashSetOpaque(prev, next, bucket uint32, flag uint16) {
	o := p.hashOpaque()
	p.put32(o, prev)
	p.put32(o+4, next)
	p.put32(o+8, bucket)
	p.put16(o+12, flag)
	p.put16(o+14, hashPageID)
}

func (p page) hashFlag() uint16          { return p.u16(p.hashOpaque() + 12) }
func (p page) hashSetFlag(f uint16)      { p.put16(p.hashOpaque()+12, f) }
func (p page) hashSetPrev(b uint32)      { p.put32(p.hashOpaque(), b) }
func (p page) hashSetNext(b uint32)      { p.put32(p.hashOpaque()+4, b) }
func (p page) meta(off int) uint32       { return p.u32(pageHeaderSize + off) }
func (p page) setMeta(off int, v uint32) { p.put32(pageHeaderSize+off, v) }
func (p page) metaNTuples() float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64(p[pageHeaderSize+hmNTuples:]))
}
func (p page) setMetaNTuples(v float64) {
	binary.LittleEndian.PutUint64(p[pageHeaderSize+hmNTuples:], math.Float64bits(v))
}

// hashSpareIndex is _hash_spareindex.
func hashSpareIndex(n uint32) uint32 {
	group := uint32(0)
	if n > 1 {
		group = uint32(bits.Len32(n - 1)) // pg_ceil_log2_32
	}
	if group < 10 {
		return group
	}
	return 10 + (group-10)<<2 + ((n-1)>>(group-3))&3
}

// hashTotalBuckets is _hash_get_totalbuckets.
func hashTotalBuckets(phase uint32) uint32 {
	if phase < 10 {
		return 1 << phase
	}
	group := 10 + (phase-10)>>2
	total := uint32(1) << (group - 1)
	return total + ((uint32(1)<<(group-1))>>2)*(((phase-10)&3)+1)
}

// hashInitMeta is _hash_init_metabuffer with initpage.
func (p page) hashInitMeta(numTuples float64, procID uint32, ffactor uint16) error {
	if ffactor == 0 {
		return fmt.Errorf("%w: hash fill factor 0", errRecord)
	}
	var nb uint32
	switch d := numTuples / float64(ffactor); {
	case d <= 2:
		nb = 2
	case d >= float64(0x40000000):
		nb = 0x40000000
	default:
		nb = hashTotalBuckets(hashSpareIndex(uint32(d)))
	}
	spare := hashSpareIndex(nb)
	p.init(hashOpaqueSize)
	p.hashSetOpaque(invalidBlock, invalidBlock, invalidBlock, lhMetaPage)
	p.setMeta(0, hashMagic)
	p.setMeta(4, hashVersion)
	p.setMetaNTuples(0)
	bsize := pg8kMaxBitmapSize
	lshift := uint(bits.Len32(uint32(bsize)) - 1) // pg_leftmost_one_pos32
	binary.LittleEndian.PutUint16(p[pageHeaderSize+hmFFactor:], ffactor)
	binary.LittleEndian.PutUint16(p[pageHeaderSize+hmBSize:], uint16(bsize))
	binary.LittleEndian.PutUint16(p[pageHeaderSize+hmBMSize:], uint16(1)<<lshift)
	binary.LittleEndian.PutUint16(p[pageHeaderSize+hmBMShift:], uint16(lshift+3))
	p.setMeta(hmProcID, procID)
	p.setMeta(hmMaxBucket, nb-1)
	high := uint32(1)<<bits.Len32(nb) - 1 // pg_nextpower2_32(nb + 1) - 1
	p.setMeta(hmHighMask, high)
	p.setMeta(hmLowMask, high>>1)
	p.setMeta(hmSpares+4*int(spare), 1)
	p.setMeta(hmOvflPoint, spare)
	p.setMeta(hmFirstFree, 0)
	p.setMeta(hmNMaps, 0)
	p.setLower(pageHeaderSize + hashMetaSize)
	return nil
}

// pg8kMaxBitmapSize is HashGetMaxBitmapSize of an 8 KiB page.
const pg8kMaxBitmapSize = 8192 - (pageHeaderSize + hashOpaqueSize)

// hashInitBitmap is _hash_initbitmapbuffer with initpage.
func (p page) hashInitBitmap(bmsize int) error {
	if pageHeaderSize+bmsize > len(p)-hashOpaqueSize {
		return fmt.Errorf("%w: hash bitmap of %d bytes", errRecord, bmsize)
	}
	p.init(hashOpaqueSize)
	p.hashSetOpaque(invalidBlock, invalidBlock, invalidBlock, lhBitmapPage)
	for i := 0; i < bmsize; i++ {
		p[pageHeaderSize+i] = 0xFF
	}
	p.setLower(pageHeaderSize + bmsize)
	return nil
}

// hashBit sets or clears bit n of a bitmap page (SETBIT, CLRBIT on uint32
// words).
func (p page) hashBit(n uint32, set bool) error {
	o := pageHeaderSize + 4*int(n/32)
	if o+4 > p.special() {
		return fmt.Errorf("%w: hash bitmap bit %d", errRecord, n)
	}
	w := p.u32(o)
	if set {
		w |= 1 << (n % 32)
	} else {
		w &^= 1 << (n % 32)
	}
	p.put32(o, w)
	return nil
}

// hashAddTuples adds the tuples of a MOVE_PAGE_CONTENTS or SQUEEZE_PAGE
// write page: ntups offsets, then the tuples, each MAXALIGNed.
func (p page) hashAddTuples(d []byte, ntups int) error {
	if len(d) < 2*ntups {
		return errShort
	}
	to := offsets(d[:2*ntups])
	d = d[2*ntups:]
	for i := 0; len(d) > 0; i++ {
		if i >= ntups || len(d) < 8 {
			return fmt.Errorf("%w: hash tuples past the %d offsets", errRecord, ntups)
		}
		sz := maxAlign(indexTupleSize(d))
		if sz > len(d) || sz == 0 {
			return errShort
		}
		if err := p.addItem(d[:sz], to[i], false, false); err != nil {
			return err
		}
		d = d[sz:]
	}
	return nil
}

func u32At(d []byte, off int) (uint32, error) {
	if len(d) < off+4 {
		return 0, errShort
	}
	return binary.LittleEndian.Uint32(d[off:]), nil
}

func redoHash(r *wal.Record, blk *wal.BlockRef, p page) error {
	m := r.MainData
	switch r.RmInfo() {
	case hashInitMetaPage:
		if err := needMain(r, 14); err != nil {
			return err
		}
		nt := math.Float64frombits(binary.LittleEndian.Uint64(m))
		if err := p.hashInitMeta(nt, binary.LittleEndian.Uint32(m[8:]), binary.LittleEndian.Uint16(m[12:])); err != nil {
			return err
		}
	case hashInitBitmapPage:
		if err := needMain(r, 2); err != nil {
			return err
		}
		switch blk.ID {
		case 0:
			if err := p.hashInitBitmap(int(binary.LittleEndian.Uint16(m))); err != nil {
				return err
			}
		case 1:
			n := p.meta(hmNMaps)
			if n >= hashMaxBitmap {
				return fmt.Errorf("%w: hash metapage with %d bitmaps", errRecord, n)
			}
			p.setMeta(hmMapp+4*int(n), p.meta(hmMaxBucket)+1+1)
			p.setMeta(hmNMaps, n+1)
		}
	case hashInsert:
		if err := needMain(r, 2); err != nil {
			return err
		}
		switch blk.ID {
		case 0:
			if err := p.addItem(blk.Data, int(binary.LittleEndian.Uint16(m)), false, false); err != nil {
				return err
			}
		case 1:
			p.setMetaNTuples(p.metaNTuples() + 1)
		}
	case hashAddOvflPage:
		if err := needMain(r, 3); err != nil {
			return err
		}
		switch blk.ID {
		case 0: // the new overflow page
			nb, err := u32At(blk.Data, 0)
			if err != nil {
				return err
			}
			left := r.Block(1)
			if left == nil {
				return fmt.Errorf("%w: hash overflow page without block 1", errRecord)
			}
			p.init(hashOpaqueSize)
			p.hashSetOpaque(left.Page.Block, invalidBlock, nb, lhOverflowPage)
		case 1: // the page before it
			ovfl := r.Block(0)
			if ovfl == nil {
				return fmt.Errorf("%w: hash overflow page record without block 0", errRecord)
			}
			p.hashSetNext(ovfl.Page.Block)
		case 2: // the bitmap page that has the bit
			bit, err := u32At(blk.Data, 0)
			if err != nil {
				return err
			}
			if err := p.hashBit(bit, true); err != nil {
				return err
			}
		case 3: // a new bitmap page
			if err := p.hashInitBitmap(int(binary.LittleEndian.Uint16(m))); err != nil {
				return err
			}
		case 4: // the metapage
			ff, err := u32At(blk.Data, 0)
			if err != nil {
				return err
			}
			p.setMeta(hmFirstFree, ff)
			if m[2] == 0 { // !bmpage_found
				sp := hmSpares + 4*int(p.meta(hmOvflPoint))
				if sp >= hmMapp {
					return fmt.Errorf("%w: hash ovflpoint out of range", errRecord)
				}
				p.setMeta(sp, p.meta(sp)+1)
				if nb := r.Block(3); nb != nil {
					n := p.meta(hmNMaps)
					if n >= hashMaxBitmap {
						return fmt.Errorf("%w: hash metapage with %d bitmaps", errRecord, n)
					}
					p.setMeta(hmMapp+4*int(n), nb.Page.Block)
					p.setMeta(hmNMaps, n+1)
					p.setMeta(sp, p.meta(sp)+1)
				}
			}
		}
	case hashSplitAllocate:
		if err := needMain(r, 9); err != nil {
			return err
		}
		newBucket := binary.LittleEndian.Uint32(m)
		switch blk.ID {
		case 0: // the old bucket's primary page
			p.hashSetFlag(binary.LittleEndian.Uint16(m[4:]))
			p.hashSetPrev(newBucket)
		case 1: // the new bucket's primary page
			p.init(hashOpaqueSize)
			p.hashSetOpaque(newBucket, invalidBlock, newBucket, binary.LittleEndian.Uint16(m[6:]))
		case 2: // the metapage
			p.setMeta(hmMaxBucket, newBucket)
			d := blk.Data
			if m[8]&1 != 0 { // XLH_SPLIT_META_UPDATE_MASKS
				if len(d) < 8 {
					return errShort
				}
				p.setMeta(hmLowMask, binary.LittleEndian.Uint32(d))
				p.setMeta(hmHighMask, binary.LittleEndian.Uint32(d[4:]))
				d = d[8:]
			}
			if m[8]&2 != 0 { // XLH_SPLIT_META_UPDATE_SPLITPOINT
				if len(d) < 8 {
					return errShort
				}
				pt := binary.LittleEndian.Uint32(d)
				if pt >= hashMaxSplit {
					return fmt.Errorf("%w: hash splitpoint %d", errRecord, pt)
				}
				p.setMeta(hmSpares+4*int(pt), binary.LittleEndian.Uint32(d[4:]))
				p.setMeta(hmOvflPoint, pt)
			}
		}
	case hashSplitPage:
		// Always a full page image (restored before redo is called).
		return fmt.Errorf("%w: hash SPLIT_PAGE without a full page image", errRecord)
	case hashSplitComplete:
		if err := needMain(r, 4); err != nil {
			return err
		}
		switch blk.ID {
		case 0:
			p.hashSetFlag(binary.LittleEndian.Uint16(m))
		case 1:
			p.hashSetFlag(binary.LittleEndian.Uint16(m[2:]))
		}
	case hashMovePage:
		if err := needMain(r, 3); err != nil {
			return err
		}
		switch blk.ID {
		case 0: // the bucket's primary page, only locked
			return nil
		case 1:
			if err := p.hashAddTuples(blk.Data, int(binary.LittleEndian.Uint16(m))); err != nil {
				return err
			}
		case 2:
			if len(blk.Data) > 0 {
				if err := p.indexMultiDelete(offsets(blk.Data)); err != nil {
					return err
				}
			}
		}
	case hashSqueezePage:
		if err := needMain(r, 12); err != nil {
			return err
		}
		prev, next := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint32(m[4:])
		switch blk.ID {
		case 0: // the bucket's primary page, only locked
			return nil
		case 1: // the page the tuples go to
			if err := p.hashAddTuples(blk.Data, int(binary.LittleEndian.Uint16(m[8:]))); err != nil {
				return err
			}
			if m[11] != 0 { // is_prev_bucket_same_wrt
				p.hashSetNext(next)
			}
		case 2: // the freed overflow page
			p.init(hashOpaqueSize)
			p.hashSetOpaque(invalidBlock, invalidBlock, invalidBlock, lhUnusedPage)
		case 3: // the page before it
			p.hashSetNext(next)
		case 4: // the page after it
			p.hashSetPrev(prev)
		case 5: // the bitmap page
			bit, err := u32At(blk.Data, 0)
			if err != nil {
				return err
			}
			if err := p.hashBit(bit, false); err != nil {
				return err
			}
		case 6: // the metapage
			ff, err := u32At(blk.Data, 0)
			if err != nil {
				return err
			}
			p.setMeta(hmFirstFree, ff)
		}
	case hashDelete:
		if err := needMain(r, 2); err != nil {
			return err
		}
		if blk.ID == 0 { // the bucket's primary page, only locked
			return nil
		}
		if len(blk.Data) > 0 {
			if err := p.indexMultiDelete(offsets(blk.Data)); err != nil {
				return err
			}
		}
		if m[0] != 0 { // clear_dead_marking
			p.hashSetFlag(p.hashFlag() &^ lhPageHasDead)
		}
	case hashSplitCleanup:
		p.hashSetFlag(p.hashFlag() &^ lhNeedsSplitCleanup)
	case hashUpdateMeta:
		if err := needMain(r, 8); err != nil {
			return err
		}
		p.setMetaNTuples(math.Float64frombits(binary.LittleEndian.Uint64(m)))
	case hashVacuumOnePage:
		if err := needMain(r, 8); err != nil {
			return err
		}
		n := int(int32(binary.LittleEndian.Uint32(m[4:])))
		switch blk.ID {
		case 0:
			if len(m) > 8 {
				if n < 0 || len(m) < 8+2*n {
					return errShort
				}
				if err := p.indexMultiDelete(offsets(m[8 : 8+2*n])); err != nil {
					return err
				}
			}
			p.hashSetFlag(p.hashFlag() &^ lhPageHasDead)
		case 1:
			p.setMetaNTuples(p.metaNTuples() - float64(n))
		}
	default:
		return unsupported(r)
	}
	p.setLSN(r.EndLSN)
	return nil
}

// maskHash is hash_mask.
func maskHash(p page) {
	maskCommon(p)
	if !p.hasSpecial(hashOpaqueSize) {
		return
	}
	switch p.hashFlag() & lhPageType {
	case lhUnusedPage:
		clear(p[24:]) // mask_page_content
		p.setLower(0)
		p.setUpper(0)
		return
	case lhBucketPage, lhOverflowPage:
		maskLPFlags(p)
	}
	p.hashSetFlag(p.hashFlag() &^ lhPageHasDead)
}
