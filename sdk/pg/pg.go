// Package pg holds the small Postgres vocabulary that every part of strata
// shares: WAL positions (LSN), timelines, page keys and the page size.
//
// It is not a Postgres client and knows nothing about WAL record formats;
// those live in plugins/redo/postgres.
package pg

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// BlockSize is the size of a Postgres page (BLCKSZ), in bytes.
const BlockSize = 8192

var zeroPage [BlockSize]byte

// IsZeroPage reports whether p is a page of BlockSize zero bytes (what
// Postgres writes to extend a relation).
func IsZeroPage(p []byte) bool { return len(p) == BlockSize && bytes.Equal(p, zeroPage[:]) }

// WALSegmentSize is the default size of a WAL segment file, in bytes.
const WALSegmentSize = 16 << 20

// ErrBadLSN is returned by ParseLSN for text that is not an LSN.
var ErrBadLSN = errors.New("pg: malformed LSN")

// LSN is a 64-bit position in the write-ahead log.
type LSN uint64

// InvalidLSN is the zero LSN, which Postgres uses for "no position".
const InvalidLSN LSN = 0

// String formats the LSN as Postgres does: two upper-case hex halves,
// for example "16/B374D848".
func (l LSN) String() string {
	return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l))
}

// Segment returns the number of the WAL segment (of segSize bytes) that holds l.
func (l LSN) Segment(segSize uint64) uint64 { return uint64(l) / segSize }

// SegmentOffset returns the offset of l inside its WAL segment.
func (l LSN) SegmentOffset(segSize uint64) uint64 { return uint64(l) % segSize }

// MarshalText implements encoding.TextMarshaler.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// ParseLSN parses the "X/Y" form that Postgres prints.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok || hi == "" || lo == "" {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBadLSN, s)
	}
	return LSN(h<<32 | l), nil
}

// TimelineID names a timeline (a branch of history) in strata. It is a
// 128-bit identifier printed as 32 hex digits, like Neon's timeline IDs; it is
// unrelated to Postgres' own 32-bit WAL timeline number (see PGTimeline).
type TimelineID [16]byte

// String returns the timeline ID as 32 lower-case hex digits.
func (t TimelineID) String() string { return fmt.Sprintf("%x", t[:]) }

// IsZero reports whether t is the zero ID.
func (t TimelineID) IsZero() bool { return t == TimelineID{} }

// ParseTimelineID parses 32 hex digits.
func ParseTimelineID(s string) (TimelineID, error) {
	var t TimelineID
	if len(s) != 32 {
		return t, fmt.Errorf("pg: timeline id %q: want 32 hex digits", s)
	}
	for i := 0; i < 16; i++ {
		v, err := strconv.ParseUint(s[2*i:2*i+2], 16, 8)
		if err != nil {
			return TimelineID{}, fmt.Errorf("pg: timeline id %q: %v", s, err)
		}
		t[i] = byte(v)
	}
	return t, nil
}

// PGTimeline is Postgres' own WAL timeline number (the first 8 hex digits of a
// WAL segment file name).
type PGTimeline uint32

// ForkNumber is a relation fork, as in Postgres' ForkNumber.
type ForkNumber uint8

// The relation forks.
const (
	MainFork ForkNumber = 0
	FSMFork  ForkNumber = 1
	VMFork   ForkNumber = 2
	InitFork ForkNumber = 3
)

// String returns the fork's file-name suffix name ("main", "fsm", "vm", "init").
func (f ForkNumber) String() string {
	switch f {
	case MainFork:
		return "main"
	case FSMFork:
		return "fsm"
	case VMFork:
		return "vm"
	case InitFork:
		return "init"
	}
	return fmt.Sprintf("fork%d", uint8(f))
}

// RelTag names a relation fork: tablespace, database and relfilenode OIDs and
// the fork.
type RelTag struct {
	Spc, DB, Rel uint32
	Fork         ForkNumber
}

// String formats the tag like Postgres' relpathperm: "spc/db/rel" plus a
// fork suffix for non-main forks.
func (r RelTag) String() string {
	s := fmt.Sprintf("%d/%d/%d", r.Spc, r.DB, r.Rel)
	if r.Fork != MainFork {
		s += "_" + r.Fork.String()
	}
	return s
}

// PageKey names one 8 KiB page of a relation fork.
type PageKey struct {
	Spc, DB, Rel uint32
	Fork         ForkNumber
	Block        uint32
}

// Tag returns the relation fork that holds the page.
func (k PageKey) Tag() RelTag { return RelTag{Spc: k.Spc, DB: k.DB, Rel: k.Rel, Fork: k.Fork} }

// String formats the key as "spc/db/rel[_fork] blk N".
func (k PageKey) String() string { return fmt.Sprintf("%s blk %d", k.Tag(), k.Block) }

// Page returns the key of block blk of relation fork r.
func (r RelTag) Page(blk uint32) PageKey {
	return PageKey{Spc: r.Spc, DB: r.DB, Rel: r.Rel, Fork: r.Fork, Block: blk}
}

// Well-known tablespace OIDs.
const (
	DefaultTablespaceOID uint32 = 1663 // pg_default
	GlobalTablespaceOID  uint32 = 1664 // pg_global
)
