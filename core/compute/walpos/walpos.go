// Package walpos tracks W, the compute's WAL position: the end of the last
// complete WAL record Postgres has written into pg_wal. Either the compute
// agent lets pg_wal pass through its FUSE mount and calls
// Tracker.WroteData for every write, or pg_wal is a link out of the mount
// and the tracker follows the folder (Tracker.Follow, which walks the new
// records with the WAL reader of plugins/redo/postgres/wal). Each data
// write is tagged with the WAL position it may depend on (DESIGN.md
// section 3a): Postgres
// writes (and flushes) WAL before the data pages that depend on it, so W at
// the time a page write arrives is at or above every WAL record the page can
// depend on.
//
// W is a record end, not the end of the write: Postgres writes whole 8 KiB
// WAL pages, zero-padded past the real end of WAL, and the safekeepers'
// commit LSN stops at that real end (LastRecordEnd parses the page headers
// and record lengths to find it).
//
// WroteData and RecordEndAtOrBelow read page headers and record lengths
// only; Follow checks each record's back link and CRC too, because it reads
// WAL that Postgres may be writing at that moment.
package walpos

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/stratadb/strata/sdk/pg"
)

// ErrNotSegment is returned by ParseSegmentName for a name that is not a WAL
// segment file name (24 upper-case hex digits).
var ErrNotSegment = errors.New("walpos: not a WAL segment file name")

// SegmentName is a parsed WAL segment file name TTTTTTTTXXXXXXXXYYYYYYYY.
type SegmentName struct {
	Timeline pg.PGTimeline
	// SegNo is the segment number (XLogSegNo): the segment starts at LSN
	// SegNo * segment size.
	SegNo uint64
}

// ParseSegmentName parses a WAL segment file name for segments of segSize
// bytes (a power of two between 1 MiB and 1 GiB).
func ParseSegmentName(name string, segSize uint64) (SegmentName, error) {
	if len(name) != 24 || segSize == 0 || segSize&(segSize-1) != 0 || segSize > 1<<32 {
		return SegmentName{}, fmt.Errorf("%w: %q", ErrNotSegment, name)
	}
	var v [3]uint64
	for i := range v {
		part := name[8*i : 8*i+8]
		for j := 0; j < len(part); j++ {
			c := part[j]
			if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'F') {
				return SegmentName{}, fmt.Errorf("%w: %q", ErrNotSegment, name)
			}
		}
		n, err := strconv.ParseUint(part, 16, 32)
		if err != nil {
			return SegmentName{}, fmt.Errorf("%w: %q", ErrNotSegment, name)
		}
		v[i] = n
	}
	perLog := (uint64(1) << 32) / segSize
	if v[2] >= perLog {
		return SegmentName{}, fmt.Errorf("%w: %q: segment part %X too large", ErrNotSegment, name, v[2])
	}
	return SegmentName{Timeline: pg.PGTimeline(v[0]), SegNo: v[1]*perLog + v[2]}, nil
}

// FormatSegmentName returns the file name of segment segNo on timeline tli.
func FormatSegmentName(tli pg.PGTimeline, segNo, segSize uint64) string {
	perLog := (uint64(1) << 32) / segSize
	return fmt.Sprintf("%08X%08X%08X", uint32(tli), uint32(segNo/perLog), uint32(segNo%perLog))
}

// Position returns the LSN just past a write of n bytes at offset off of the
// segment file named name, or ok=false if name is not a segment file name.
func Position(name string, off, n int64, segSize uint64) (pg.LSN, bool) {
	s, err := ParseSegmentName(name, segSize)
	if err != nil || off < 0 || n <= 0 || uint64(off)+uint64(n) > segSize {
		return 0, false
	}
	return pg.LSN(s.SegNo*segSize + uint64(off) + uint64(n)), true
}

// Tracker records the highest WAL position written. It is safe for
// concurrent use; the zero value is not usable, call New.
type Tracker struct {
	segSize uint64
	pos     atomic.Uint64
	follow  *Follower // set by Follow: Current walks the folder first
}

// New returns a tracker for WAL segments of segSize bytes, starting at start
// (for a compute that starts from storage: the durable end of WAL it was
// given, so that writes made before any new WAL are tagged correctly).
func New(segSize uint64, start pg.LSN) *Tracker {
	t := &Tracker{segSize: segSize}
	t.pos.Store(uint64(start))
	return t
}

// Wrote records a write of n bytes at offset off into the pg_wal file named
// name (base name, no folder). Writes to other files (xlogtemp.*, history
// files, archive_status) are ignored. It returns the LSN the write reached and
// whether the name was a segment file.
func (t *Tracker) Wrote(name string, off, n int64) (pg.LSN, bool) {
	end, ok := Position(name, off, n, t.segSize)
	if !ok {
		return 0, false
	}
	t.Advance(end)
	return end, true
}

// Advance raises the position to at least l.
func (t *Tracker) Advance(l pg.LSN) {
	for {
		cur := t.pos.Load()
		if uint64(l) <= cur || t.pos.CompareAndSwap(cur, uint64(l)) {
			return
		}
	}
}

// Current returns W: the highest WAL position written so far. A tracker
// that follows a folder (Follow) reads the WAL written since the last call
// first.
func (t *Tracker) Current() pg.LSN {
	if t.follow != nil {
		t.Advance(t.follow.walk())
	}
	return pg.LSN(t.pos.Load())
}
