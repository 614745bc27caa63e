package layer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Layer file format (all integers big-endian):
//
//	values   the Data of every version, back to back
//	index    Count entries of entrySize bytes, sorted by (key, LSN, Seq):
//	         key[18] lsn[8] seq[8] kind[1] off[8] len[4] crc32c(data)[4]
//	footer   footerSize bytes: magic[8] kind[1] pad[7] keyStart[18]
//	         keyEnd[18] lsnStart[8] lsnEnd[8] count[8] indexOff[8]
//	         maxSeq[8] indexCRC[4] footerCRC[4] (CRC-32C of the bytes before it)

const (
	magic      = "STRLAYR1"
	entrySize  = keyspace.KeySize + 8 + 8 + 1 + 8 + 4 + 4
	footerSize = 8 + 8 + 2*keyspace.KeySize + 8 + 8 + 8 + 8 + 8 + 4 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Writer writes one layer file. Add versions in (Key, LSN, Seq) order, then
// Finish. A Writer is not safe for concurrent use.
type Writer struct {
	w      *bufio.Writer
	kind   FileKind
	off    int64
	index  []byte
	last   Version
	count  int64
	maxSeq uint64
	first  keyspace.Key
	lsnMin pg.LSN
	lsnMax pg.LSN
}

// NewWriter starts a layer file of the given kind on w.
func NewWriter(w io.Writer, kind FileKind) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256<<10), kind: kind, lsnMin: ^pg.LSN(0)}
}

// Count returns the number of versions added so far.
func (w *Writer) Count() int64 { return w.count }

// Size returns the number of bytes the file would have if finished now.
func (w *Writer) Size() int64 { return w.off + int64(len(w.index)) + footerSize }

// Add appends a version.
func (w *Writer) Add(v *Version) error {
	if w.count > 0 && !w.last.Before(v) {
		return fmt.Errorf("%w: %s@%s/%d after %s@%s/%d", ErrOrder, v.Key, v.LSN, v.Seq, w.last.Key, w.last.LSN, w.last.Seq)
	}
	if w.count == 0 {
		w.first = v.Key
	}
	if _, err := w.w.Write(v.Data); err != nil {
		return err
	}
	var e [entrySize]byte
	copy(e[:], v.Key[:])
	p := keyspace.KeySize
	binary.BigEndian.PutUint64(e[p:], uint64(v.LSN))
	binary.BigEndian.PutUint64(e[p+8:], v.Seq)
	e[p+16] = byte(v.Kind)
	binary.BigEndian.PutUint64(e[p+17:], uint64(w.off))
	binary.BigEndian.PutUint32(e[p+25:], uint32(len(v.Data)))
	binary.BigEndian.PutUint32(e[p+29:], crc32.Checksum(v.Data, castagnoli))
	w.index = append(w.index, e[:]...)
	w.off += int64(len(v.Data))
	w.last = Version{Key: v.Key, LSN: v.LSN, Seq: v.Seq}
	w.count++
	w.maxSeq = max(w.maxSeq, v.Seq)
	w.lsnMin = min(w.lsnMin, v.LSN)
	w.lsnMax = max(w.lsnMax, v.LSN)
	return nil
}

// Finish writes the index and footer and flushes. keys and the LSN range
// must contain every version added; a zero keys range means "exactly the
// keys added", lsnEnd 0 means "last LSN added + 1". It returns the Desc
// (without Name).
func (w *Writer) Finish(keys keyspace.Range, lsnStart, lsnEnd pg.LSN) (Desc, error) {
	if keys == (keyspace.Range{}) {
		keys = keyspace.Range{Start: w.first, End: w.last.Key.Next()}
	}
	if lsnEnd == 0 {
		lsnStart, lsnEnd = w.lsnMin, w.lsnMax+1
		if w.count == 0 {
			lsnStart, lsnEnd = 0, 1
		}
	}
	if w.count > 0 && (w.first.Less(keys.Start) || !w.last.Key.Less(keys.End) || w.lsnMin < lsnStart || w.lsnMax >= lsnEnd) {
		return Desc{}, fmt.Errorf("layer: Finish ranges %s %s-%s do not cover the versions", keys, lsnStart, lsnEnd)
	}
	indexOff := w.off
	if _, err := w.w.Write(w.index); err != nil {
		return Desc{}, err
	}
	var f [footerSize]byte
	copy(f[:], magic)
	f[8] = byte(w.kind)
	p := 16
	copy(f[p:], keys.Start[:])
	copy(f[p+18:], keys.End[:])
	p += 36
	for _, v := range []uint64{uint64(lsnStart), uint64(lsnEnd), uint64(w.count), uint64(indexOff), w.maxSeq} {
		binary.BigEndian.PutUint64(f[p:], v)
		p += 8
	}
	binary.BigEndian.PutUint32(f[p:], crc32.Checksum(w.index, castagnoli))
	binary.BigEndian.PutUint32(f[p+4:], crc32.Checksum(f[:p+4], castagnoli))
	if _, err := w.w.Write(f[:]); err != nil {
		return Desc{}, err
	}
	if err := w.w.Flush(); err != nil {
		return Desc{}, err
	}
	d := Desc{Kind: w.kind, Keys: keys, LSNStart: lsnStart, LSNEnd: lsnEnd, Size: w.Size(), Count: w.count, MaxSeq: w.maxSeq}
	d.KeyStart, d.KeyEnd = keys.Start.String(), keys.End.String()
	return d, nil
}

// Source is where a Reader reads a layer file from. Implementations must
// allow concurrent ReadAt calls.
type Source interface {
	io.ReaderAt
	Size() int64
}

// BytesSource is a Source over a byte slice.
type BytesSource []byte

// ReadAt implements io.ReaderAt.
func (b BytesSource) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(b).ReadAt(p, off)
}

// Size implements Source.
func (b BytesSource) Size() int64 { return int64(len(b)) }

// RemoteSource reads a layer file in place from an object store with
// ranged reads.
type RemoteSource struct {
	Ctx   context.Context
	Store objectstore.Store
	Key   string
	Len   int64
}

// ReadAt implements io.ReaderAt with one GetRange per call.
func (r *RemoteSource) ReadAt(p []byte, off int64) (int, error) {
	rc, err := r.Store.GetRange(r.Ctx, r.Key, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, p)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return n, err
}

// Size implements Source.
func (r *RemoteSource) Size() int64 { return r.Len }

// Reader reads a layer file. It keeps the index in memory; values are read
// from the Source on demand and checked against their CRC. Safe for
// concurrent use.
type Reader struct {
	src    Source
	desc   Desc
	index  []byte
	count  int
	values int64
}

// Entry is an index entry: a version without its data.
type Entry struct {
	Key  keyspace.Key
	LSN  pg.LSN
	Seq  uint64
	Kind Kind
	off  int64
	len  uint32
	crc  uint32
}

// Open reads and checks the footer and index of a layer file.
func Open(src Source) (*Reader, error) {
	size := src.Size()
	if size < footerSize {
		return nil, fmt.Errorf("%w: %d bytes is shorter than a footer", ErrCorrupt, size)
	}
	var f [footerSize]byte
	if _, err := src.ReadAt(f[:], size-footerSize); err != nil && err != io.EOF {
		return nil, err
	}
	if string(f[:8]) != magic {
		return nil, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	if crc32.Checksum(f[:footerSize-4], castagnoli) != binary.BigEndian.Uint32(f[footerSize-4:]) {
		return nil, fmt.Errorf("%w: footer checksum", ErrCorrupt)
	}
	d := Desc{Kind: FileKind(f[8]), Size: size}
	copy(d.Keys.Start[:], f[16:])
	copy(d.Keys.End[:], f[34:])
	p := 52
	u := func() uint64 { v := binary.BigEndian.Uint64(f[p:]); p += 8; return v }
	d.LSNStart, d.LSNEnd = pg.LSN(u()), pg.LSN(u())
	d.Count = int64(u())
	indexOff := int64(u())
	d.MaxSeq = u()
	d.KeyStart, d.KeyEnd = d.Keys.Start.String(), d.Keys.End.String()
	ilen := d.Count * entrySize
	if indexOff < 0 || indexOff+ilen+footerSize != size {
		return nil, fmt.Errorf("%w: index at %d with %d entries does not fit %d bytes", ErrCorrupt, indexOff, d.Count, size)
	}
	idx := make([]byte, ilen)
	if _, err := src.ReadAt(idx, indexOff); err != nil && !(err == io.EOF && ilen == 0) {
		return nil, err
	}
	if crc32.Checksum(idx, castagnoli) != binary.BigEndian.Uint32(f[p:]) {
		return nil, fmt.Errorf("%w: index checksum", ErrCorrupt)
	}
	return &Reader{src: src, desc: d, index: idx, count: int(d.Count), values: indexOff}, nil
}

// Desc returns the layer's description as its footer says (without Name).
func (r *Reader) Desc() Desc { return r.desc }

// IndexBytes returns the memory the index takes.
func (r *Reader) IndexBytes() int { return len(r.index) }

func (r *Reader) key(i int) []byte { return r.index[i*entrySize : i*entrySize+keyspace.KeySize] }

// Entry returns index entry i (0 <= i < Len()).
func (r *Reader) Entry(i int) Entry {
	e := r.index[i*entrySize : (i+1)*entrySize]
	var en Entry
	copy(en.Key[:], e)
	p := keyspace.KeySize
	en.LSN = pg.LSN(binary.BigEndian.Uint64(e[p:]))
	en.Seq = binary.BigEndian.Uint64(e[p+8:])
	en.Kind = Kind(e[p+16])
	en.off = int64(binary.BigEndian.Uint64(e[p+17:]))
	en.len = binary.BigEndian.Uint32(e[p+25:])
	en.crc = binary.BigEndian.Uint32(e[p+29:])
	return en
}

// Len returns the number of versions.
func (r *Reader) Len() int { return r.count }

// Seek returns the index of the first entry with key >= k.
func (r *Reader) Seek(k keyspace.Key) int {
	return sort.Search(r.count, func(i int) bool { return bytes.Compare(r.key(i), k[:]) >= 0 })
}

// Versions returns the index entries of key k with LSN <= upto, oldest first.
func (r *Reader) Versions(k keyspace.Key, upto pg.LSN) []Entry {
	var out []Entry
	for i := r.Seek(k); i < r.count && bytes.Equal(r.key(i), k[:]); i++ {
		e := r.Entry(i)
		if e.LSN > upto {
			break
		}
		out = append(out, e)
	}
	return out
}

// ReadVersions returns what a read of k at upto needs from this layer:
// the index entries with LSN <= upto from the newest base version on (all
// of them when none is a base), oldest first. Its cost does not grow with
// the key's older history in the file.
func (r *Reader) ReadVersions(k keyspace.Key, upto pg.LSN) []Entry {
	lo := r.Seek(k)
	// hi: one past the last entry of k at or below upto.
	hi := lo + sort.Search(r.count-lo, func(i int) bool {
		j := lo + i
		if !bytes.Equal(r.key(j), k[:]) {
			return true
		}
		return pg.LSN(binary.BigEndian.Uint64(r.index[j*entrySize+keyspace.KeySize:])) > upto
	})
	start := lo
	for i := hi - 1; i >= lo; i-- {
		if Kind(r.index[i*entrySize+keyspace.KeySize+16]).IsBase() {
			start = i
			break
		}
	}
	if start >= hi {
		return nil
	}
	out := make([]Entry, 0, hi-start)
	for i := start; i < hi; i++ {
		out = append(out, r.Entry(i))
	}
	return out
}

// Read returns the data of an entry, checking its CRC. The caller owns
// the returned slice.
func (r *Reader) Read(e Entry) ([]byte, error) {
	if e.off < 0 || e.off+int64(e.len) > r.values {
		return nil, fmt.Errorf("%w: value out of bounds", ErrCorrupt)
	}
	buf := make([]byte, e.len)
	if e.len > 0 {
		if _, err := r.src.ReadAt(buf, e.off); err != nil && err != io.EOF {
			return nil, err
		}
	}
	if crc32.Checksum(buf, castagnoli) != e.crc {
		return nil, fmt.Errorf("%w: value checksum of %s@%s", ErrCorrupt, e.Key, e.LSN)
	}
	return buf, nil
}

// Version reads an entry into a full Version.
func (r *Reader) Version(e Entry) (Version, error) {
	d, err := r.Read(e)
	return Version{Key: e.Key, LSN: e.LSN, Seq: e.Seq, Kind: e.Kind, Data: d}, err
}
