// Package keyspace defines the pageserver's key space: a fixed-width binary
// Key for every versioned thing a timeline stores (relation pages, relation
// sizes, SLRU segments and other non-relation files of the data directory),
// and the encoding that makes byte order equal key order.
//
// It holds no data and does no I/O. The layout follows Neon's: a Key is 18
// bytes, field1 (1 byte) picks the namespace, and a relation's size key sorts
// right after its last possible block, so a key range covers one relation's
// pages and its size together.
//
//	namespace  field2 (4)   field3 (4)  field4 (4)   field5 (1)  field6 (4)
//	0x00 rel   spc          db          relfilenode  fork        block, 0xFFFFFFFF = size
//	0x01 slru  kind         segno       0            0           block, 0xFFFFFFFF = segment meta
//	0x02 file  path hash (12 bytes of SHA-256 of the path)       0  block, 0xFFFFFFFF = file meta
package keyspace

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/stratadb/strata/sdk/pg"
)

// KeySize is the width of an encoded Key in bytes.
const KeySize = 18

// ErrBadKey is returned when bytes or text do not decode to a Key.
var ErrBadKey = errors.New("keyspace: malformed key")

// Namespaces (field1).
const (
	NSRel  byte = 0x00
	NSSLRU byte = 0x01
	NSFile byte = 0x02
)

// MetaBlock is the field6 value of a relation size key, an SLRU segment meta
// key and a file meta key.
const MetaBlock uint32 = 0xFFFFFFFF

// SLRUKind names an SLRU.
type SLRUKind uint32

// The SLRUs Postgres 15 keeps in the data directory.
const (
	SLRUXact            SLRUKind = 0 // pg_xact
	SLRUMultiXactOffset SLRUKind = 1 // pg_multixact/offsets
	SLRUMultiXactMember SLRUKind = 2 // pg_multixact/members
)

var slruDirs = [...]string{"pg_xact", "pg_multixact/offsets", "pg_multixact/members"}

// Dir returns the SLRU's directory relative to the data directory.
func (k SLRUKind) Dir() string {
	if int(k) < len(slruDirs) {
		return slruDirs[k]
	}
	return fmt.Sprintf("slru%d", uint32(k))
}

// Key is one versioned item of a timeline. Keys compare as byte strings
// (Compare, Less); the zero Key is the smallest key and MaxKey the largest.
type Key [KeySize]byte

// MaxKey is the largest key (all 0xFF); it is the exclusive end of the
// whole key space as a range end.
var MaxKey = func() Key {
	var k Key
	for i := range k {
		k[i] = 0xFF
	}
	return k
}()

func build(ns byte, f2, f3, f4 uint32, f5 byte, f6 uint32) Key {
	var k Key
	k[0] = ns
	binary.BigEndian.PutUint32(k[1:], f2)
	binary.BigEndian.PutUint32(k[5:], f3)
	binary.BigEndian.PutUint32(k[9:], f4)
	k[13] = f5
	binary.BigEndian.PutUint32(k[14:], f6)
	return k
}

// RelBlock returns the key of a relation page.
func RelBlock(p pg.PageKey) Key {
	return build(NSRel, p.Spc, p.DB, p.Rel, byte(p.Fork), p.Block)
}

// RelSize returns the key that holds a relation fork's size in blocks.
func RelSize(r pg.RelTag) Key { return build(NSRel, r.Spc, r.DB, r.Rel, byte(r.Fork), MetaBlock) }

// RelRange returns the range of all keys of relation fork r (pages and size).
func RelRange(r pg.RelTag) Range {
	s := build(NSRel, r.Spc, r.DB, r.Rel, byte(r.Fork), 0)
	return Range{Start: s, End: RelSize(r).Next()}
}

// DBRange returns the range of all relation keys of database db in
// tablespace spc.
func DBRange(spc, db uint32) Range {
	s := build(NSRel, spc, db, 0, 0, 0)
	e := build(NSRel, spc, db, 0xFFFFFFFF, 0xFF, 0xFFFFFFFF).Next()
	return Range{Start: s, End: e}
}

// RelsRange is the range of every relation key.
var RelsRange = Range{Start: Key{NSRel}, End: Key{NSRel + 1}}

// SLRUBlock returns the key of block blk of SLRU segment segno.
func SLRUBlock(kind SLRUKind, segno, blk uint32) Key {
	return build(NSSLRU, uint32(kind), segno, 0, 0, blk)
}

// FileBlock returns the key of block blk of the non-relation file at path
// (relative to the data directory, '/'-separated). SLRU segment files map to
// the SLRU namespace, every other file to the file namespace by path hash.
func FileBlock(path string, blk uint32) Key {
	if kind, seg, ok := ParseSLRUPath(path); ok {
		return SLRUBlock(kind, seg, blk)
	}
	h := sha256.Sum256([]byte(path))
	k := Key{NSFile}
	copy(k[1:13], h[:12])
	binary.BigEndian.PutUint32(k[14:], blk)
	return k
}

// FileMeta returns the key that holds the file's metadata (path and size).
func FileMeta(path string) Key { return FileBlock(path, MetaBlock) }

// FilesRange is the range of every non-relation file key (SLRU and others).
var FilesRange = Range{Start: Key{NSSLRU}, End: Key{NSFile + 1}}

// ParseSLRUPath recognises "pg_xact/0000"-style SLRU segment paths.
func ParseSLRUPath(path string) (SLRUKind, uint32, bool) {
	dir, name, ok := cutLast(path)
	if !ok || len(name) < 4 || len(name) > 6 {
		return 0, 0, false
	}
	for i, d := range slruDirs {
		if d == dir {
			seg, err := strconv.ParseUint(name, 16, 32)
			if err != nil || strings.ToUpper(name) != name {
				return 0, 0, false
			}
			return SLRUKind(i), uint32(seg), true
		}
	}
	return 0, 0, false
}

func cutLast(p string) (string, string, bool) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", "", false
	}
	return p[:i], p[i+1:], true
}

// Namespace returns field1.
func (k Key) Namespace() byte { return k[0] }

// Block returns field6 (the block number, or MetaBlock).
func (k Key) Block() uint32 { return binary.BigEndian.Uint32(k[14:]) }

// IsMeta reports whether k is a relation size, SLRU segment or file meta key.
func (k Key) IsMeta() bool { return k.Block() == MetaBlock }

// IsRelBlock reports whether k is a relation page key.
func (k Key) IsRelBlock() bool { return k[0] == NSRel && !k.IsMeta() }

// IsRelSize reports whether k is a relation size key.
func (k Key) IsRelSize() bool { return k[0] == NSRel && k.IsMeta() }

// Rel returns the relation fork of a relation key.
func (k Key) Rel() pg.RelTag {
	return pg.RelTag{
		Spc:  binary.BigEndian.Uint32(k[1:]),
		DB:   binary.BigEndian.Uint32(k[5:]),
		Rel:  binary.BigEndian.Uint32(k[9:]),
		Fork: pg.ForkNumber(k[13]),
	}
}

// PageKey returns the relation page of a relation block key.
func (k Key) PageKey() pg.PageKey { return k.Rel().Page(k.Block()) }

// WithBlock returns k with field6 replaced.
func (k Key) WithBlock(blk uint32) Key {
	binary.BigEndian.PutUint32(k[14:], blk)
	return k
}

// Compare returns -1, 0 or +1: the order of the keys' bytes (Less).
func (k Key) Compare(o Key) int {
	switch {
	case k.Less(o):
		return -1
	case o.Less(k):
		return 1
	}
	return 0
}

// Less reports k < o, the order of the keys' bytes. It compares three
// big-endian words instead of calling bytes.Compare, and inlines: every
// read compares its key with the key range of each layer
// (layermap.Search), and an image layer pass does that for every key of
// the database.
func (k Key) Less(o Key) bool {
	if a, b := binary.BigEndian.Uint64(k[0:8]), binary.BigEndian.Uint64(o[0:8]); a != b {
		return a < b
	}
	if a, b := binary.BigEndian.Uint64(k[8:16]), binary.BigEndian.Uint64(o[8:16]); a != b {
		return a < b
	}
	return binary.BigEndian.Uint16(k[16:18]) < binary.BigEndian.Uint16(o[16:18])
}

// Less reads a Key as 8+8+2 bytes: a KeySize other than 18 fails to build
// here.
var _ [KeySize - 18]byte
var _ [18 - KeySize]byte

// Next returns the smallest key greater than k (MaxKey stays MaxKey).
func (k Key) Next() Key {
	for i := KeySize - 1; i >= 0; i-- {
		k[i]++
		if k[i] != 0 {
			return k
		}
	}
	return MaxKey
}

// String returns 36 hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey parses the String form.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != KeySize {
		return k, fmt.Errorf("%w: %q", ErrBadKey, s)
	}
	copy(k[:], b)
	return k, nil
}

// FromBytes decodes an 18-byte key.
func FromBytes(b []byte) (Key, error) {
	var k Key
	if len(b) != KeySize {
		return k, fmt.Errorf("%w: %d bytes", ErrBadKey, len(b))
	}
	copy(k[:], b)
	return k, nil
}

// Range is the half-open key range [Start, End).
type Range struct{ Start, End Key }

// All is the whole key space except MaxKey itself.
var All = Range{End: MaxKey}

// Contains reports Start <= k < End.
func (r Range) Contains(k Key) bool { return !k.Less(r.Start) && k.Less(r.End) }

// Overlaps reports whether the ranges share a key.
func (r Range) Overlaps(o Range) bool { return r.Start.Less(o.End) && o.Start.Less(r.End) }

// IsEmpty reports Start >= End.
func (r Range) IsEmpty() bool { return !r.Start.Less(r.End) }

// Covers reports whether o lies inside r.
func (r Range) Covers(o Range) bool { return !o.Start.Less(r.Start) && !r.End.Less(o.End) }

// String returns "start-end".
func (r Range) String() string { return r.Start.String() + "-" + r.End.String() }
