package walpos

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/sdk/pg"
)

// WAL page layout of PostgreSQL 15 (access/xlog_internal.h, xlogrecord.h),
// little-endian, MAXALIGN 8.
const (
	// PageMagic is XLOG_PAGE_MAGIC of PostgreSQL 15.
	PageMagic = 0xD110
	// PageSize is XLOG_BLCKSZ.
	PageSize = 8192

	shortHeaderSize = 24 // MAXALIGN(sizeof(XLogPageHeaderData))
	longHeaderSize  = 40 // MAXALIGN(sizeof(XLogLongPageHeaderData))
	recordHeader    = 24 // sizeof(XLogRecord)

	xlpFirstIsContRecord = 0x0001
	xlpLongHeader        = 0x0002
	xlpAllFlags          = 0x000F
)

func maxAlign(n uint64) uint64 { return (n + 7) &^ 7 }

// pageRecordEnd returns the end (MAXALIGNed, as Postgres' EndRecPtr and
// flush positions are) of the last WAL record that ends on the WAL page p,
// whose first byte is at LSN at. found is false when no record ends on the
// page (it holds only the middle of a record that began on an earlier page).
// valid is false when p is not a Postgres 15 WAL page for at.
//
// Records are walked from the page header: the continuation of the previous
// page's record (xlp_rem_len bytes), then records whose first four bytes,
// xl_tot_len, give their length; a zero length (the zeroed rest of a partly
// filled page) or a record that runs past the page end stops the walk.
func pageRecordEnd(p []byte, at pg.LSN, segSize uint64) (end pg.LSN, found, valid bool) {
	return pageRecordEndBelow(p, at, PageSize, segSize)
}

// pageRecordEndBelow is pageRecordEnd for a page of which only the first
// limit bytes are WAL: a record (with its MAXALIGN padding) must end at or
// below at+limit to count.
func pageRecordEndBelow(p []byte, at pg.LSN, limit uint64, segSize uint64) (end pg.LSN, found, valid bool) {
	if len(p) != PageSize || limit > PageSize {
		return 0, false, false
	}
	magic := binary.LittleEndian.Uint16(p[0:2])
	info := binary.LittleEndian.Uint16(p[2:4])
	pageAddr := binary.LittleEndian.Uint64(p[8:16])
	remLen := uint64(binary.LittleEndian.Uint32(p[16:20]))
	if magic != PageMagic || info&^xlpAllFlags != 0 || pageAddr != uint64(at) {
		return 0, false, false
	}
	hdr := uint64(shortHeaderSize)
	if info&xlpLongHeader != 0 {
		hdr = longHeaderSize
	}
	if (uint64(at)%segSize == 0) != (info&xlpLongHeader != 0) {
		return 0, false, false // the long header is exactly on a segment's first page
	}
	pos := hdr
	if info&xlpFirstIsContRecord != 0 {
		if remLen == 0 {
			return 0, false, false
		}
		if hdr+remLen > PageSize || maxAlign(hdr+remLen) > limit {
			return 0, false, true // the (known part of the) page continues one record
		}
		pos = hdr + remLen
		end, found = at+pg.LSN(maxAlign(pos)), true
		pos = maxAlign(pos)
	}
	for pos+4 <= limit {
		tot := uint64(binary.LittleEndian.Uint32(p[pos : pos+4]))
		if tot == 0 {
			break
		}
		if tot < recordHeader {
			// Not a record header: stop trusting the page here. What came
			// before is still exact.
			break
		}
		if pos+tot > PageSize || maxAlign(pos+tot) > limit {
			break // continues past the page or the known WAL: not complete here
		}
		pos = maxAlign(pos + tot)
		end, found = at+pg.LSN(pos), true
	}
	return end, found, true
}

// LastRecordEnd returns the end of the last complete WAL record in data, a
// write of WAL starting at LSN start (the write's offset in its segment plus
// the segment's first LSN). It parses the write's pages from the last one
// back and stops at the first page on which a record ends.
//
// ok is false when no record ends inside the write (it holds only the middle
// of one long record): such a write completes no record, so it adds nothing
// a data write could depend on. When the write is not made of whole,
// well-formed WAL pages (not page-aligned, a foreign page header), the
// result is the write's end with ok true: never below a record that was
// written, at the price of exactness.
func LastRecordEnd(data []byte, start pg.LSN, segSize uint64) (end pg.LSN, ok bool) {
	writeEnd := start + pg.LSN(len(data))
	if len(data) == 0 {
		return 0, false
	}
	if uint64(start)%PageSize != 0 || len(data)%PageSize != 0 || segSize == 0 {
		return writeEnd, true
	}
	for off := len(data) - PageSize; off >= 0; off -= PageSize {
		at := start + pg.LSN(off)
		e, found, valid := pageRecordEnd(data[off:off+PageSize], at, segSize)
		if !valid {
			return writeEnd, true
		}
		if found {
			return e, true
		}
	}
	return 0, false
}

// WroteData records a write of data at offset off into the pg_wal file
// named name and moves W to the end of the last complete WAL record in it
// (LastRecordEnd). Postgres writes WAL in whole 8 KiB pages, zero-padded past
// the real end of WAL, while the safekeepers' commit LSN stops at that real
// end: taking the write's end as W would make an fsync wait for WAL that an
// idle Postgres never writes. It returns the new record end (0 when the write
// completes no record) and whether name was a segment file.
func (t *Tracker) WroteData(name string, off int64, data []byte) (pg.LSN, bool) {
	if _, ok := Position(name, off, int64(len(data)), t.segSize); !ok {
		return 0, false
	}
	s, _ := ParseSegmentName(name, t.segSize)
	start := pg.LSN(s.SegNo*t.segSize + uint64(off))
	end, ok := LastRecordEnd(data, start, t.segSize)
	if !ok {
		return 0, true
	}
	t.Advance(end)
	return end, true
}

// ReadFunc reads the WAL in [from, to).
type ReadFunc func(ctx context.Context, from, to pg.LSN) ([]byte, error)

// RecordEndAtOrBelow returns the end of the last complete WAL record at or
// below e (a durable end of WAL that may cut a record: the safekeepers store
// whatever Postgres flushed), reading pages backwards from the one that
// holds e; floor is a known record end at or below e (the start of the
// current term), returned when no record ends between it and e. This is
// where Postgres' crash recovery on WAL up to e ends, and so where the next
// Postgres writes on.
func RecordEndAtOrBelow(ctx context.Context, read ReadFunc, e, floor pg.LSN, segSize uint64) (pg.LSN, error) {
	if e <= floor {
		return e, nil
	}
	page := make([]byte, PageSize)
	for at := pg.LSN((uint64(e) - 1) / PageSize * PageSize); ; at -= PageSize {
		if at+PageSize <= floor {
			return floor, nil
		}
		limit := min(uint64(e-at), PageSize)
		if limit < longHeaderSize && uint64(at)%segSize == 0 || limit < shortHeaderSize {
			continue // no record data on this page below e
		}
		data, err := read(ctx, at, at+pg.LSN(limit))
		if err != nil {
			return 0, fmt.Errorf("walpos: read WAL %s..%s: %w", at, at+pg.LSN(limit), err)
		}
		if len(data) != int(limit) {
			return 0, fmt.Errorf("walpos: read WAL %s..%s: got %d bytes", at, at+pg.LSN(limit), len(data))
		}
		clear(page)
		copy(page, data)
		end, found, valid := pageRecordEndBelow(page, at, limit, segSize)
		if !valid {
			return 0, fmt.Errorf("walpos: the WAL page at %s is not a PostgreSQL 15 page for that LSN", at)
		}
		if found {
			return max(end, floor), nil
		}
		if at == 0 {
			return floor, nil
		}
	}
}
