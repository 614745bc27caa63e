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

	"github.com/stratadb/strata/sdk/pg"
)

// BlockSize is the unit the store checksums: one WAL page (XLOG_BLCKSZ).
const BlockSize = 8192

const entrySize = 8 // per block in a checksum file: length (4) | CRC-32C (4)

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

// segment is one open WAL segment: its data file, its checksum file and the
// in-memory copy of the checksum entries (authoritative for written bytes,
// ahead of the file for bytes not yet flushed).
type segment struct {
	no      uint64
	data    *os.File
	side    *os.File
	entries []blockEntry
	dirtyLo int // first block whose entry changed since the last flush, or -1
	dirtyHi int
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
	seg := &segment{no: no, data: data, side: side, dirtyLo: -1}
	nblocks := int(s.segSize / BlockSize)
	if create {
		if err := preallocate(data, int64(s.segSize)); err != nil {
			seg.close()
			return nil, err
		}
		if err := preallocate(side, int64(nblocks*entrySize)); err != nil {
			seg.close()
			return nil, err
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
	seg.entries, err = readEntries(side, nblocks)
	if err != nil {
		seg.close()
		return nil, err
	}
	s.segs[no] = seg
	return seg, nil
}

func preallocate(f *os.File, size int64) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if st.Size() >= size {
		return nil
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		// Not every filesystem supports fallocate; a sparse file still reads
		// as zeros.
		if err := f.Truncate(size); err != nil {
			return fmt.Errorf("walstore: size %s: %w", f.Name(), err)
		}
	}
	return nil
}

func readEntries(side *os.File, nblocks int) ([]blockEntry, error) {
	buf := make([]byte, nblocks*entrySize)
	n, err := side.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("walstore: read checksums: %w", err)
	}
	buf = buf[:n]
	ents := make([]blockEntry, nblocks)
	for i := range ents {
		if (i+1)*entrySize > len(buf) {
			break
		}
		b := buf[i*entrySize:]
		ents[i] = blockEntry{n: binary.BigEndian.Uint32(b), crc: binary.BigEndian.Uint32(b[4:])}
	}
	return ents, nil
}

// writeEntries writes entries ents starting at block lo to the checksum file.
func writeEntries(side *os.File, lo int, ents []blockEntry) error {
	buf := make([]byte, 0, len(ents)*entrySize)
	for _, e := range ents {
		buf = binary.BigEndian.AppendUint32(buf, e.n)
		buf = binary.BigEndian.AppendUint32(buf, e.crc)
	}
	if _, err := side.WriteAt(buf, int64(lo*entrySize)); err != nil {
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

func datasync(f *os.File) error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("walstore: fdatasync %s: %w", f.Name(), err)
	}
	return nil
}
