package layer

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// FileKind distinguishes delta layers from image layers.
type FileKind uint8

const (
	// DeltaLayer holds versions of a key range over an LSN range.
	DeltaLayer FileKind = 1
	// ImageLayer holds one base version (image or tombstone) of every
	// existing key of a key range at one LSN.
	ImageLayer FileKind = 2
)

// Desc describes a layer file: its kind, key range and LSN range
// [LSNStart, LSNEnd). An image layer at LSN X has LSNStart = X and
// LSNEnd = X+1. Name is unique per timeline.
type Desc struct {
	Name     string         `json:"name"`
	Kind     FileKind       `json:"kind"`
	Keys     keyspace.Range `json:"-"`
	KeyStart string         `json:"key_start"`
	KeyEnd   string         `json:"key_end"`
	LSNStart pg.LSN         `json:"lsn_start"`
	LSNEnd   pg.LSN         `json:"lsn_end"`
	Size     int64          `json:"size"`
	Count    int64          `json:"count"`
	MaxSeq   uint64         `json:"max_seq"`
	// Level is 0 for delta layers written by a flush, 1 for delta layers
	// written by compaction; it is kept in the manifest, not in the file.
	Level int `json:"level"`
	// Uploaded is set once the object store holds the file (local manifest only).
	Uploaded bool `json:"uploaded,omitempty"`
}

// Fill sets Keys from KeyStart/KeyEnd after decoding from JSON.
func (d *Desc) Fill() error {
	s, err := keyspace.ParseKey(d.KeyStart)
	if err != nil {
		return err
	}
	e, err := keyspace.ParseKey(d.KeyEnd)
	if err != nil {
		return err
	}
	d.Keys = keyspace.Range{Start: s, End: e}
	return nil
}

// IsDelta reports d.Kind == DeltaLayer.
func (d *Desc) IsDelta() bool { return d.Kind == DeltaLayer }

// NewName returns a unique file name for a layer with these ranges.
func NewName(kind FileKind, keys keyspace.Range, lsnStart, lsnEnd pg.LSN) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	k := "delta"
	if kind == ImageLayer {
		k = "image"
	}
	return fmt.Sprintf("%s-%s__%016X-%016X__%s.%s", keys.Start, keys.End, uint64(lsnStart), uint64(lsnEnd), hex.EncodeToString(r[:]), k)
}

// ValidName reports whether s looks like a name from NewName (used to
// reject stray files in a layer directory).
func ValidName(s string) bool {
	return (strings.HasSuffix(s, ".delta") || strings.HasSuffix(s, ".image")) && strings.Count(s, "__") == 2 && !strings.ContainsAny(s, "/\\")
}
