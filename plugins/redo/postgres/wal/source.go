// Package wal reads and decodes PostgreSQL 15 write-ahead log: segment files
// or a byte stream, page headers (short and long), records that cross pages
// and segments, CRC-32C checks, block references, full page images (with
// holes, pglz, lz4 and zstd compression), main data, origin and top-level xid.
//
// It knows nothing about what records mean for pages; redo lives in the
// parent package plugins/redo/postgres.
package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/stratadb/strata/sdk/pg"
)

// PageSize is the WAL page size (XLOG_BLCKSZ) that strata supports.
const PageSize = 8192

// Sentinel errors. Errors returned by the reader wrap one of them and name
// the LSN where the problem is.
var (
	// ErrEndOfWAL means there is no more valid WAL: a zeroed record header,
	// a page left over from a recycled segment, or a missing segment.
	ErrEndOfWAL = errors.New("wal: end of WAL")
	// ErrCorrupt means the bytes are not valid WAL: a bad CRC, a torn or
	// truncated record, an impossible header.
	ErrCorrupt = errors.New("wal: corrupt WAL")
	// ErrUnknownFormat means the WAL comes from a format this package does
	// not read (wrong page magic, page or block size).
	ErrUnknownFormat = errors.New("wal: unknown WAL format")
)

// Source gives the reader WAL pages.
type Source interface {
	// ReadPage fills buf (PageSize bytes) with the WAL page that starts at
	// lsn (a multiple of PageSize). It returns an error wrapping ErrEndOfWAL
	// when the page is not available. The reader calls ReadPage with
	// non-decreasing LSNs except that it may re-read the last page.
	ReadPage(lsn pg.LSN, buf []byte) error
	// SegmentSize returns the WAL segment size in bytes.
	SegmentSize() uint64
}

// SegmentFileName returns the file name of segment seg on timeline tli.
func SegmentFileName(tli pg.PGTimeline, seg, segSize uint64) string {
	per := uint64(0x100000000) / segSize
	return fmt.Sprintf("%08X%08X%08X", uint32(tli), uint32(seg/per), uint32(seg%per))
}

// ParseSegmentFileName parses a 24-hex-digit WAL segment file name.
func ParseSegmentFileName(name string, segSize uint64) (tli pg.PGTimeline, seg uint64, ok bool) {
	if len(name) != 24 {
		return 0, 0, false
	}
	var v [3]uint64
	for i := range v {
		x, err := strconv.ParseUint(name[i*8:i*8+8], 16, 32)
		if err != nil {
			return 0, 0, false
		}
		v[i] = x
	}
	per := uint64(0x100000000) / segSize
	return pg.PGTimeline(v[0]), v[1]*per + v[2], true
}

// DirSource reads segment files from a folder (such as pg_wal). When several
// timelines hold the same segment, the highest timeline wins. It reads
// ahead readAhead bytes at a time (one system call per 128 pages instead
// of one per page); a page read twice in a row (the reader retrying at the
// end of WAL) is read from the file again.
type DirSource struct {
	dir     string
	segSize uint64
	files   map[uint64]string
	cur     *os.File
	curSeg  uint64

	buf     []byte // bytes of segment curSeg from bufOff
	bufOff  int64
	lastLSN pg.LSN
	read    bool // lastLSN is set
}

const readAhead = 1 << 20

// OpenDir scans dir for segment files. The segment size is read from the
// long page header of the first segment found.
func OpenDir(dir string) (*DirSource, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if len(e.Name()) == 24 && !e.IsDir() {
			if _, _, ok := ParseSegmentFileName(e.Name(), pg.WALSegmentSize); ok {
				names = append(names, e.Name())
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no WAL segment files in %s", ErrEndOfWAL, dir)
	}
	sort.Strings(names)
	segSize, err := readSegSize(filepath.Join(dir, names[0]))
	if err != nil {
		return nil, err
	}
	s := &DirSource{dir: dir, segSize: segSize, files: map[uint64]string{}}
	tlis := map[uint64]pg.PGTimeline{}
	for _, n := range names {
		tli, seg, _ := ParseSegmentFileName(n, segSize)
		if old, ok := tlis[seg]; !ok || tli > old {
			tlis[seg] = tli
			s.files[seg] = n
		}
	}
	return s, nil
}

// FileSource returns a source over the given segment files only.
func FileSource(paths ...string) (*DirSource, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no segment files", ErrEndOfWAL)
	}
	segSize, err := readSegSize(paths[0])
	if err != nil {
		return nil, err
	}
	s := &DirSource{segSize: segSize, files: map[uint64]string{}}
	for _, p := range paths {
		_, seg, ok := ParseSegmentFileName(filepath.Base(p), segSize)
		if !ok {
			return nil, fmt.Errorf("wal: %s is not a WAL segment file name", p)
		}
		s.files[seg] = p
	}
	return s, nil
}

func readSegSize(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [longHeaderSize]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	h := parsePageHeader(b[:])
	if h.magic != pageMagic {
		return 0, fmt.Errorf("%w: %s: page magic %#04x, want %#04x (PostgreSQL 15)", ErrUnknownFormat, path, h.magic, pageMagic)
	}
	if h.info&xlpLongHeader == 0 {
		return 0, fmt.Errorf("%w: %s: first page lacks a long header", ErrCorrupt, path)
	}
	if !validSegSize(uint64(h.segSize)) {
		return 0, fmt.Errorf("%w: %s: segment size %d", ErrUnknownFormat, path, h.segSize)
	}
	return uint64(h.segSize), nil
}

func validSegSize(n uint64) bool {
	return n >= 1<<20 && n <= 1<<30 && n&(n-1) == 0
}

// SegmentSize implements Source.
func (s *DirSource) SegmentSize() uint64 { return s.segSize }

// Segments returns the segment numbers available, in order.
func (s *DirSource) Segments() []uint64 {
	out := make([]uint64, 0, len(s.files))
	for k := range s.files {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// ReadPage implements Source.
func (s *DirSource) ReadPage(lsn pg.LSN, buf []byte) error {
	seg := uint64(lsn) / s.segSize
	if s.cur == nil || s.curSeg != seg {
		if s.cur != nil {
			s.cur.Close()
			s.cur = nil
		}
		s.buf = s.buf[:0]
		name, ok := s.files[seg]
		if !ok {
			return fmt.Errorf("%w: segment %d (for %s) not found", ErrEndOfWAL, seg, lsn)
		}
		p := name
		if !filepath.IsAbs(p) && s.dir != "" {
			p = filepath.Join(s.dir, name)
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrEndOfWAL, err)
		}
		s.cur, s.curSeg = f, seg
	}
	off := int64(uint64(lsn) % s.segSize)
	again := s.read && s.lastLSN == lsn
	s.lastLSN, s.read = lsn, true
	if again || off < s.bufOff || off+PageSize > s.bufOff+int64(len(s.buf)) {
		if s.buf == nil {
			s.buf = make([]byte, 0, readAhead)
		}
		n := min(int64(readAhead), int64(s.segSize)-off)
		s.buf = s.buf[:n]
		got, err := s.cur.ReadAt(s.buf, off)
		s.buf, s.bufOff = s.buf[:got], off
		if got < PageSize {
			s.buf = s.buf[:0]
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%w: reading page %s: %v", ErrEndOfWAL, lsn, err)
		}
		// Keep only whole pages: a partial one is read again when needed.
		s.buf = s.buf[:got/PageSize*PageSize]
	}
	copy(buf[:PageSize], s.buf[off-s.bufOff:])
	return nil
}

// Close closes the open segment file.
func (s *DirSource) Close() error {
	s.buf = s.buf[:0]
	if s.cur != nil {
		err := s.cur.Close()
		s.cur = nil
		return err
	}
	return nil
}

// BytesSource serves WAL held in memory, starting at page-aligned LSN Start.
type BytesSource struct {
	Start   pg.LSN
	Data    []byte
	SegSize uint64 // 0 means 16 MiB
}

// SegmentSize implements Source.
func (b *BytesSource) SegmentSize() uint64 {
	if b.SegSize == 0 {
		return pg.WALSegmentSize
	}
	return b.SegSize
}

// ReadPage implements Source.
func (b *BytesSource) ReadPage(lsn pg.LSN, buf []byte) error {
	if lsn < b.Start || uint64(lsn-b.Start)+PageSize > uint64(len(b.Data)) {
		return fmt.Errorf("%w: page %s not in buffer", ErrEndOfWAL, lsn)
	}
	copy(buf, b.Data[lsn-b.Start:])
	return nil
}

// StreamSource reads WAL pages from a byte stream that begins at the
// page-aligned LSN start. It only moves forward (the last page is kept).
type StreamSource struct {
	r       io.Reader
	next    pg.LSN
	last    []byte
	lastLSN pg.LSN
	segSize uint64
}

// NewStreamSource returns a source over r, whose first byte is at start.
func NewStreamSource(r io.Reader, start pg.LSN, segSize uint64) *StreamSource {
	if segSize == 0 {
		segSize = pg.WALSegmentSize
	}
	return &StreamSource{r: r, next: start, segSize: segSize, lastLSN: ^pg.LSN(0)}
}

// SegmentSize implements Source.
func (s *StreamSource) SegmentSize() uint64 { return s.segSize }

// ReadPage implements Source.
func (s *StreamSource) ReadPage(lsn pg.LSN, buf []byte) error {
	if lsn == s.lastLSN {
		copy(buf, s.last)
		return nil
	}
	if lsn < s.next {
		return fmt.Errorf("wal: stream source cannot go back to %s", lsn)
	}
	if s.last == nil {
		s.last = make([]byte, PageSize)
	}
	for s.next <= lsn {
		if _, err := io.ReadFull(s.r, s.last); err != nil {
			s.lastLSN = ^pg.LSN(0)
			return fmt.Errorf("%w: stream ended before %s: %v", ErrEndOfWAL, lsn, err)
		}
		s.lastLSN = s.next
		s.next += PageSize
	}
	copy(buf, s.last)
	return nil
}
