// Package layer holds the pageserver's storage units: the in-memory layer
// (an append-only log file plus an in-memory index, where new versions land)
// and the immutable layer files (delta and image layers) it is flushed into,
// with their writer and reader.
//
// A layer file is self-describing: values, then a fixed-width sorted index,
// then a footer with the key and LSN ranges and checksums. Readers load the
// footer and the index once (two ranged reads) and then read single values
// by offset, so a layer can be read in place from local disk or through
// ranged reads from the object store (RemoteSource).
//
// The package does not decide when to flush, compact or delete layers (that
// is the timeline's job) and does not know what the bytes of a value mean.
package layer

import (
	"errors"
	"fmt"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrCorrupt: a layer file or log failed a checksum or structural check.
	ErrCorrupt = errors.New("layer: corrupt")
	// ErrFrozen: a Put on a frozen in-memory layer.
	ErrFrozen = errors.New("layer: in-memory layer is frozen")
	// ErrClosed: a Put on a closed in-memory layer.
	ErrClosed = errors.New("layer: in-memory layer is closed")
	// ErrOrder: a Writer got versions out of (key, LSN, Seq) order.
	ErrOrder = errors.New("layer: versions out of order")
)

// Kind says how a version's Data relates to the value of its key.
type Kind uint8

const (
	// Image: Data is the whole value (an 8 KiB page, a file block, a size).
	Image Kind = 1
	// Delta: Data is an opaque WAL record to apply to the previous value
	// with a redo engine.
	Delta Kind = 2
	// WillInit: a delta that needs no previous value (it initializes the page).
	WillInit Kind = 3
	// Tombstone: the key does not exist from this version on (a dropped
	// relation's size key, an unlinked file); on a relation block, the
	// compute's page of zeros (it reads as zeros within the fork's size).
	Tombstone Kind = 4
)

// IsBase reports whether a version of this kind ends a reconstruction: no
// older version is needed to compute the value.
func (k Kind) IsBase() bool { return k != Delta }

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Image:
		return "image"
	case Delta:
		return "delta"
	case WillInit:
		return "will_init"
	case Tombstone:
		return "tombstone"
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

// Version is one version of a key. Versions of a key are ordered by (LSN,
// Seq): LSN is the position the version is visible from (in writeback mode
// the compute's WAL position W), Seq is the timeline's write counter and
// breaks ties, so a later write at the same LSN wins.
//
// Data is owned by whoever holds the Version and must not be modified once
// the Version is handed to a layer.
type Version struct {
	Key  keyspace.Key
	LSN  pg.LSN
	Seq  uint64
	Kind Kind
	Data []byte
}

// Before reports whether v sorts before o in (Key, LSN, Seq) order.
func (v *Version) Before(o *Version) bool {
	if c := v.Key.Compare(o.Key); c != 0 {
		return c < 0
	}
	if v.LSN != o.LSN {
		return v.LSN < o.LSN
	}
	return v.Seq < o.Seq
}

// Newer reports whether v is a later version of the same key than o.
func (v *Version) Newer(o *Version) bool {
	if v.LSN != o.LSN {
		return v.LSN > o.LSN
	}
	return v.Seq > o.Seq
}
