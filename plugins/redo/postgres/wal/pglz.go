package wal

import (
	"errors"
	"hash/crc32"
)

func crc32Table(b []byte, crc uint32) uint32 { return crc32.Update(crc, castagnoli, b) }

// ErrPGLZ is returned for pglz input that does not decode.
var ErrPGLZ = errors.New("wal: corrupt pglz data")

// PGLZDecompress decodes PostgreSQL's pglz format from src into dst and
// returns the number of bytes written. It fails unless src decodes into
// exactly len(dst) bytes with no input left over, as Postgres requires for
// page images.
//
// The format is a sequence of groups: a control byte whose bits, lowest
// first, say for each of up to eight items whether it is a literal byte (0)
// or a back-reference (1). A back-reference is two bytes, 4 bits of length-3
// and 12 bits of offset, with one extra length byte when the 4-bit length is
// 15 (length 18 and more).
func PGLZDecompress(dst, src []byte) (int, error) {
	sp, dp := 0, 0
	for sp < len(src) && dp < len(dst) {
		ctrl := src[sp]
		sp++
		for bit := 0; bit < 8 && sp < len(src) && dp < len(dst); bit++ {
			if ctrl&(1<<bit) == 0 {
				dst[dp] = src[sp]
				dp++
				sp++
				continue
			}
			if sp+1 >= len(src) {
				return dp, ErrPGLZ
			}
			length := int(src[sp]&0x0f) + 3
			off := int(src[sp]&0xf0)<<4 | int(src[sp+1])
			sp += 2
			if length == 18 {
				if sp >= len(src) {
					return dp, ErrPGLZ
				}
				length += int(src[sp])
				sp++
			}
			if off == 0 || off > dp {
				return dp, ErrPGLZ
			}
			if length > len(dst)-dp {
				length = len(dst) - dp
			}
			for i := 0; i < length; i++ { // overlapping copies repeat the pattern
				dst[dp] = dst[dp-off]
				dp++
			}
		}
	}
	if dp != len(dst) || sp != len(src) {
		return dp, ErrPGLZ
	}
	return dp, nil
}
