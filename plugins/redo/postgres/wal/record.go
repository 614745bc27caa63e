package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/stratadb/strata/sdk/pg"
)

// RmgrID is a resource manager id (xl_rmid).
type RmgrID uint8

// The resource managers of PostgreSQL 15, in rmgrlist.h order.
const (
	RmXLOG RmgrID = iota
	RmXact
	RmSmgr
	RmCLOG
	RmDatabase
	RmTablespace
	RmMultiXact
	RmRelMap
	RmStandby
	RmHeap2
	RmHeap
	RmBtree
	RmHash
	RmGin
	RmGist
	RmSequence
	RmSPGist
	RmBRIN
	RmCommitTs
	RmReplicationOrigin
	RmGeneric
	RmLogicalMessage
	RmMax = RmLogicalMessage
)

var rmgrNames = [...]string{"XLOG", "Transaction", "Storage", "CLOG", "Database", "Tablespace",
	"MultiXact", "RelMap", "Standby", "Heap2", "Heap", "Btree", "Hash", "Gin", "Gist", "Sequence",
	"SPGist", "BRIN", "CommitTs", "ReplicationOrigin", "Generic", "LogicalMessage"}

// String returns the name pg_waldump prints for the resource manager.
func (id RmgrID) String() string {
	if int(id) < len(rmgrNames) {
		return rmgrNames[id]
	}
	return fmt.Sprintf("custom%03d", uint8(id))
}

// RmgrByName returns the id of a resource manager name (case-insensitive).
func RmgrByName(name string) (RmgrID, bool) {
	for i, n := range rmgrNames {
		if equalFold(n, name) {
			return RmgrID(i), true
		}
	}
	return 0, false
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

const xlogSwitch = 0x40

// Flags of xl_info and of block references.
const (
	InfoMask           = 0x0F // XLR_INFO_MASK
	SpecialRelUpdate   = 0x01 // XLR_SPECIAL_REL_UPDATE
	CheckConsistency   = 0x02 // XLR_CHECK_CONSISTENCY
	bkpForkMask        = 0x0F
	BkpHasImage        = 0x10
	BkpHasData         = 0x20
	BkpWillInit        = 0x40
	BkpSameRel         = 0x80
	ImgHasHole         = 0x01
	ImgApply           = 0x02
	ImgCompressPGLZ    = 0x04
	ImgCompressLZ4     = 0x08
	ImgCompressZstd    = 0x10
	imgCompressedMask  = ImgCompressPGLZ | ImgCompressLZ4 | ImgCompressZstd
	blockIDDataShort   = 255
	blockIDDataLong    = 254
	blockIDOrigin      = 253
	blockIDToplevelXID = 252
	maxBlockID         = 32
)

// BlockRef is one block reference of a record.
type BlockRef struct {
	ID         uint8
	Page       pg.PageKey
	ForkFlags  uint8 // fork number and BKPBLOCK_* flags, as in the record
	HasImage   bool
	ApplyImage bool   // the image must be restored (a real FPI, not a consistency-check image)
	ImageInfo  uint8  // bimg_info
	ImageLen   uint16 // bytes stored in the record
	HoleOffset uint16
	HoleLength uint16
	Image      []byte // stored image bytes (maybe compressed, without the hole)
	Data       []byte // block data, nil when none
	dataLen    uint16
}

// WillInit reports whether redo initializes the page from scratch.
func (b *BlockRef) WillInit() bool { return b.ForkFlags&BkpWillInit != 0 }

// Compressed reports whether the image is compressed.
func (b *BlockRef) Compressed() bool { return b.ImageInfo&imgCompressedMask != 0 }

// Record is one decoded WAL record. Slices point into the reader's buffer.
type Record struct {
	LSN    pg.LSN // where the record starts
	EndLSN pg.LSN // the position just after it (the end of the segment for a switch record)
	TotLen uint32
	XID    uint32
	Prev   pg.LSN
	Info   uint8
	RmID   RmgrID
	CRC    uint32

	HasOrigin   bool
	Origin      uint16
	ToplevelXID uint32 // 0 when absent
	Blocks      []BlockRef
	MainData    []byte
	Raw         []byte // the whole record, header included
}

// RmInfo returns the resource-manager-specific bits of xl_info.
func (r *Record) RmInfo() uint8 { return r.Info &^ InfoMask }

// Block returns the block reference with the given id, or nil.
func (r *Record) Block(id uint8) *BlockRef {
	for i := range r.Blocks {
		if r.Blocks[i].ID == id {
			return &r.Blocks[i]
		}
	}
	return nil
}

// FPILen returns the bytes of full page images stored in the record, as
// pg_waldump counts them.
func (r *Record) FPILen() int {
	n := 0
	for i := range r.Blocks {
		if r.Blocks[i].HasImage {
			n += int(r.Blocks[i].ImageLen)
		}
	}
	return n
}

// Clone returns a deep copy that owns its memory.
func (r *Record) Clone() *Record {
	c := *r
	c.Raw = append([]byte(nil), r.Raw...)
	c.Blocks = nil // do not share the reader's array
	// Re-point slices into the copy.
	if err := c.decodeBody(); err != nil {
		panic("wal: clone of a decoded record failed to decode: " + err.Error())
	}
	return &c
}

func (r *Record) decodeHeader(lsn pg.LSN, b []byte) error {
	r.LSN = lsn
	r.TotLen = binary.LittleEndian.Uint32(b[0:])
	r.XID = binary.LittleEndian.Uint32(b[4:])
	r.Prev = pg.LSN(binary.LittleEndian.Uint64(b[8:]))
	r.Info = b[16]
	r.RmID = RmgrID(b[17])
	r.CRC = binary.LittleEndian.Uint32(b[20:])
	r.Raw = b
	if r.RmID > RmMax && r.RmID < 128 {
		return fmt.Errorf("%w: invalid resource manager ID %d at %s", ErrCorrupt, r.RmID, lsn)
	}
	return nil
}

// Decode parses a complete record (header included) that starts at lsn and
// ends at end (Postgres' EndRecPtr: the MAXALIGNed position after it, page
// headers included), checking its CRC. It is the entry point for WAL that
// arrives as records rather than pages. The record keeps references into b.
func Decode(lsn, end pg.LSN, b []byte) (*Record, error) {
	if len(b) < RecordHeaderSize {
		return nil, fmt.Errorf("%w: record at %s shorter than its header", ErrCorrupt, lsn)
	}
	if tl := binary.LittleEndian.Uint32(b); int(tl) != len(b) {
		return nil, fmt.Errorf("%w: record at %s: length %d, have %d bytes", ErrCorrupt, lsn, tl, len(b))
	}
	r := &Record{}
	if err := r.decodeHeader(lsn, b); err != nil {
		return nil, err
	}
	crc := crc32Update(b)
	if crc != r.CRC {
		return nil, fmt.Errorf("%w: incorrect resource manager data checksum in record at %s", ErrCorrupt, lsn)
	}
	if err := r.decodeBody(); err != nil {
		return nil, err
	}
	r.EndLSN = end
	return r, nil
}

func (r *Record) decodeBody() error {
	b := r.Raw[RecordHeaderSize:]
	r.Blocks = r.Blocks[:0]
	r.HasOrigin, r.Origin, r.ToplevelXID, r.MainData = false, 0, 0, nil
	short := func(what string) error {
		return fmt.Errorf("%w: record at %s too short (%s)", ErrCorrupt, r.LSN, what)
	}
	var (
		p         int
		mainLen   int
		dataTotal int
		lastRel   *pg.PageKey
		maxID     = -1
	)
	for len(b)-p > dataTotal {
		id := b[p]
		p++
		switch {
		case id == blockIDDataShort:
			if p+1 > len(b) {
				return short("main data length")
			}
			mainLen = int(b[p])
			p++
			dataTotal += mainLen
		case id == blockIDDataLong:
			if p+4 > len(b) {
				return short("main data length")
			}
			mainLen = int(binary.LittleEndian.Uint32(b[p:]))
			p += 4
			if mainLen < 0 || mainLen > len(b) {
				return short("main data")
			}
			dataTotal += mainLen
		case id == blockIDOrigin:
			if p+2 > len(b) {
				return short("origin")
			}
			r.HasOrigin, r.Origin = true, binary.LittleEndian.Uint16(b[p:])
			p += 2
			continue
		case id == blockIDToplevelXID:
			if p+4 > len(b) {
				return short("top-level xid")
			}
			r.ToplevelXID = binary.LittleEndian.Uint32(b[p:])
			p += 4
			continue
		case id <= maxBlockID:
			if int(id) <= maxID {
				return fmt.Errorf("%w: out-of-order block_id %d at %s", ErrCorrupt, id, r.LSN)
			}
			maxID = int(id)
			if p+3 > len(b) {
				return short("block header")
			}
			blk := BlockRef{ID: id, ForkFlags: b[p]}
			dlen := int(binary.LittleEndian.Uint16(b[p+1:]))
			p += 3
			hasData := blk.ForkFlags&BkpHasData != 0
			if hasData && dlen == 0 {
				return fmt.Errorf("%w: BKPBLOCK_HAS_DATA set, but no data included at %s", ErrCorrupt, r.LSN)
			}
			if !hasData && dlen != 0 {
				return fmt.Errorf("%w: BKPBLOCK_HAS_DATA not set, but data length is %d at %s", ErrCorrupt, dlen, r.LSN)
			}
			dataTotal += dlen
			blk.dataLen = uint16(dlen)
			if blk.ForkFlags&BkpHasImage != 0 {
				if p+5 > len(b) {
					return short("image header")
				}
				blk.HasImage = true
				blk.ImageLen = binary.LittleEndian.Uint16(b[p:])
				blk.HoleOffset = binary.LittleEndian.Uint16(b[p+2:])
				blk.ImageInfo = b[p+4]
				p += 5
				blk.ApplyImage = blk.ImageInfo&ImgApply != 0
				comp := blk.ImageInfo&imgCompressedMask != 0
				hole := blk.ImageInfo&ImgHasHole != 0
				if comp {
					if hole {
						if p+2 > len(b) {
							return short("hole length")
						}
						blk.HoleLength = binary.LittleEndian.Uint16(b[p:])
						p += 2
					}
				} else {
					if blk.ImageLen > pg.BlockSize {
						return fmt.Errorf("%w: block image length %d at %s", ErrCorrupt, blk.ImageLen, r.LSN)
					}
					blk.HoleLength = uint16(pg.BlockSize - int(blk.ImageLen))
				}
				dataTotal += int(blk.ImageLen)
				if hole && (blk.HoleOffset == 0 || blk.HoleLength == 0 || blk.ImageLen == pg.BlockSize) {
					return fmt.Errorf("%w: BKPIMAGE_HAS_HOLE set, but hole offset %d length %d block image length %d at %s", ErrCorrupt, blk.HoleOffset, blk.HoleLength, blk.ImageLen, r.LSN)
				}
				if !hole && (blk.HoleOffset != 0 || blk.HoleLength != 0) {
					return fmt.Errorf("%w: BKPIMAGE_HAS_HOLE not set, but hole offset %d length %d at %s", ErrCorrupt, blk.HoleOffset, blk.HoleLength, r.LSN)
				}
				if comp && blk.ImageLen == pg.BlockSize {
					return fmt.Errorf("%w: BKPIMAGE_COMPRESSED set, but block image length %d at %s", ErrCorrupt, blk.ImageLen, r.LSN)
				}
				if int(blk.HoleOffset)+int(blk.HoleLength) > pg.BlockSize {
					return fmt.Errorf("%w: hole offset %d length %d beyond the page at %s", ErrCorrupt, blk.HoleOffset, blk.HoleLength, r.LSN)
				}
			}
			if blk.ForkFlags&BkpSameRel == 0 {
				if p+12 > len(b) {
					return short("relfilenode")
				}
				blk.Page.Spc = binary.LittleEndian.Uint32(b[p:])
				blk.Page.DB = binary.LittleEndian.Uint32(b[p+4:])
				blk.Page.Rel = binary.LittleEndian.Uint32(b[p+8:])
				p += 12
			} else {
				if lastRel == nil {
					return fmt.Errorf("%w: BKPBLOCK_SAME_REL set but no previous rel at %s", ErrCorrupt, r.LSN)
				}
				blk.Page.Spc, blk.Page.DB, blk.Page.Rel = lastRel.Spc, lastRel.DB, lastRel.Rel
			}
			blk.Page.Fork = pg.ForkNumber(blk.ForkFlags & bkpForkMask)
			if p+4 > len(b) {
				return short("block number")
			}
			blk.Page.Block = binary.LittleEndian.Uint32(b[p:])
			p += 4
			r.Blocks = append(r.Blocks, blk)
			lastRel = &r.Blocks[len(r.Blocks)-1].Page
			continue
		default:
			return fmt.Errorf("%w: invalid block_id %d at %s", ErrCorrupt, id, r.LSN)
		}
		break // main data header ends the headers
	}
	if len(b)-p != dataTotal {
		return fmt.Errorf("%w: record at %s: %d bytes of data, headers announce %d", ErrCorrupt, r.LSN, len(b)-p, dataTotal)
	}
	for i := range r.Blocks {
		blk := &r.Blocks[i]
		if blk.HasImage {
			blk.Image = b[p : p+int(blk.ImageLen) : p+int(blk.ImageLen)]
			p += int(blk.ImageLen)
		}
		if n := int(blk.dataLen); n > 0 {
			blk.Data = b[p : p+n : p+n]
			p += n
		}
	}
	if mainLen > 0 {
		r.MainData = b[p : p+mainLen : p+mainLen]
	}
	return nil
}

func crc32Update(b []byte) uint32 {
	crc := crc32Table(b[RecordHeaderSize:], 0)
	return crc32Table(b[:20], crc)
}

// ErrBadImage is wrapped by RestoreImage errors.
var ErrBadImage = errors.New("wal: cannot restore page image")

var zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<20))
	if err != nil {
		panic(err)
	}
	return d
})

// RestoreImage writes the full 8 KiB page image of the block into dst
// (which must hold pg.BlockSize bytes): it decompresses the stored bytes and
// fills the hole with zeros.
func (b *BlockRef) RestoreImage(dst []byte) error {
	if !b.HasImage {
		return fmt.Errorf("%w: block %d has no image", ErrBadImage, b.ID)
	}
	dst = dst[:pg.BlockSize]
	raw := b.Image
	want := pg.BlockSize - int(b.HoleLength)
	if b.Compressed() {
		var tmp [pg.BlockSize]byte
		switch {
		case b.ImageInfo&ImgCompressPGLZ != 0:
			n, err := PGLZDecompress(tmp[:want], raw)
			if err != nil || n != want {
				return fmt.Errorf("%w: pglz: %v (%d of %d bytes)", ErrBadImage, err, n, want)
			}
		case b.ImageInfo&ImgCompressLZ4 != 0:
			n, err := lz4.UncompressBlock(raw, tmp[:want])
			if err != nil || n != want {
				return fmt.Errorf("%w: lz4: %v (%d of %d bytes)", ErrBadImage, err, n, want)
			}
		case b.ImageInfo&ImgCompressZstd != 0:
			out, err := zstdDecoder().DecodeAll(raw, tmp[:0:want])
			if err != nil || len(out) != want {
				return fmt.Errorf("%w: zstd: %v (%d of %d bytes)", ErrBadImage, err, len(out), want)
			}
			if &out[0] != &tmp[0] {
				copy(tmp[:], out)
			}
		}
		raw = tmp[:want]
		return fillHole(dst, raw, b)
	}
	if len(raw) != want {
		return fmt.Errorf("%w: image of %d bytes, want %d", ErrBadImage, len(raw), want)
	}
	return fillHole(dst, raw, b)
}

func fillHole(dst, raw []byte, b *BlockRef) error {
	ho, hl := int(b.HoleOffset), int(b.HoleLength)
	if ho+hl > pg.BlockSize || len(raw) != pg.BlockSize-hl || ho > len(raw) {
		return fmt.Errorf("%w: hole %d+%d does not fit", ErrBadImage, ho, hl)
	}
	copy(dst, raw[:ho])
	clear(dst[ho : ho+hl])
	copy(dst[ho+hl:], raw[ho:])
	return nil
}
