package storetest

import (
	"encoding/binary"
	"io"
)

// Pattern is a deterministic, position-addressable byte stream: byte i of the
// stream for a seed depends only on (seed, i). It lets the suite write and
// verify objects of hundreds of MiB without holding them in memory, and check
// any range of them directly.
type Pattern struct {
	Seed uint64
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Fill writes the stream bytes starting at off into b.
func (p Pattern) Fill(off int64, b []byte) {
	var tmp [8]byte
	for len(b) > 0 {
		blk := uint64(off / 8)
		in := int(off % 8)
		v := splitmix(p.Seed ^ (blk * 0xd1b54a32d192ed03))
		if in == 0 && len(b) >= 8 {
			binary.LittleEndian.PutUint64(b, v)
			b, off = b[8:], off+8
			continue
		}
		binary.LittleEndian.PutUint64(tmp[:], v)
		n := copy(b, tmp[in:])
		b, off = b[n:], off+int64(n)
	}
}

// Bytes returns n stream bytes starting at off.
func (p Pattern) Bytes(off, n int64) []byte {
	b := make([]byte, n)
	p.Fill(off, b)
	return b
}

// Reader returns a reader of the first size bytes of the stream.
func (p Pattern) Reader(size int64) io.Reader {
	return &patternReader{p: p, size: size}
}

type patternReader struct {
	p         Pattern
	pos, size int64
}

func (r *patternReader) Read(b []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if rem := r.size - r.pos; int64(len(b)) > rem {
		b = b[:rem]
	}
	r.p.Fill(r.pos, b)
	r.pos += int64(len(b))
	return len(b), nil
}
