package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/stratadb/strata/sdk/pg"
)

const (
	pageMagic       = 0xD110 // XLOG_PAGE_MAGIC of PostgreSQL 15
	shortHeaderSize = 24     // MAXALIGN(sizeof(XLogPageHeaderData))
	longHeaderSize  = 40     // MAXALIGN(sizeof(XLogLongPageHeaderData))

	xlpFirstIsContRecord   = 0x0001
	xlpLongHeader          = 0x0002
	xlpBkpRemovable        = 0x0004
	xlpFirstIsOverwriteCon = 0x0008
	xlpAllFlags            = 0x000F

	// RecordHeaderSize is sizeof the fixed XLogRecord header.
	RecordHeaderSize = 24
	// maxRecordSize is XLogRecordMaxSize (1020 MiB).
	maxRecordSize = 1020 * 1024 * 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type pageHeader struct {
	magic    uint16
	info     uint16
	tli      uint32
	pageAddr pg.LSN
	remLen   uint32
	sysID    uint64
	segSize  uint32
	blckSz   uint32
}

func parsePageHeader(b []byte) pageHeader {
	h := pageHeader{
		magic:    binary.LittleEndian.Uint16(b[0:]),
		info:     binary.LittleEndian.Uint16(b[2:]),
		tli:      binary.LittleEndian.Uint32(b[4:]),
		pageAddr: pg.LSN(binary.LittleEndian.Uint64(b[8:])),
		remLen:   binary.LittleEndian.Uint32(b[16:]),
	}
	if h.info&xlpLongHeader != 0 && len(b) >= longHeaderSize {
		h.sysID = binary.LittleEndian.Uint64(b[24:])
		h.segSize = binary.LittleEndian.Uint32(b[32:])
		h.blckSz = binary.LittleEndian.Uint32(b[36:])
	}
	return h
}

func (h pageHeader) size() int {
	if h.info&xlpLongHeader != 0 {
		return longHeaderSize
	}
	return shortHeaderSize
}

// Reader reads WAL records in LSN order from a Source. It is not safe for
// concurrent use.
type Reader struct {
	src     Source
	segSize uint64
	sysID   uint64
	tli     uint32

	page    []byte
	pageLSN pg.LSN
	hdr     pageHeader
	loaded  bool

	next    pg.LSN // where the next record starts (or a page boundary before it)
	prev    pg.LSN // start of the last record returned (0 before the first)
	started bool
	buf     []byte
	rec     Record

	headersOnly bool // Next leaves records' bodies undecoded (HeadersOnly)
}

// NewReader returns a reader whose first record is the first one that
// starts at or after start. When start is a page boundary whose page begins
// with the tail of an earlier record, that tail is skipped.
func NewReader(src Source, start pg.LSN) *Reader {
	return &Reader{src: src, segSize: src.SegmentSize(), next: start, page: make([]byte, PageSize), pageLSN: ^pg.LSN(0)}
}

// Reset makes r read from start again, as a new reader from NewReader(src,
// start) would, while keeping the buffers it has grown: a caller that walks
// the end of a WAL being written, again and again, allocates nothing per
// walk. The page r holds is read again.
func (r *Reader) Reset(start pg.LSN) {
	*r = Reader{
		src: r.src, segSize: r.segSize, next: start, page: r.page, pageLSN: ^pg.LSN(0),
		buf: r.buf[:0], rec: Record{Blocks: r.rec.Blocks[:0]}, headersOnly: r.headersOnly,
	}
}

// HeadersOnly makes Next, from now on and across Reset, check each
// record's length, back link and CRC as always but leave its body (block
// references, origin, top-level XID, main data) undecoded: the records
// it returns have their header fields, Raw and EndLSN, and no Blocks or
// MainData. For a reader that only needs where complete records end
// (the compute's W lookup), for which decoding was a third of the walk.
func (r *Reader) HeadersOnly() { r.headersOnly = true }

// SystemID returns the database system identifier seen in a long page
// header, or 0 before one was read.
func (r *Reader) SystemID() uint64 { return r.sysID }

// Timeline returns the timeline of the last page read.
func (r *Reader) Timeline() pg.PGTimeline { return pg.PGTimeline(r.tli) }

// NextLSN returns where the reader will look for the next record.
func (r *Reader) NextLSN() pg.LSN { return r.next }

// loadPage reads and validates the WAL page that starts at lsn.
func (r *Reader) loadPage(lsn pg.LSN) error {
	if r.loaded && r.pageLSN == lsn {
		return nil
	}
	r.loaded = false
	if err := r.src.ReadPage(lsn, r.page); err != nil {
		return err
	}
	h := parsePageHeader(r.page)
	if h.magic != pageMagic {
		if h.magic == 0 && h.pageAddr == 0 {
			return &endError{kind: endEmptyPage, at: lsn}
		}
		return fmt.Errorf("%w: page at %s has magic %#04x, want %#04x (PostgreSQL 15)", ErrUnknownFormat, lsn, h.magic, pageMagic)
	}
	if h.info&^xlpAllFlags != 0 {
		return fmt.Errorf("%w: page at %s has invalid info bits %#04x", ErrCorrupt, lsn, h.info)
	}
	if h.pageAddr != lsn {
		// A page left over from a recycled segment: Postgres' normal end of WAL.
		return &endError{kind: endPageAddress, at: lsn, addr: h.pageAddr}
	}
	if uint64(lsn)%r.segSize == 0 && h.info&xlpLongHeader == 0 {
		return fmt.Errorf("%w: first page of segment at %s lacks a long header", ErrCorrupt, lsn)
	}
	if h.info&xlpLongHeader != 0 {
		if uint64(h.segSize) != r.segSize {
			return fmt.Errorf("%w: page at %s: segment size %d, want %d", ErrUnknownFormat, lsn, h.segSize, r.segSize)
		}
		if h.blckSz != PageSize {
			return fmt.Errorf("%w: page at %s: WAL block size %d, want %d", ErrUnknownFormat, lsn, h.blckSz, PageSize)
		}
		if r.sysID != 0 && h.sysID != r.sysID {
			return fmt.Errorf("%w: page at %s: system identifier %d, want %d", ErrCorrupt, lsn, h.sysID, r.sysID)
		}
		r.sysID = h.sysID
	}
	r.tli = h.tli
	r.hdr, r.pageLSN, r.loaded = h, lsn, true
	return nil
}

func maxAlign(v uint64) uint64 { return (v + 7) &^ 7 }

// skipContinuation moves r.next past the page header and, when the page
// begins with the tail of a record that started before, past that tail.
func (r *Reader) skipContinuation() error {
	for {
		off := uint64(r.next) % PageSize
		pageStart := r.next - pg.LSN(off)
		if err := r.loadPage(pageStart); err != nil {
			return err
		}
		hs := uint64(r.hdr.size())
		if off >= hs {
			return nil
		}
		if r.hdr.info&xlpFirstIsContRecord == 0 {
			r.next = pageStart + pg.LSN(hs)
			return nil
		}
		rem := uint64(r.hdr.remLen)
		if hs+rem <= PageSize {
			r.next = pageStart + pg.LSN(maxAlign(hs+rem))
			if uint64(r.next)%PageSize != 0 {
				return nil
			}
			// The tail ends the page exactly: the next record is on the next page.
			if r.next == pageStart+PageSize {
				continue
			}
			return nil
		}
		r.next = pageStart + PageSize
	}
}

// Next returns the next record. The record and its slices stay valid until
// the next call to Next; use Record.Clone to keep them. At the end of the
// available WAL, the error wraps ErrEndOfWAL; a bad record wraps ErrCorrupt
// or ErrUnknownFormat. Every error names the LSN.
func (r *Reader) Next() (*Record, error) {
	if !r.started {
		r.started = true
		if err := r.skipContinuation(); err != nil {
			return nil, err
		}
	}
	pos := r.next
	off := uint64(pos) % PageSize
	if off == 0 {
		if err := r.loadPage(pos); err != nil {
			return nil, err
		}
		if r.hdr.info&xlpFirstIsContRecord != 0 {
			return nil, fmt.Errorf("%w: page at %s begins with a continuation where a record should start", ErrCorrupt, pos)
		}
		pos += pg.LSN(r.hdr.size())
		off = uint64(r.hdr.size())
	} else {
		if err := r.loadPage(pos - pg.LSN(off)); err != nil {
			return nil, err
		}
		if off < uint64(r.hdr.size()) {
			return nil, fmt.Errorf("%w: record offset %s inside the page header", ErrCorrupt, pos)
		}
	}
	if off%8 != 0 {
		return nil, fmt.Errorf("%w: record at %s is not aligned", ErrCorrupt, pos)
	}
	// xl_tot_len always lies on the first page (records are 8-aligned).
	totLen := binary.LittleEndian.Uint32(r.page[off:])
	if totLen == 0 {
		return nil, &endError{kind: endZeroLength, at: pos}
	}
	if totLen < RecordHeaderSize || totLen > maxRecordSize {
		return nil, fmt.Errorf("%w: invalid record length at %s: %d", ErrCorrupt, pos, totLen)
	}
	// Gather the record, page by page.
	r.buf = r.buf[:0]
	need := int(totLen)
	pageStart := pos - pg.LSN(off)
	cur := int(off)
	for {
		n := PageSize - cur
		if n > need-len(r.buf) {
			n = need - len(r.buf)
		}
		r.buf = append(r.buf, r.page[cur:cur+n]...)
		if len(r.buf) == need {
			cur += n
			break
		}
		pageStart += PageSize
		if err := r.loadPage(pageStart); err != nil {
			return nil, fmt.Errorf("%w: record at %s continues at %s: %v", ErrCorrupt, pos, pageStart, err)
		}
		if r.hdr.info&xlpFirstIsContRecord == 0 {
			return nil, fmt.Errorf("%w: torn record at %s: no continuation flag in page %s", ErrCorrupt, pos, pageStart)
		}
		if int(r.hdr.remLen) != need-len(r.buf) {
			return nil, fmt.Errorf("%w: torn record at %s: page %s continues %d bytes, want %d", ErrCorrupt, pos, pageStart, r.hdr.remLen, need-len(r.buf))
		}
		cur = r.hdr.size()
	}
	end := pageStart + pg.LSN(cur)
	if err := r.rec.decodeHeader(pos, r.buf); err != nil {
		return nil, err
	}
	if r.prev != 0 && r.rec.Prev != r.prev {
		return nil, fmt.Errorf("%w: record at %s has prev-link %s, want %s", ErrCorrupt, pos, r.rec.Prev, r.prev)
	}
	if r.prev == 0 && r.rec.Prev >= pos {
		return nil, fmt.Errorf("%w: record at %s has prev-link %s after itself", ErrCorrupt, pos, r.rec.Prev)
	}
	crc := crc32.Update(0, castagnoli, r.buf[RecordHeaderSize:])
	crc = crc32.Update(crc, castagnoli, r.buf[:20])
	if crc != r.rec.CRC {
		return nil, fmt.Errorf("%w: incorrect resource manager data checksum in record at %s", ErrCorrupt, pos)
	}
	if r.headersOnly {
		r.rec.Blocks = r.rec.Blocks[:0]
		r.rec.HasOrigin, r.rec.Origin, r.rec.ToplevelXID, r.rec.MainData = false, 0, 0, nil
	} else if err := r.rec.decodeBody(); err != nil {
		return nil, err
	}
	r.prev = pos
	next := pg.LSN(maxAlign(uint64(end)))
	r.rec.EndLSN = next // Postgres' EndRecPtr: the MAXALIGNed end
	if r.rec.RmID == RmXLOG && r.rec.Info&0xF0 == xlogSwitch {
		// A switch record fills the rest of its segment.
		next = pg.LSN((uint64(end) + r.segSize - 1) / r.segSize * r.segSize)
		r.rec.EndLSN = next
	}
	r.next = next
	return &r.rec, nil
}

// endError is the end of the WAL written so far, met where a reader looked.
// A reader that follows WAL as it is written meets it at every catch-up,
// so the message is only formatted when someone reads it.
type endError struct {
	kind endKind
	at   pg.LSN // the page or record position looked at
	addr pg.LSN // endPageAddress: the address the page names instead
}

type endKind uint8

const (
	endEmptyPage   endKind = iota // a page of zeros
	endPageAddress                // a page left over from a recycled segment
	endZeroLength                 // a record header of zeros
)

func (e *endError) Error() string {
	switch e.kind {
	case endEmptyPage:
		return fmt.Sprintf("%v: empty page at %s", ErrEndOfWAL, e.at)
	case endPageAddress:
		return fmt.Sprintf("%v: unexpected page address %s in page at %s", ErrEndOfWAL, e.addr, e.at)
	default:
		return fmt.Sprintf("%v: invalid record length at %s: wanted %d, got 0", ErrEndOfWAL, e.at, RecordHeaderSize)
	}
}

func (e *endError) Unwrap() error { return ErrEndOfWAL }
