// Package pgcontrol knows the few facts of PostgreSQL 15's on-disk layout
// that strata rewrites: where pg_control's CRC-32C lies and how to change
// a field under it, and where a WAL segment's long page header keeps the
// system identifier. The compute agent, the pageserver and the test
// servers of internal/pgtest share it.
package pgcontrol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

const (
	// CRCOffset is offsetof(ControlFileData, crc): the CRC-32C of the
	// bytes before it.
	CRCOffset = 288
	// Version is PostgreSQL 15's pg_control_version (at offset 8).
	Version = 1300
	// SystemIDOffset is where pg_control keeps the system identifier (its
	// first field).
	SystemIDOffset = 0
	// WALSystemIDOffset is where a WAL segment's first page, whose header
	// is a long one, keeps the system identifier (xlp_sysid).
	WALSystemIDOffset = 24
)

// ErrBad: the bytes are not a PostgreSQL 15 pg_control with a matching
// CRC.
var ErrBad = errors.New("pgcontrol: not a PostgreSQL 15 pg_control")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Check checks that b is PostgreSQL 15's pg_control: its size, version
// and CRC (which also checks the layout the offsets assume).
func Check(b []byte) error {
	if len(b) < CRCOffset+4 {
		return fmt.Errorf("%w: %d bytes", ErrBad, len(b))
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != Version {
		return fmt.Errorf("%w: pg_control_version %d", ErrBad, v)
	}
	if got, want := crc32.Checksum(b[:CRCOffset], castagnoli), binary.LittleEndian.Uint32(b[CRCOffset:]); got != want {
		return fmt.Errorf("%w: CRC %08x, stored %08x", ErrBad, got, want)
	}
	return nil
}

// Rewrite checks b and returns a copy that change edits, with its CRC
// updated.
func Rewrite(b []byte, change func(out []byte)) ([]byte, error) {
	if err := Check(b); err != nil {
		return nil, err
	}
	out := bytes.Clone(b)
	change(out)
	binary.LittleEndian.PutUint32(out[CRCOffset:], crc32.Checksum(out[:CRCOffset], castagnoli))
	return out, nil
}
