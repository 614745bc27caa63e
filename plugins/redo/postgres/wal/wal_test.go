package wal

import (
	"bytes"
	"path/filepath"

	"encoding/binary"
	"errors"
	"github.com/stratadb/strata/internal/pgtest"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

// buildWAL writes records into WAL pages starting at the segment start
// base, splitting them across pages as Postgres does, and returns the
// bytes and the records' start LSNs.
func buildWAL(t testing.TB, base pg.LSN, bodies [][]byte) ([]byte, []pg.LSN) {
	t.Helper()
	var out []byte
	pos := base
	var prev pg.LSN
	var starts []pg.LSN
	newPage := func(rem int) {
		hdr := make([]byte, shortHeaderSize)
		info := uint16(0)
		if uint64(pos)%pg.WALSegmentSize == 0 {
			hdr = make([]byte, longHeaderSize)
			info |= xlpLongHeader
			binary.LittleEndian.PutUint64(hdr[24:], 42)
			binary.LittleEndian.PutUint32(hdr[32:], pg.WALSegmentSize)
			binary.LittleEndian.PutUint32(hdr[36:], PageSize)
		}
		if rem > 0 {
			info |= xlpFirstIsContRecord
		}
		binary.LittleEndian.PutUint16(hdr, pageMagic)
		binary.LittleEndian.PutUint16(hdr[2:], info)
		binary.LittleEndian.PutUint32(hdr[4:], 1)
		binary.LittleEndian.PutUint64(hdr[8:], uint64(pos))
		binary.LittleEndian.PutUint32(hdr[16:], uint32(rem))
		out = append(out, hdr...)
		pos += pg.LSN(len(hdr))
	}
	for _, body := range bodies {
		if uint64(pos)%PageSize == 0 {
			newPage(0)
		}
		rec := make([]byte, RecordHeaderSize+len(body))
		copy(rec[RecordHeaderSize:], body)
		binary.LittleEndian.PutUint32(rec, uint32(len(rec)))
		binary.LittleEndian.PutUint32(rec[4:], 7)
		binary.LittleEndian.PutUint64(rec[8:], uint64(prev))
		rec[16] = 0x00
		rec[17] = byte(RmHeap)
		crc := crc32.Update(0, castagnoli, rec[RecordHeaderSize:])
		crc = crc32.Update(crc, castagnoli, rec[:20])
		binary.LittleEndian.PutUint32(rec[20:], crc)
		starts = append(starts, pos)
		prev = pos
		for len(rec) > 0 {
			room := PageSize - int(uint64(pos)%PageSize)
			n := min(room, len(rec))
			out = append(out, rec[:n]...)
			pos += pg.LSN(n)
			rec = rec[n:]
			if len(rec) > 0 {
				newPage(len(rec))
			}
		}
		for uint64(pos)%8 != 0 {
			out = append(out, 0)
			pos++
		}
	}
	for uint64(pos)%PageSize != 0 {
		out = append(out, 0)
		pos++
	}
	out = append(out, make([]byte, PageSize)...) // a zeroed page: end of WAL
	return out, starts
}

// heapBody returns a record body with one block reference carrying data
// and main data of n bytes.
func heapBody(n int) []byte {
	var b []byte
	b = append(b, 0, 0x20)                     // block 0, main fork, HAS_DATA
	b = binary.LittleEndian.AppendUint16(b, 5) // data length
	b = binary.LittleEndian.AppendUint32(b, 1663)
	b = binary.LittleEndian.AppendUint32(b, 5)
	b = binary.LittleEndian.AppendUint32(b, 16384)
	b = binary.LittleEndian.AppendUint32(b, 9) // block 9
	if n < 256 {
		b = append(b, blockIDDataShort, byte(n))
	} else {
		b = append(b, blockIDDataLong)
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
	}
	b = append(b, 1, 2, 3, 4, 5)
	for i := 0; i < n; i++ {
		b = append(b, byte(i))
	}
	return b
}

func TestReaderCrossPageRecords(t *testing.T) {
	base := pg.LSN(3 * pg.WALSegmentSize)
	sizes := []int{10, 20000, 3, 8100, 40}
	var bodies [][]byte
	for _, n := range sizes {
		bodies = append(bodies, heapBody(n))
	}
	data, starts := buildWAL(t, base, bodies)
	for _, src := range []Source{&BytesSource{Start: base, Data: data}, NewStreamSource(bytes.NewReader(data), base, 0)} {
		rd := NewReader(src, base)
		for i := range bodies {
			r, err := rd.Next()
			if err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
			if r.LSN != starts[i] {
				t.Fatalf("record %d at %s, want %s", i, r.LSN, starts[i])
			}
			if len(r.Blocks) != 1 || r.Blocks[0].Page.Block != 9 || r.Blocks[0].Page.Rel != 16384 || string(r.Blocks[0].Data) != "\x01\x02\x03\x04\x05" {
				t.Fatalf("record %d: bad block ref %+v", i, r.Blocks)
			}
			if len(r.MainData) != sizes[i] || (sizes[i] > 0 && r.MainData[sizes[i]-1] != byte(sizes[i]-1)) {
				t.Fatalf("record %d: main data %d bytes", i, len(r.MainData))
			}
		}
		if _, err := rd.Next(); !errors.Is(err, ErrEndOfWAL) {
			t.Fatalf("after the last record: %v, want ErrEndOfWAL", err)
		}
	}
	// Starting at a page that begins with a continuation skips the tail.
	second := starts[1]
	pageAfter := second - second%PageSize + PageSize
	rd := NewReader(&BytesSource{Start: base, Data: data}, pageAfter)
	r, err := rd.Next()
	if err != nil || r.LSN <= pageAfter {
		t.Fatalf("start mid-record: %v %v", r, err)
	}
}

// TestReaderReset: a reader reset to an LSN returns what a new reader from
// there returns, also after it met the end of the WAL and the WAL grew; the
// end of WAL is ErrEndOfWAL and names where the reader looked.
func TestReaderReset(t *testing.T) {
	base := pg.LSN(3 * pg.WALSegmentSize)
	var bodies [][]byte
	for _, n := range []int{10, 20000, 3, 8100, 40, 700} {
		bodies = append(bodies, heapBody(n))
	}
	data, starts := buildWAL(t, base, bodies)
	// The WAL written so far: the first three records, zeros after them.
	cut := int(starts[3] - base)
	partial := append(bytes.Clone(data[:cut]), make([]byte, len(data)-cut)...)
	src := &BytesSource{Start: base, Data: partial}
	rd := NewReader(src, base)
	for i := 0; i < 3; i++ {
		if r, err := rd.Next(); err != nil || r.LSN != starts[i] {
			t.Fatalf("record %d: %v %v", i, r, err)
		}
	}
	_, err := rd.Next()
	if !errors.Is(err, ErrEndOfWAL) || !strings.Contains(err.Error(), starts[3].String()) {
		t.Fatalf("end of the WAL written so far: %v, want ErrEndOfWAL naming %s", err, starts[3])
	}
	src.Data = data // the rest is written
	for _, from := range []int{3, 1, 0} {
		rd.Reset(starts[from])
		fresh := NewReader(&BytesSource{Start: base, Data: data}, starts[from])
		for i := from; i <= len(bodies); i++ {
			got, gerr := rd.Next()
			want, werr := fresh.Next()
			if (gerr == nil) != (werr == nil) {
				t.Fatalf("from %d, record %d: reset reader %v, new reader %v", from, i, gerr, werr)
			}
			if gerr != nil {
				if gerr.Error() != werr.Error() || !errors.Is(gerr, ErrEndOfWAL) || i != len(bodies) {
					t.Fatalf("from %d, record %d: %v / %v", from, i, gerr, werr)
				}
				break
			}
			if got.LSN != want.LSN || got.EndLSN != want.EndLSN || got.Prev != want.Prev ||
				!bytes.Equal(got.MainData, want.MainData) || len(got.Blocks) != len(want.Blocks) {
				t.Fatalf("from %d, record %d: %+v, want %+v", from, i, got, want)
			}
		}
	}
	// An empty page and a page of a recycled segment are ends of WAL too.
	zero := NewReader(&BytesSource{Start: base, Data: make([]byte, PageSize)}, base)
	if _, err := zero.Next(); !errors.Is(err, ErrEndOfWAL) || !strings.Contains(err.Error(), "empty page at "+base.String()) {
		t.Fatalf("empty page: %v", err)
	}
	old := bytes.Clone(data[:PageSize])
	binary.LittleEndian.PutUint64(old[8:], uint64(base+pg.WALSegmentSize))
	rec := NewReader(&BytesSource{Start: base, Data: old}, base)
	if _, err := rec.Next(); !errors.Is(err, ErrEndOfWAL) || !strings.Contains(err.Error(), "unexpected page address "+(base+pg.WALSegmentSize).String()) {
		t.Fatalf("recycled page: %v", err)
	}
}

// TestReaderHeadersOnly: a headers-only reader returns the records a full
// reader returns, header for header, without their bodies; it still finds
// a bad CRC, keeps the mode across Reset, and passes a record whose body
// a full reader refuses (so the body was not decoded).
func TestReaderHeadersOnly(t *testing.T) {
	base := pg.LSN(3 * pg.WALSegmentSize)
	badBody := []byte{0xAA, 1, 2, 3} // block ID 0xAA: no such block reference
	bodies := [][]byte{heapBody(10), heapBody(20000), heapBody(3), heapBody(8100), badBody, heapBody(40)}
	data, starts := buildWAL(t, base, bodies)
	full := NewReader(&BytesSource{Start: base, Data: data}, base)
	hdrs := NewReader(&BytesSource{Start: base, Data: data}, base)
	hdrs.HeadersOnly()
	for pass := 0; pass < 2; pass++ {
		for i := range bodies {
			h, err := hdrs.Next()
			if err != nil {
				t.Fatalf("pass %d, record %d: %v", pass, i, err)
			}
			if len(h.Blocks) != 0 || h.MainData != nil || h.LSN != starts[i] {
				t.Fatalf("pass %d, record %d at %s: %d blocks, %d bytes of main data", pass, i, h.LSN, len(h.Blocks), len(h.MainData))
			}
			hv := *h
			f, err := full.Next()
			if i == 4 {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("full reader on a bad body: %v, want ErrCorrupt", err)
				}
				full.Reset(starts[5])
				continue
			}
			if err != nil {
				t.Fatalf("pass %d, record %d: full reader: %v", pass, i, err)
			}
			if hv.LSN != f.LSN || hv.EndLSN != f.EndLSN || hv.Prev != f.Prev || hv.TotLen != f.TotLen || hv.XID != f.XID ||
				hv.Info != f.Info || hv.RmID != f.RmID || hv.CRC != f.CRC || !bytes.Equal(hv.Raw, f.Raw) {
				t.Fatalf("pass %d, record %d: headers-only %+v, full %+v", pass, i, hv, *f)
			}
		}
		if _, err := hdrs.Next(); !errors.Is(err, ErrEndOfWAL) {
			t.Fatalf("pass %d: after the last record: %v", pass, err)
		}
		hdrs.Reset(base)
		full.Reset(base)
	}
	bad := bytes.Clone(data)
	bad[int(starts[2]-base)+RecordHeaderSize+1] ^= 0xFF
	hdrs = NewReader(&BytesSource{Start: base, Data: bad}, starts[2])
	hdrs.HeadersOnly()
	if _, err := hdrs.Next(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("headers-only reader on a bad CRC: %v, want ErrCorrupt", err)
	}
}

func TestReaderCorruptionNamesLSN(t *testing.T) {
	base := pg.LSN(pg.WALSegmentSize)
	data, starts := buildWAL(t, base, [][]byte{heapBody(10), heapBody(300), heapBody(10)})
	bad := append([]byte(nil), data...)
	off := int(starts[1]-base) + RecordHeaderSize + 30
	bad[off] ^= 0xff
	rd := NewReader(&BytesSource{Start: base, Data: bad}, base)
	if _, err := rd.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := rd.Next()
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), starts[1].String()) {
		t.Fatalf("corrupt record: %v, want ErrCorrupt naming %s", err, starts[1])
	}
	// A bad page magic is an unknown format.
	bad = append([]byte(nil), data...)
	bad[0] = 0x99
	if _, err := NewReader(&BytesSource{Start: base, Data: bad}, base).Next(); !errors.Is(err, ErrUnknownFormat) {
		t.Fatalf("bad magic: %v", err)
	}
}

func TestPGLZ(t *testing.T) {
	// literal "abc", then a back-reference of length 6 at offset 3: "abcabcabc"
	src := []byte{0x08, 'a', 'b', 'c', 0x03, 0x03}
	dst := make([]byte, 9)
	if n, err := PGLZDecompress(dst, src); err != nil || n != 9 || string(dst) != "abcabcabc" {
		t.Fatalf("got %q %d %v", dst, n, err)
	}
	if _, err := PGLZDecompress(make([]byte, 10), src); err == nil {
		t.Fatal("short output accepted")
	}
	if _, err := PGLZDecompress(make([]byte, 9), []byte{0x01, 0x03, 0x09}); err == nil {
		t.Fatal("reference before the start accepted")
	}
}

// realSeeds runs initdb (when PostgreSQL 15 is installed) and returns its
// first WAL page, a page from the middle, and a few whole records, some
// with full page images.
func realSeeds(f *testing.F) [][]byte {
	if pgtest.Available() != nil {
		return nil
	}
	dir := pgtest.MkdirOwned(f, "strata-fuzz-")
	cmd, err := pgtest.Command("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "--no-sync", "-A", "trust")
	if err != nil {
		f.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		f.Fatalf("initdb: %v\n%s", err, out)
	}
	src, err := OpenDir(filepath.Join(dir, "data", "pg_wal"))
	if err != nil {
		f.Fatal(err)
	}
	defer src.Close()
	segs := src.Segments()
	first := pg.LSN(segs[0] * src.SegmentSize())
	var seeds [][]byte
	for _, off := range []pg.LSN{0, 40 * PageSize} {
		p := make([]byte, PageSize)
		if src.ReadPage(first+off, p) == nil {
			seeds = append(seeds, p)
		}
	}
	rd := NewReader(src, first)
	fpis, plain := 0, 0
	for fpis < 3 || plain < 3 {
		r, err := rd.Next()
		if err != nil {
			break
		}
		if r.FPILen() > 0 && fpis < 3 {
			seeds = append(seeds, append([]byte(nil), r.Raw...))
			fpis++
		} else if r.FPILen() == 0 && len(r.Blocks) > 0 && plain < 3 {
			seeds = append(seeds, append([]byte(nil), r.Raw...))
			plain++
		}
	}
	if fpis == 0 {
		f.Fatal("initdb's WAL has no full page image")
	}
	return seeds
}

func FuzzDecode(f *testing.F) {
	base := pg.LSN(pg.WALSegmentSize)
	data, _ := buildWAL(f, base, [][]byte{heapBody(10), heapBody(100), heapBody(0)})
	f.Add(data[:PageSize])
	f.Add(heapBody(5))
	// Seeds from a real segment: the WAL initdb writes. Inputs stay at one
	// page or one record, as the fuzzing engine slows down on large inputs.
	for _, seed := range realSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As a page stream.
		buf := append([]byte(nil), b...)
		for len(buf)%PageSize != 0 {
			buf = append(buf, 0)
		}
		rd := NewReader(&BytesSource{Start: base, Data: buf}, base)
		for i := 0; i < 100; i++ {
			r, err := rd.Next()
			if err != nil {
				break
			}
			for j := range r.Blocks {
				if r.Blocks[j].HasImage {
					_ = r.Blocks[j].RestoreImage(make([]byte, pg.BlockSize))
				}
			}
		}
		// As a record.
		if len(b) >= 4 {
			rec := append([]byte(nil), b...)
			binary.LittleEndian.PutUint32(rec, uint32(len(rec)))
			if r, err := Decode(base+64, base+64+pg.LSN(len(rec)), rec); err == nil {
				for j := range r.Blocks {
					if r.Blocks[j].HasImage {
						_ = r.Blocks[j].RestoreImage(make([]byte, pg.BlockSize))
					}
				}
			}
		}
	})
}
