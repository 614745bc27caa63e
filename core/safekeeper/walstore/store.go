// Package walstore keeps a safekeeper's WAL on local disk: 16 MiB segment
// files named and laid out like Postgres' pg_wal, a CRC-32C per 8 KiB block in
// a checksum file next to each segment, and the control file (term, LSNs,
// checksum, atomic replace).
//
// Durability protocol. Write appends bytes (page cache only); Flush makes
// everything written so far durable and returns the new flush LSN. Many
// Writes share one Flush (group commit). Flush costs one device cache flush:
// it writes the checksum entries and writes them out to the device
// (sync_file_range), then fdatasyncs the segment files, whose cache flush
// makes entries and bytes durable together. Each entry holds its block's
// length and CRC-32C and the length and CRC-32C the block had after the
// flush before (prev); the next flush settles it (prev = cur).
//
// At Open, the store extends the control file's flush LSN through every
// block whose entry matches its bytes, which recovers the exact durable end
// after a crash. A block that does not match is the torn tail of the last,
// unacknowledged flush when its entry is unsettled, its bytes match prev,
// no later block is settled and a sector past prev reads as zeros (bytes
// past the durable end are kept zero): the WAL then ends where prev ends. Any
// other mismatch is corruption (and a mismatch below the control file's
// flush LSN always is).
//
// Reads verify the checksums of every block they return and fail with
// ErrCorrupt on a mismatch; Repair rewrites such a block from another copy
// (a peer's), accepted only when it matches the stored checksum.
//
// It is not a WAL decoder: it never looks inside records.
package walstore

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrCorrupt: stored bytes (WAL block, checksum file or control file) do
	// not match their checksum.
	ErrCorrupt = errors.New("walstore: checksum mismatch")
	// ErrNotContiguous: a Write does not start at the write LSN.
	ErrNotContiguous = errors.New("walstore: write is not contiguous")
	// ErrNotHeld: the requested WAL is below the store's start LSN (removed
	// or never received) or beyond its flush LSN.
	ErrNotHeld = errors.New("walstore: WAL not held")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("walstore: store closed")
)

// Options configure a Store.
type Options struct {
	// Dir is the data folder; the store uses Dir/pg_wal, Dir/crc and the
	// control file.
	Dir string
	// SegmentSize is the WAL segment size (default 16 MiB).
	SegmentSize uint64
	// NoSync skips fsync (benchmarks of everything but the disk only).
	NoSync bool
	// VerifyOnOpen checks every stored block at Open (otherwise only the
	// blocks from the control file's flush LSN on).
	VerifyOnOpen bool
	// ObserveFsync, when set, gets the duration of each group-commit flush.
	ObserveFsync func(time.Duration)
	// Guard, when set, makes the system calls of Write and Flush raw
	// while they are quick (internal/rawio: they then skip the Go
	// runtime's system-call bookkeeping, a large part of a safekeeper's
	// CPU). Nil: the usual calls.
	Guard  *rawio.Guard
	Logger zerolog.Logger
}

// Store is a safekeeper's local WAL.
//
// Concurrency: Write is called by one writer at a time; Flush may run in
// another goroutine concurrently with Write (group commit); Read, FlushLSN,
// Control and the notify channels may be called from any goroutine.
type Store struct {
	opts    Options
	segSize uint64
	walDir  string
	crcDir  string

	flushMu sync.Mutex   // serializes Flush, Truncate, Repair and control writes
	rw      sync.RWMutex // Read holds it shared; Truncate and Repair exclusive

	mu       sync.Mutex
	ctl      Control
	writeLSN pg.LSN
	flushLSN pg.LSN
	segs     map[uint64]*segment
	corrupt  map[pg.LSN]bool // block start LSNs that failed verification
	flushCh  chan struct{}   // closed and replaced when flushLSN advances
	closed   bool

	// The spare segment (spare.go).
	spareReady bool // under mu
	spareWant  chan struct{}
	spareStop  chan struct{}
	spareDone  chan struct{}
	spareOnce  sync.Once

	readHook func() // tests: runs in Read between taking the file and reading it
}

// Open opens or creates the store in opts.Dir and recovers its durable end.
func Open(opts Options) (*Store, error) {
	if opts.SegmentSize == 0 {
		opts.SegmentSize = pg.WALSegmentSize
	}
	if opts.SegmentSize%BlockSize != 0 || opts.SegmentSize&(opts.SegmentSize-1) != 0 {
		return nil, fmt.Errorf("walstore: segment size %d is not a power of two multiple of %d", opts.SegmentSize, BlockSize)
	}
	s := &Store{
		opts: opts, segSize: opts.SegmentSize,
		walDir: filepath.Join(opts.Dir, "pg_wal"), crcDir: filepath.Join(opts.Dir, "crc"),
		segs: map[uint64]*segment{}, corrupt: map[pg.LSN]bool{}, flushCh: make(chan struct{}),
	}
	for _, d := range []string{opts.Dir, s.walDir, s.crcDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("walstore: %w", err)
		}
	}
	ctl, ok, err := readControl(opts.Dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		ctl = Control{Timeline: 1}
		if err := writeControl(opts.Dir, &ctl, opts.NoSync); err != nil {
			return nil, err
		}
	}
	s.ctl = ctl
	if err := s.recover(); err != nil {
		s.Close()
		return nil, err
	}
	s.startSpare()
	return s, nil
}

// recover finds the durable end from the checksum entries.
func (s *Store) recover() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctl.StartLSN == 0 && s.ctl.FlushLSN == 0 {
		return nil // empty
	}
	from := s.ctl.FlushLSN - s.ctl.FlushLSN%BlockSize
	if s.opts.VerifyOnOpen {
		from = s.ctl.StartLSN
	}
	from = max(from, s.ctl.StartLSN)
	end := s.ctl.FlushLSN
	for p := from; ; p += BlockSize {
		seg, err := s.openSegment(uint64(p)/s.segSize, false)
		if errors.Is(err, os.ErrNotExist) && p >= s.ctl.FlushLSN {
			break
		}
		if err != nil {
			return err
		}
		e := seg.entries[int(uint64(p)%s.segSize/BlockSize)]
		// mustHold: bytes of this block that the control file says are durable.
		var mustHold uint32
		if p < s.ctl.FlushLSN {
			mustHold = uint32(min(BlockSize, s.ctl.FlushLSN-p))
		}
		if e.n > BlockSize || e.n < mustHold {
			return fmt.Errorf("%w: checksum entry of block at %s says %d bytes, control file flush LSN is %s",
				ErrCorrupt, p, e.n, s.ctl.FlushLSN)
		}
		if e.n == 0 || s.ctl.Truncating && p >= s.ctl.FlushLSN {
			break
		}
		ok, err := s.verifyBlock(seg, p, e)
		if err != nil {
			return err
		}
		if !ok {
			torn, prevEnd, err := s.tornTail(seg, p, mustHold)
			if err != nil {
				return err
			}
			if torn {
				// The last flush was cut by the crash: its entry reached the
				// disk, some of its bytes did not. It was never
				// acknowledged; the block ends where the flush before left it.
				s.opts.Logger.Warn().Str("block", p.String()).Str("end", prevEnd.String()).
					Msg("walstore: torn tail of an unacknowledged flush; WAL ends before it")
				end = max(end, prevEnd)
				break
			}
			s.corrupt[p] = true
			s.opts.Logger.Error().Str("block", p.String()).Str("segment", SegmentName(s.ctl.Timeline, seg.no, s.segSize)).
				Msg("walstore: WAL block does not match its checksum; it will not be served until repaired")
		}
		end = max(end, p+pg.LSN(e.n))
		if e.n < BlockSize {
			break
		}
	}
	if s.ctl.Truncating {
		end = s.ctl.FlushLSN
		if err := s.truncateTailLocked(end); err != nil {
			return err
		}
	}
	s.writeLSN, s.flushLSN = end, end
	// Forget whatever lies past the end (unacknowledged writes): zero the
	// checksum entries after it, so that new bytes there start afresh.
	if err := s.clearAfter(end); err != nil {
		return err
	}
	if s.ctl.Truncating {
		s.ctl.Truncating = false
		if err := writeControl(s.opts.Dir, &s.ctl, s.opts.NoSync); err != nil {
			return err
		}
	}
	return nil
}

// tornTail reports whether the block at p, whose bytes do not match its
// entry, is the torn tail of the last flush (cut by a crash: the entry on
// disk, some bytes not) rather than corruption, and if so where the block
// ended after the flush before. It is torn only when all of these hold:
//   - its entry was written by the last flush (prev differs from cur: a
//     flush settles the entries of the one before it);
//   - the bytes match prev, the state the flush before made durable;
//   - prev holds at least what the control file says is durable;
//   - no later block of the segment has a settled, non-empty entry (the
//     flush that would have settled it ran after this one completed);
//   - some sector of the block past prev reads as zeros: bytes past the
//     durable end are zeros on disk (segments are created zeroed, and
//     recovery and truncation zero what lies past the end), so a sector the
//     flush did not get to disk reads as zeros, while a flipped bit in a
//     written sector does not.
//
// It also rewrites the block's entry to prev, so that new bytes continue
// from there. REQUIRES: s.mu held.
func (s *Store) tornTail(seg *segment, p pg.LSN, mustHold uint32) (bool, pg.LSN, error) {
	ents, err := readEntries(seg.side, len(seg.entries))
	if err != nil {
		return false, 0, err
	}
	blk := int(uint64(p) % s.segSize / BlockSize)
	e := ents[blk]
	if e.prev == e.cur || e.prev.n > e.cur.n || e.prev.n < mustHold {
		return false, 0, nil
	}
	ok, err := s.verifyBlock(seg, p, e.prev)
	if err != nil || !ok {
		return false, 0, err
	}
	for _, later := range ents[blk+1:] {
		if later.cur.n > 0 && later.prev == later.cur {
			return false, 0, nil
		}
	}
	if lost, err := s.zeroSectorAfter(seg, p, e.prev.n, e.cur.n); err != nil || !lost {
		return false, 0, err
	}
	seg.entries[blk], seg.durable[blk] = e.prev, e.prev
	if err := writeEntries(s.opts.Guard, seg.side, blk, settled(seg.entries[blk:blk+1])); err != nil {
		return false, 0, err
	}
	if !s.opts.NoSync {
		if err := datasync(s.opts.Guard, seg.side); err != nil {
			return false, 0, err
		}
	}
	return true, p + pg.LSN(e.prev.n), nil
}

// sectorSize is the unit a torn write loses: a disk writes 512-byte
// sectors whole.
const sectorSize = 512

// zeroSectorAfter reports whether, in the block at p, the part of some
// sector between byte from and byte to of the block reads as zeros.
func (s *Store) zeroSectorAfter(seg *segment, p pg.LSN, from, to uint32) (bool, error) {
	buf := make([]byte, to)
	if _, err := seg.data.ReadAt(buf, int64(uint64(p)%s.segSize)); err != nil {
		return false, fmt.Errorf("walstore: read %s: %w", seg.data.Name(), err)
	}
	for sec := from / sectorSize * sectorSize; sec < to; sec += sectorSize {
		lo, hi := max(sec, from), min(sec+sectorSize, to)
		if allZero(buf[lo:hi]) {
			return true, nil
		}
	}
	return false, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// zeroTail zeroes the bytes of seg from offset off to its end, if any is
// not zero (bytes written but never made durable by a flush), so that a
// sector a later flush does not get to disk reads as zeros (tornTail).
// REQUIRES: s.mu held.
func (s *Store) zeroTail(seg *segment, off uint64) error {
	buf := make([]byte, s.segSize-off)
	if _, err := seg.data.ReadAt(buf, int64(off)); err != nil {
		return fmt.Errorf("walstore: read %s: %w", seg.data.Name(), err)
	}
	if allZero(buf) {
		return nil
	}
	clear(buf)
	if _, err := seg.data.WriteAt(buf, int64(off)); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if !s.opts.NoSync {
		return datasync(s.opts.Guard, seg.data)
	}
	return nil
}

// clearAfter zeroes the checksum entries of blocks after the one holding end
// in end's segment and the segment's bytes after end, and removes later
// segments. REQUIRES: s.mu held.
func (s *Store) clearAfter(end pg.LSN) error {
	no := uint64(end) / s.segSize
	seg, err := s.openSegment(no, false)
	if err == nil {
		blk := int(uint64(end) % s.segSize / BlockSize)
		if uint64(end)%BlockSize == 0 {
			blk-- // end is a block boundary: blk is the last full block
		}
		var zero []blockEntry
		for i := blk + 1; i < len(seg.entries); i++ {
			if seg.entries[i] != (blockEntry{}) {
				zero = make([]blockEntry, len(seg.entries)-(blk+1))
				break
			}
		}
		if zero != nil {
			copy(seg.entries[blk+1:], zero)
			copy(seg.durable[blk+1:], zero)
			if seg.lastLo > blk {
				seg.lastLo, seg.lastHi = -1, -1
			} else if seg.lastLo >= 0 {
				seg.lastHi = min(seg.lastHi, blk)
			}
			if err := writeEntries(s.opts.Guard, seg.side, blk+1, settled(zero)); err != nil {
				return err
			}
			if !s.opts.NoSync {
				if err := datasync(s.opts.Guard, seg.side); err != nil {
					return err
				}
			}
		}
		if err := s.zeroTail(seg, uint64(end)%s.segSize); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	names, err := os.ReadDir(s.walDir)
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	for _, d := range names {
		_, n, err := ParseSegmentName(d.Name(), s.segSize)
		if err != nil || n <= no {
			continue
		}
		if seg, ok := s.segs[n]; ok {
			seg.close()
			delete(s.segs, n)
		}
		dp, sp := s.segPaths(n)
		os.Remove(sp)
		os.Remove(dp)
	}
	return nil
}

// verifyBlock checks the first e.n bytes of the block at p against e.
func (s *Store) verifyBlock(seg *segment, p pg.LSN, e blockEntry) (bool, error) {
	buf := make([]byte, e.n)
	if _, err := seg.data.ReadAt(buf, int64(uint64(p)%s.segSize)); err != nil {
		return false, fmt.Errorf("walstore: read %s: %w", seg.data.Name(), err)
	}
	return crc32.Checksum(buf, castagnoli) == e.crc, nil
}

// SegmentSize returns the WAL segment size.
func (s *Store) SegmentSize() uint64 { return s.segSize }

// Dir returns the folder holding the segment files (named like pg_wal's).
func (s *Store) WALDir() string { return s.walDir }

// IsEmpty reports whether the store holds no WAL position yet (see Init).
func (s *Store) IsEmpty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctl.StartLSN == 0 && s.flushLSN == 0
}

// Init sets the first LSN of an empty store. REQUIRES: start is a block
// boundary (safekeepers start at a segment boundary).
func (s *Store) Init(start pg.LSN, systemID uint64, tli pg.PGTimeline) error {
	if start%BlockSize != 0 {
		return fmt.Errorf("walstore: start %s is not a block boundary", start)
	}
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	if s.ctl.StartLSN != 0 || s.flushLSN != 0 {
		s.mu.Unlock()
		return fmt.Errorf("walstore: Init on a store that holds WAL from %s", s.ctl.StartLSN)
	}
	s.ctl.StartLSN, s.ctl.FlushLSN, s.ctl.SystemID, s.ctl.Timeline = start, start, systemID, tli
	s.writeLSN, s.flushLSN = start, start
	c := s.ctl.clone()
	s.mu.Unlock()
	return writeControl(s.opts.Dir, &c, s.opts.NoSync)
}

// WriteLSN returns the end of the bytes written (not necessarily durable).
func (s *Store) WriteLSN() pg.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeLSN
}

// FlushLSN returns the end of the durable WAL.
func (s *Store) FlushLSN() pg.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushLSN
}

// StartLSN returns the first LSN held locally.
func (s *Store) StartLSN() pg.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctl.StartLSN
}

// FlushNotify returns a channel that is closed when the flush LSN next
// advances (or the store is truncated or closed).
func (s *Store) FlushNotify() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushCh
}

// notify wakes the FlushNotify waiters. REQUIRES: s.mu held. A closed
// store's channel is closed for good.
func (s *Store) notify() {
	if s.closed {
		return
	}
	close(s.flushCh)
	s.flushCh = make(chan struct{})
}

// Write appends data at lsn. REQUIRES: lsn == WriteLSN(). The bytes are not
// durable until a Flush that starts after Write returns.
//
// A Write that fails part way (a full disk when a new segment is created)
// keeps what it wrote: WriteLSN says where it stopped, and a retry writes
// the rest from there.
func (s *Store) Write(lsn pg.LSN, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if lsn != s.writeLSN {
		return fmt.Errorf("%w: write at %s, write LSN is %s", ErrNotContiguous, lsn, s.writeLSN)
	}
	for len(data) > 0 {
		seg, err := s.openSegment(uint64(lsn)/s.segSize, true)
		if err != nil {
			return err
		}
		off := uint64(lsn) % s.segSize
		n := min(uint64(len(data)), s.segSize-off)
		if _, err := s.opts.Guard.WriteAt(seg.data, data[:n], int64(off)); err != nil {
			return fmt.Errorf("walstore: write %s: %w", seg.data.Name(), err)
		}
		for o := uint64(0); o < n; {
			blk := int((off + o) / BlockSize)
			in := (off + o) % BlockSize
			k := min(n-o, BlockSize-in)
			e := &seg.entries[blk]
			if uint64(e.n) != in {
				return fmt.Errorf("walstore: internal: block %d of segment %d has %d bytes, writing at %d", blk, seg.no, e.n, in)
			}
			e.crc = crc32.Update(e.crc, castagnoli, data[o:o+k])
			e.n += uint32(k)
			seg.markDirty(blk)
			o += k
		}
		lsn += pg.LSN(n)
		data = data[n:]
		s.writeLSN = lsn
	}
	return nil
}

type pendingEntries struct {
	seg    *segment
	lo     int
	ents   []diskEntry
	dirty  bool // the range holds blocks written since the last flush
	dLo    int  // the dirty blocks: dLo..dHi (when dirty)
	dHi    int
	synced []blockEntry // cur of ents: the segment's durable entries once done
}

// Flush makes all bytes written so far durable and returns the new flush
// LSN. Writes may continue while it runs; they join the next Flush.
//
// One device cache flush per Flush: the checksum entries are written and
// written out to the device first (sync_file_range, no cache flush), then
// fdatasync of the segment files flushes the device cache, which makes the
// entries durable together with the bytes. A crash in between can leave an
// entry on disk that describes bytes that are not: each entry therefore
// also holds the block's state after the flush before, and recover tells
// such a torn tail from corruption with it.
func (s *Store) Flush() (pg.LSN, error) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	target := s.writeLSN
	if target == s.flushLSN {
		s.mu.Unlock()
		return target, nil
	}
	var pend []pendingEntries
	for _, seg := range s.segs {
		if seg.dirtyLo < 0 && seg.lastLo < 0 {
			continue
		}
		p := pendingEntries{seg: seg, dirty: seg.dirtyLo >= 0, dLo: seg.dirtyLo, dHi: seg.dirtyHi}
		lo, hi := seg.dirtyLo, seg.dirtyHi
		if seg.lastLo >= 0 {
			// Settle the blocks of the last flush: it completed.
			if lo < 0 {
				lo, hi = seg.lastLo, seg.lastHi
			} else {
				lo, hi = min(lo, seg.lastLo), max(hi, seg.lastHi)
			}
		}
		p.lo = lo
		p.synced = append([]blockEntry(nil), seg.entries[lo:hi+1]...)
		p.ents = make([]diskEntry, hi-lo+1)
		for i := range p.ents {
			p.ents[i] = diskEntry{cur: seg.entries[lo+i], prev: seg.durable[lo+i]}
		}
		pend = append(pend, p)
		seg.dirtyLo = -1
	}
	s.mu.Unlock()
	sort.Slice(pend, func(i, j int) bool { return pend[i].seg.no < pend[j].seg.no })

	start := time.Now()
	fail := func(err error) (pg.LSN, error) {
		// The entries were taken off the dirty list; put them back so that a
		// later Flush retries them.
		s.mu.Lock()
		for _, p := range pend {
			if p.dirty {
				p.seg.markDirty(p.dLo)
				p.seg.markDirty(p.dHi)
			}
		}
		s.mu.Unlock()
		return 0, err
	}
	for _, p := range pend {
		if err := writeEntries(s.opts.Guard, p.seg.side, p.lo, p.ents); err != nil {
			return fail(err)
		}
	}
	if !s.opts.NoSync {
		// Start the device writes of the entries and of the WAL bytes
		// together, so that the two overlap, then wait for the entries'
		// (the fdatasync below waits for the bytes' and flushes the cache).
		for _, p := range pend {
			startWrite(s.opts.Guard, p.seg.side, int64(p.lo*entrySize), int64(len(p.ents)*entrySize))
		}
		for _, p := range pend {
			if p.dirty {
				startWrite(s.opts.Guard, p.seg.data, int64(p.dLo*BlockSize), int64((p.dHi-p.dLo+1)*BlockSize))
			}
		}
		for _, p := range pend {
			if err := writeOut(s.opts.Guard, p.seg.side, int64(p.lo*entrySize), int64(len(p.ents)*entrySize)); err != nil {
				return fail(err)
			}
		}
		for _, p := range pend {
			if !p.dirty {
				continue
			}
			if err := datasync(s.opts.Guard, p.seg.data); err != nil {
				return fail(err)
			}
		}
	}
	if s.opts.ObserveFsync != nil {
		s.opts.ObserveFsync(time.Since(start))
	}

	s.mu.Lock()
	if s.closed {
		// Closed while the bytes went to disk: Close closed the segments
		// and the notify channel; nothing here is this store's any more.
		s.mu.Unlock()
		return 0, ErrClosed
	}
	s.flushLSN = target
	for _, p := range pend {
		copy(p.seg.durable[p.lo:], p.synced)
		p.seg.lastLo, p.seg.lastHi = -1, -1
		if p.dirty {
			p.seg.lastLo, p.seg.lastHi = p.dLo, p.dHi
		}
	}
	// Close segments that are full, flushed and settled; they are reopened
	// on demand.
	for no, seg := range s.segs {
		if (no+1)*s.segSize <= uint64(target) && seg.dirtyLo < 0 && seg.lastLo < 0 {
			seg.close()
			delete(s.segs, no)
		}
	}
	s.notify()
	s.mu.Unlock()
	return target, nil
}

// Control returns a copy of the control data, with FlushLSN set to the
// current flush LSN.
func (s *Store) Control() Control {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ctl.clone()
	c.FlushLSN = s.flushLSN
	return c
}

// UpdateControl applies fn to the control data and persists it atomically
// (FlushLSN is always set to the current flush LSN, whatever fn does).
// fn runs under the store's lock: it must not call the Store.
func (s *Store) UpdateControl(fn func(*Control)) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	return s.updateControlLocked(fn)
}

// REQUIRES: s.flushMu held.
func (s *Store) updateControlLocked(fn func(*Control)) error {
	s.mu.Lock()
	c := s.ctl.clone()
	if fn != nil {
		fn(&c)
	}
	c.FlushLSN = s.flushLSN
	s.mu.Unlock()
	if err := writeControl(s.opts.Dir, &c, s.opts.NoSync); err != nil {
		return err
	}
	s.mu.Lock()
	s.ctl = c
	s.mu.Unlock()
	return nil
}

// Read returns verified WAL bytes from `from`, at most limit of them, never
// past the flush LSN nor past the end of from's segment. It fails with
// ErrNotHeld when from is below the start LSN or beyond the flush LSN, and
// with ErrCorrupt when a block does not match its checksum. The caller owns
// the returned slice.
func (s *Store) Read(from pg.LSN, limit int) ([]byte, error) {
	return s.read(from, limit, func(n int) []byte { return make([]byte, n) })
}

// ReadInto is Read into buf, for readers of long runs of WAL (the
// archiver) that reuse one buffer instead of allocating each read's: it
// returns how many bytes of buf it filled. from must start a block and
// len(buf) must be a whole number of blocks (what it reads covers whole
// blocks, for their checksums).
func (s *Store) ReadInto(from pg.LSN, buf []byte) (int, error) {
	if from%BlockSize != 0 || len(buf) == 0 || len(buf)%BlockSize != 0 {
		return 0, fmt.Errorf("walstore: ReadInto at %s into %d bytes: want a block start and whole blocks", from, len(buf))
	}
	b, err := s.read(from, len(buf), func(n int) []byte { return buf[:n] })
	return len(b), err
}

// read is Read with the block buffer from alloc (n bytes: the whole blocks
// that hold the range, the last one up to its written length).
func (s *Store) read(from pg.LSN, limit int, alloc func(n int) []byte) ([]byte, error) {
	s.rw.RLock()
	defer s.rw.RUnlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if from < s.ctl.StartLSN || from > s.flushLSN {
		start, flush := s.ctl.StartLSN, s.flushLSN
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s is outside [%s, %s]", ErrNotHeld, from, start, flush)
	}
	no := uint64(from) / s.segSize
	end := min(s.flushLSN, from+pg.LSN(limit), pg.LSN((no+1)*s.segSize))
	if end == from {
		s.mu.Unlock()
		return nil, nil
	}
	seg, err := s.openSegment(no, false)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	blk0 := from - from%BlockSize
	nblk := int((end - blk0 + BlockSize - 1) / BlockSize)
	first := int(uint64(blk0) % s.segSize / BlockSize)
	ents := append([]blockEntry(nil), seg.entries[first:first+nblk]...)
	data := seg.data
	for p := blk0; p < end; p += BlockSize {
		if s.corrupt[p] {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: WAL block at %s in segment %s", ErrCorrupt, p, SegmentName(s.ctl.Timeline, no, s.segSize))
		}
	}
	name := SegmentName(s.ctl.Timeline, no, s.segSize)
	s.mu.Unlock()
	if s.readHook != nil {
		s.readHook()
	}

	last := ents[nblk-1]
	buf := alloc((nblk-1)*BlockSize + int(last.n))
	for try := 0; ; try++ {
		_, err := data.ReadAt(buf, int64(uint64(blk0)%s.segSize))
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrClosed) || try == 3 {
			return nil, fmt.Errorf("walstore: read %s: %w", name, err)
		}
		// A Flush closed the segment (full, flushed and settled: its
		// bytes no longer change) while we read: open it again.
		s.mu.Lock()
		seg, err := s.openSegment(no, false)
		if err == nil {
			data = seg.data
		}
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	for i, e := range ents {
		b := buf[i*BlockSize:]
		if e.n < BlockSize && i != nblk-1 {
			return nil, fmt.Errorf("%w: checksum entry of block at %s says %d bytes", ErrCorrupt, blk0+pg.LSN(i*BlockSize), e.n)
		}
		if crc32.Checksum(b[:e.n], castagnoli) != e.crc {
			p := blk0 + pg.LSN(i*BlockSize)
			s.mu.Lock()
			s.corrupt[p] = true
			s.mu.Unlock()
			s.opts.Logger.Error().Str("block", p.String()).Str("segment", name).Msg("walstore: WAL block does not match its checksum; refusing to serve it")
			return nil, fmt.Errorf("%w: WAL block at %s in segment %s", ErrCorrupt, p, name)
		}
	}
	return buf[from-blk0 : end-blk0], nil
}

// CorruptBlocks returns the start LSNs of blocks known to fail verification.
func (s *Store) CorruptBlocks() []pg.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []pg.LSN
	for p := range s.corrupt {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Verify checks every held block from the start LSN to the flush LSN and
// returns the corrupt ones (also remembered for Read and Repair).
func (s *Store) Verify() ([]pg.LSN, error) {
	s.mu.Lock()
	from, to := s.ctl.StartLSN, s.flushLSN
	s.mu.Unlock()
	for p := from; p < to; {
		no := uint64(p) / s.segSize
		n := min(to, pg.LSN((no+1)*s.segSize)) - p
		if _, err := s.Read(p, int(n)); err != nil && !errors.Is(err, ErrCorrupt) {
			return nil, err
		} else if err != nil {
			// Skip the bad block and go on.
			var bad pg.LSN
			for _, b := range s.CorruptBlocks() {
				if b >= p {
					bad = b
					break
				}
			}
			if bad < p {
				return nil, err
			}
			p = bad + BlockSize
			continue
		}
		p += n
	}
	return s.CorruptBlocks(), nil
}

// Repair replaces the block that starts at blockStart with data, a copy of
// the same WAL from elsewhere (a peer). It accepts the copy only when it
// matches the stored checksum, so a repair can never change WAL.
func (s *Store) Repair(blockStart pg.LSN, data []byte) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if blockStart%BlockSize != 0 || blockStart < s.ctl.StartLSN || blockStart >= s.flushLSN {
		return fmt.Errorf("%w: repair of block %s", ErrNotHeld, blockStart)
	}
	seg, err := s.openSegment(uint64(blockStart)/s.segSize, false)
	if err != nil {
		return err
	}
	e := seg.entries[int(uint64(blockStart)%s.segSize/BlockSize)]
	if len(data) < int(e.n) {
		return fmt.Errorf("walstore: repair of block %s: got %d bytes, need %d", blockStart, len(data), e.n)
	}
	if crc32.Checksum(data[:e.n], castagnoli) != e.crc {
		return fmt.Errorf("%w: repair copy of block %s does not match the stored checksum", ErrCorrupt, blockStart)
	}
	if _, err := seg.data.WriteAt(data[:e.n], int64(uint64(blockStart)%s.segSize)); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if !s.opts.NoSync {
		if err := datasync(s.opts.Guard, seg.data); err != nil {
			return err
		}
	}
	delete(s.corrupt, blockStart)
	return nil
}

// Truncate discards all WAL at and after lsn (a divergent tail). REQUIRES:
// StartLSN() <= lsn <= WriteLSN(), and no concurrent Write.
func (s *Store) Truncate(lsn pg.LSN) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	if lsn < s.ctl.StartLSN || lsn > s.writeLSN {
		s.mu.Unlock()
		return fmt.Errorf("walstore: truncate to %s outside [%s, %s]", lsn, s.ctl.StartLSN, s.writeLSN)
	}
	// Lower the flush LSN in the control file first, marked as a
	// truncation under way: from then on, the entries past lsn are not
	// trusted, even if a crash comes before they are cleared.
	s.flushLSN, s.writeLSN = min(s.flushLSN, lsn), lsn
	s.mu.Unlock()
	if err := s.updateControlLocked(func(c *Control) {
		c.CommitLSN = min(c.CommitLSN, lsn)
		c.Truncating = true
	}); err != nil {
		return err
	}
	s.mu.Lock()
	err := s.truncateTailLocked(lsn)
	if err == nil {
		err = s.clearAfter(lsn)
	}
	for p := range s.corrupt {
		if p >= lsn-lsn%BlockSize {
			delete(s.corrupt, p)
		}
	}
	s.notify()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.updateControlLocked(func(c *Control) { c.Truncating = false })
}

// truncateTailLocked makes the block holding lsn end at lsn (checksum entry
// recomputed, later entries of the segment zeroed, bytes after lsn zeroed).
// REQUIRES: s.mu held.
func (s *Store) truncateTailLocked(lsn pg.LSN) error {
	no := uint64(lsn) / s.segSize
	seg, err := s.openSegment(no, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	off := uint64(lsn) % s.segSize
	blk := int(off / BlockSize)
	in := off % BlockSize
	buf := make([]byte, in)
	if _, err := seg.data.ReadAt(buf, int64(off-in)); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	seg.entries[blk] = blockEntry{n: uint32(in), crc: crc32.Checksum(buf, castagnoli)}
	seg.durable[blk] = seg.entries[blk]
	if err := writeEntries(s.opts.Guard, seg.side, blk, settled(seg.entries[blk:blk+1])); err != nil {
		return err
	}
	if seg.lastLo >= blk {
		seg.lastLo, seg.lastHi = -1, -1
	} else if seg.lastLo >= 0 {
		seg.lastHi = min(seg.lastHi, blk-1)
	}
	if seg.dirtyLo >= blk {
		seg.dirtyLo = -1
	} else if seg.dirtyLo >= 0 {
		seg.dirtyHi = min(seg.dirtyHi, blk)
	}
	// Zero the bytes after lsn so the segment reads like a fresh one.
	zero := make([]byte, s.segSize-off)
	if _, err := seg.data.WriteAt(zero, int64(off)); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if !s.opts.NoSync {
		if err := datasync(s.opts.Guard, seg.side); err != nil {
			return err
		}
		if err := datasync(s.opts.Guard, seg.data); err != nil {
			return err
		}
	}
	return nil
}

// RemoveBefore deletes the segment files that lie wholly below lsn (and
// below the flush LSN) and raises the start LSN accordingly.
func (s *Store) RemoveBefore(lsn pg.LSN) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	lsn = min(lsn, s.flushLSN)
	newStart := pg.LSN(uint64(lsn) / s.segSize * s.segSize)
	oldStart := s.ctl.StartLSN
	s.mu.Unlock()
	if newStart <= oldStart {
		return nil
	}
	if err := s.updateControlLocked(func(c *Control) { c.StartLSN = newStart }); err != nil {
		return err
	}
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for no := uint64(oldStart) / s.segSize; no < uint64(newStart)/s.segSize; no++ {
		if seg, ok := s.segs[no]; ok {
			seg.close()
			delete(s.segs, no)
		}
		dp, sp := s.segPaths(no)
		os.Remove(sp)
		os.Remove(dp)
	}
	return nil
}

// Close releases the files. It does not flush.
func (s *Store) Close() error {
	s.stopSpare()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for no, seg := range s.segs {
		seg.close()
		delete(s.segs, no)
	}
	close(s.flushCh)
	return nil
}
