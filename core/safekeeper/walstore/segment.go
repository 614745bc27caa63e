package walstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/sdk/pg"
)

// BlockSize is the unit the store checksums: one WAL page (XLOG_BLCKSZ).
const BlockSize = 8192

// entrySize is the size of one block's entry in a checksum file: the
// block's length (4) and CRC-32C (4), then the length and CRC-32C the block
// had after the flush before (4 + 4), the torn-write witness (see recover).
const entrySize = 16

// oldEntrySize is the entry of the first checksum file format (length and
// CRC-32C only); such files are converted when their segment is opened.
const oldEntrySize = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SegmentName returns the pg_wal file name of segment segNo on timeline tli,
// for segments of segSize bytes: 24 hex digits, as Postgres' XLogFileName.
func SegmentName(tli pg.PGTimeline, segNo, segSize uint64) string {
	perID := uint64(0x100000000) / segSize
	return fmt.Sprintf("%08X%08X%08X", uint32(tli), uint32(segNo/perID), uint32(segNo%perID))
}

// ParseSegmentName is the inverse of SegmentName.
func ParseSegmentName(name string, segSize uint64) (tli pg.PGTimeline, segNo uint64, err error) {
	if len(name) != 24 {
		return 0, 0, fmt.Errorf("walstore: %q is not a WAL segment name", name)
	}
	var v [3]uint64
	for i := range v {
		v[i], err = strconv.ParseUint(name[8*i:8*i+8], 16, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("walstore: %q is not a WAL segment name", name)
		}
	}
	perID := uint64(0x100000000) / segSize
	return pg.PGTimeline(v[0]), v[1]*perID + v[2], nil
}

// blockEntry describes the durable prefix of one block: its length and the
// CRC-32C of those bytes.
type blockEntry struct {
	n   uint32
	crc uint32
}

// diskEntry is a block's entry as stored: its current state and its state
// after the flush before the one that wrote it (equal once settled).
type diskEntry struct {
	cur, prev blockEntry
}

// segment is one open WAL segment: its data file, its checksum file and the
// in-memory copy of the checksum entries (authoritative for written bytes,
// ahead of the file for bytes not yet flushed).
type segment struct {
	no      uint64
	data    *os.File
	side    *os.File
	entries []blockEntry
	// durable holds each block's entry as of the last completed flush: the
	// prev half of the entries the next flush writes.
	durable []blockEntry
	dirtyLo int // first block whose entry changed since the last flush, or -1
	dirtyHi int
	// lastLo..lastHi: blocks the last completed flush wrote with prev !=
	// cur; the next flush settles them (prev = cur). -1: none.
	lastLo, lastHi int
}

func (s *Store) segPaths(no uint64) (data, side string) {
	name := SegmentName(s.ctl.Timeline, no, s.segSize)
	return filepath.Join(s.walDir, name), filepath.Join(s.crcDir, name)
}

// openSegment opens (create: creates, zero-filled) segment no.
// REQUIRES: s.mu held.
func (s *Store) openSegment(no uint64, create bool) (*segment, error) {
	if seg, ok := s.segs[no]; ok {
		return seg, nil
	}
	dp, sp := s.segPaths(no)
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
		if _, err := os.Stat(dp); errors.Is(err, os.ErrNotExist) {
			s.takeSpare(dp)
		}
	}
	data, err := os.OpenFile(dp, flag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("walstore: open segment: %w", err)
	}
	side, err := os.OpenFile(sp, flag, 0o600)
	if err != nil {
		data.Close()
		return nil, fmt.Errorf("walstore: open checksums: %w", err)
	}
	seg := &segment{no: no, data: data, side: side, dirtyLo: -1, lastLo: -1, lastHi: -1}
	nblocks := int(s.segSize / BlockSize)
	if !create {
		if err := s.checkComplete(data, side, nblocks); err != nil {
			seg.close()
			return nil, err
		}
	}
	if create {
		// Written zeros, not fallocate, in both files (see spare.go): a
		// data write must need no metadata change, or every Flush commits
		// the filesystem journal; an entry overwrite must need none so that
		// it is durable once written to the device and a cache flush
		// follows (see Flush).
		if err := zeroFill(data, int64(s.segSize), nil); err != nil {
			seg.close()
			return nil, fmt.Errorf("walstore: new segment %s: %w", filepath.Base(dp), err)
		}
		if err := zeroFill(side, int64(nblocks*entrySize), nil); err != nil {
			seg.close()
			return nil, fmt.Errorf("walstore: new segment %s: checksums: %w", filepath.Base(dp), err)
		}
		if !s.opts.NoSync {
			for _, f := range []*os.File{data, side} {
				if err := f.Sync(); err != nil {
					seg.close()
					return nil, fmt.Errorf("walstore: sync new segment: %w", err)
				}
			}
			if err := syncDir(s.walDir); err != nil {
				return nil, err
			}
			if err := syncDir(s.crcDir); err != nil {
				return nil, err
			}
		}
	}
	if !create {
		nside, err := s.convertEntries(side, nblocks)
		if err != nil {
			seg.close()
			return nil, err
		}
		if nside != side {
			side.Close()
			side, seg.side = nside, nside
		}
	}
	ents, err := readEntries(side, nblocks)
	if err != nil {
		seg.close()
		return nil, err
	}
	seg.entries = make([]blockEntry, nblocks)
	for i, e := range ents {
		seg.entries[i] = e.cur
	}
	seg.durable = append([]blockEntry(nil), seg.entries...)
	s.segs[no] = seg
	return seg, nil
}

// errIncomplete marks a segment whose files are shorter than a segment:
// its creation (the zero fill) was cut by a full disk or a crash, so no WAL
// was ever written to it. It counts as absent (os.ErrNotExist); the next
// Write that reaches it completes it.
var errIncomplete = fmt.Errorf("segment creation did not finish (full disk or crash): %w", os.ErrNotExist)

// checkComplete returns errIncomplete when the segment's data or checksum
// file is short.
func (s *Store) checkComplete(data, side *os.File, nblocks int) error {
	ds, err := data.Stat()
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	ss, err := side.Stat()
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if ds.Size() < int64(s.segSize) || ss.Size() < int64(nblocks*entrySize) && ss.Size() != int64(nblocks*oldEntrySize) {
		return fmt.Errorf("walstore: %s holds %d of %d bytes, its checksums %d of %d: %w", data.Name(),
			ds.Size(), s.segSize, ss.Size(), nblocks*entrySize, errIncomplete)
	}
	return nil
}

// convertEntries rewrites a checksum file of the first format (8-byte
// entries) in the current one, settled (prev = cur): a new file written
// beside it, synced, renamed over it. It returns the file to use: side, or
// the converted file.
func (s *Store) convertEntries(side *os.File, nblocks int) (*os.File, error) {
	st, err := side.Stat()
	if err != nil {
		return nil, fmt.Errorf("walstore: %w", err)
	}
	if st.Size() != int64(nblocks*oldEntrySize) {
		return side, nil
	}
	old := make([]byte, st.Size())
	if _, err := side.ReadAt(old, 0); err != nil {
		return nil, fmt.Errorf("walstore: read checksums: %w", err)
	}
	ents := make([]diskEntry, nblocks)
	for i := range ents {
		b := old[i*oldEntrySize:]
		e := blockEntry{n: binary.BigEndian.Uint32(b), crc: binary.BigEndian.Uint32(b[4:])}
		ents[i] = diskEntry{cur: e, prev: e}
	}
	tmp := side.Name() + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("walstore: convert checksums: %w", err)
	}
	err = writeEntries(nil, f, 0, ents)
	if err == nil && !s.opts.NoSync {
		err = f.Sync()
	}
	f.Close()
	if err == nil {
		err = os.Rename(tmp, side.Name())
	}
	if err == nil && !s.opts.NoSync {
		err = syncDir(filepath.Dir(side.Name()))
	}
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("walstore: convert checksums of %s: %w", side.Name(), err)
	}
	nf, err := os.OpenFile(side.Name(), os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("walstore: %w", err)
	}
	s.opts.Logger.Info().Str("file", side.Name()).Msg("walstore: checksum file converted to the current format")
	return nf, nil
}

func readEntries(side *os.File, nblocks int) ([]diskEntry, error) {
	buf := make([]byte, nblocks*entrySize)
	n, err := side.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("walstore: read checksums: %w", err)
	}
	buf = buf[:n]
	ents := make([]diskEntry, nblocks)
	for i := range ents {
		if (i+1)*entrySize > len(buf) {
			break
		}
		b := buf[i*entrySize:]
		ents[i] = diskEntry{
			cur:  blockEntry{n: binary.BigEndian.Uint32(b), crc: binary.BigEndian.Uint32(b[4:])},
			prev: blockEntry{n: binary.BigEndian.Uint32(b[8:]), crc: binary.BigEndian.Uint32(b[12:])},
		}
	}
	return ents, nil
}

// settled returns ents as settled disk entries (prev = cur).
func settled(ents []blockEntry) []diskEntry {
	out := make([]diskEntry, len(ents))
	for i, e := range ents {
		out[i] = diskEntry{cur: e, prev: e}
	}
	return out
}

// writeEntries writes entries ents starting at block lo to the checksum
// file, raw as g says (rawio: a nil g makes the usual system call).
func writeEntries(g *rawio.Guard, side *os.File, lo int, ents []diskEntry) error {
	buf := make([]byte, 0, len(ents)*entrySize)
	for _, e := range ents {
		buf = binary.BigEndian.AppendUint32(buf, e.cur.n)
		buf = binary.BigEndian.AppendUint32(buf, e.cur.crc)
		buf = binary.BigEndian.AppendUint32(buf, e.prev.n)
		buf = binary.BigEndian.AppendUint32(buf, e.prev.crc)
	}
	if _, err := g.WriteAt(side, buf, int64(lo*entrySize)); err != nil {
		return fmt.Errorf("walstore: write checksums: %w", err)
	}
	return nil
}

func (seg *segment) markDirty(blk int) {
	if seg.dirtyLo < 0 {
		seg.dirtyLo, seg.dirtyHi = blk, blk
		return
	}
	seg.dirtyLo = min(seg.dirtyLo, blk)
	seg.dirtyHi = max(seg.dirtyHi, blk)
}

func (seg *segment) close() {
	if seg.data != nil {
		seg.data.Close()
	}
	if seg.side != nil {
		seg.side.Close()
	}
}

// writeOut starts writeback of f's dirty pages in [off, off+n) and waits for
// it, without a device cache flush: the fdatasync that follows flushes the
// cache, and with it these pages (see Flush).
func writeOut(g *rawio.Guard, f *os.File, off, n int64) error {
	const flags = unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
	if err := g.SyncFileRange(f, off, n, flags); err != nil {
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ESPIPE) {
			return datasync(g, f) // no sync_file_range here: a full sync instead
		}
		return fmt.Errorf("walstore: sync_file_range %s: %w", f.Name(), err)
	}
	return nil
}

// startWrite starts writeback of f's dirty pages in [off, off+n) without
// waiting for it. Best effort: writeOut or fdatasync, which follow, are
// what make the pages durable, so an error here is left to them.
func startWrite(g *rawio.Guard, f *os.File, off, n int64) {
	_ = g.SyncFileRange(f, off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// datasync is fdatasync(2) of f, raw as g says.
func datasync(g *rawio.Guard, f *os.File) error {
	if err := g.Fdatasync(f); err != nil {
		return fmt.Errorf("walstore: fdatasync %s: %w", f.Name(), err)
	}
	return nil
}
