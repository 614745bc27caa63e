package walstore

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

// zeroRange overwrites [from, to) of the WAL on disk with zeros: bytes of a
// flush that had not reached the disk when the machine stopped (segment
// files are preallocated with zeros).
func zeroRange(t *testing.T, dir string, from, to pg.LSN) {
	t.Helper()
	for p := from; p < to; {
		no := uint64(p) / testSeg
		end := min(to, pg.LSN((no+1)*testSeg))
		f, err := os.OpenFile(filepath.Join(dir, "pg_wal", SegmentName(1, no, testSeg)), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, end-p), int64(uint64(p)%testSeg)); err != nil {
			t.Fatal(err)
		}
		f.Close()
		p = end
	}
}

// flipBit flips the bits of mask in the stored WAL byte at lsn (damage).
func flipBit(t *testing.T, dir string, lsn pg.LSN, mask byte) {
	t.Helper()
	path := filepath.Join(dir, "pg_wal", SegmentName(1, uint64(lsn)/testSeg, testSeg))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var x [1]byte
	off := int64(uint64(lsn) % testSeg)
	if _, err := f.ReadAt(x[:], off); err != nil {
		t.Fatal(err)
	}
	x[0] ^= mask
	if _, err := f.WriteAt(x[:], off); err != nil {
		t.Fatal(err)
	}
}

// wantDamage checks that s kept its WAL up to end (damage is not a torn
// tail) and reports exactly the block at bad as corrupt.
func wantDamage(t *testing.T, s *Store, end, bad pg.LSN) {
	t.Helper()
	if s.FlushLSN() != end {
		t.Fatalf("end %s, want %s: WAL after a corrupt block was dropped", s.FlushLSN(), end)
	}
	if got := s.CorruptBlocks(); len(got) != 1 || got[0] != bad {
		t.Fatalf("corrupt blocks %v, want [%s]", got, bad)
	}
}

// TestTornFlushIsNotCorruption: Flush writes the checksum entries out
// before the one fdatasync that makes entries and bytes durable, so a crash
// can leave entries on disk whose bytes are not. Recovery must end the WAL
// where the flush before left it (those bytes were never acknowledged),
// call nothing corrupt, and take new bytes from there.
func TestTornFlushIsNotCorruption(t *testing.T) {
	for _, tc := range []struct {
		name string
		lost func(a, b pg.LSN) (pg.LSN, pg.LSN) // the part of [a, b) that did not reach the disk
		want func(a, b pg.LSN) pg.LSN           // the recovered end
	}{
		{"all of the last flush", func(a, b pg.LSN) (pg.LSN, pg.LSN) { return a, b }, func(a, b pg.LSN) pg.LSN { return a }},
		// Bytes up to the lost 4 KiB page reached the disk: the WAL ends at
		// the start of the block that lost bytes.
		{"its later pages", func(a, b pg.LSN) (pg.LSN, pg.LSN) { return a + 3*BlockSize, b }, func(a, b pg.LSN) pg.LSN {
			return (a + 3*BlockSize) / BlockSize * BlockSize
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			start := pg.LSN(testSeg)
			if err := s.Init(start, 1, 1); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewSource(5))
			want := randBytes(r, 3*BlockSize+1000) // acknowledged: ends inside a block
			if err := s.Write(start, want); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			a := start + pg.LSN(len(want))
			last := randBytes(r, 5*BlockSize+300) // the flush the crash cut
			if err := s.Write(a, last); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			b := a + pg.LSN(len(last))
			s.Close()
			from, to := tc.lost(a, b)
			zeroRange(t, dir, from, to)

			s2 := open(t, dir)
			end := tc.want(a, b)
			if got := s2.FlushLSN(); got != end {
				t.Fatalf("recovered end %s, want %s (acknowledged %s)", got, end, a)
			}
			if bad := s2.CorruptBlocks(); len(bad) != 0 {
				t.Fatalf("torn tail reported as corruption: %v", bad)
			}
			all := append(append([]byte(nil), want...), last...)
			if got := readAll(t, s2, start, end); !bytes.Equal(got, all[:end-start]) {
				t.Fatal("recovered WAL differs")
			}
			// New bytes continue at the end and survive a reopen.
			more := randBytes(r, 2*BlockSize)
			if err := s2.Write(end, more); err != nil {
				t.Fatal(err)
			}
			if _, err := s2.Flush(); err != nil {
				t.Fatal(err)
			}
			s2.Close()
			s3 := open(t, dir)
			fin := end + pg.LSN(len(more))
			if s3.FlushLSN() != fin || len(s3.CorruptBlocks()) != 0 {
				t.Fatalf("after new writes: end %s (want %s), corrupt %v", s3.FlushLSN(), fin, s3.CorruptBlocks())
			}
			if got := readAll(t, s3, start, fin); !bytes.Equal(got, append(all[:end-start:end-start], more...)) {
				t.Fatal("WAL after new writes differs")
			}
		})
	}
}

// TestCorruptionIsNotATornTail: a damaged block of a flush that completed
// (a later flush settled its entries) stays corruption, even above the
// control file's flush LSN, and the WAL after it is kept.
func TestCorruptionIsNotATornTail(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	r := rand.New(rand.NewSource(6))
	var all []byte
	lsn := start
	for _, n := range []int{BlockSize + 100, 4 * BlockSize, 3*BlockSize + 7} {
		b := randBytes(r, n)
		if err := s.Write(lsn, b); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		lsn += pg.LSN(n)
		all = append(all, b...)
	}
	s.Close()
	// Flip a byte in the middle of the second flush's blocks.
	bad := start + 3*BlockSize
	flipBit(t, dir, bad+77, 0x10)
	wantDamage(t, open(t, dir), lsn, bad)
}

// TestOldChecksumFormatConverted: a store written with 8-byte checksum
// entries (before torn-tail witnesses) opens, keeps its WAL, and its
// checksum files are rewritten in the current format.
func TestOldChecksumFormatConverted(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	r := rand.New(rand.NewSource(7))
	want := randBytes(r, testSeg+3*BlockSize+11)
	s.Write(start, want)
	s.Flush()
	s.Close()
	nblocks := testSeg / BlockSize
	for _, no := range []uint64{1, 2} {
		path := filepath.Join(dir, "crc", SegmentName(1, no, testSeg))
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ents, err := readEntries(f, nblocks)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		var old []byte
		for _, e := range ents {
			old = binary.BigEndian.AppendUint32(old, e.cur.n)
			old = binary.BigEndian.AppendUint32(old, e.cur.crc)
		}
		if err := os.WriteFile(path, old, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s2 := open(t, dir)
	end := start + pg.LSN(len(want))
	if s2.FlushLSN() != end || len(s2.CorruptBlocks()) != 0 {
		t.Fatalf("old format: end %s (want %s), corrupt %v", s2.FlushLSN(), end, s2.CorruptBlocks())
	}
	if got := readAll(t, s2, start, end); !bytes.Equal(got, want) {
		t.Fatal("WAL differs after conversion")
	}
	for _, no := range []uint64{1, 2} {
		st, err := os.Stat(filepath.Join(dir, "crc", SegmentName(1, no, testSeg)))
		if err != nil || st.Size() != int64(nblocks*entrySize) {
			t.Fatalf("segment %d checksum file: %v, %v", no, st, err)
		}
	}
}

// TestFlippedByteInLastFlushIsCorruption: a block of the last flush (its
// entry not settled yet) with a flipped byte, no sector of zeros: that is
// damage, not a flush the crash cut.
func TestFlippedByteInLastFlushIsCorruption(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	r := rand.New(rand.NewSource(8))
	b := randBytes(r, 4*BlockSize+500)
	s.Write(start, b)
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	bad := start + BlockSize
	flipBit(t, dir, bad+900, 0x01)
	wantDamage(t, open(t, dir), start+pg.LSN(len(b)), bad)
}

// TestReadWhileFlushClosesSegment: Flush closes a full, flushed segment
// while a Read that took its file is about to read it (the archiver read
// full segments this way and failed with "file already closed"); the Read
// opens the segment again and returns the bytes.
func TestReadWhileFlushClosesSegment(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	r := rand.New(rand.NewSource(9))
	want := randBytes(r, testSeg+100)
	s.Write(start, want)
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	no := uint64(start) / testSeg
	closed := false
	s.readHook = func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if seg, ok := s.segs[no]; ok && !closed {
			seg.close()
			delete(s.segs, no)
			closed = true
		}
	}
	got, err := s.Read(start, testSeg)
	if err != nil {
		t.Fatalf("read while the segment was closed: %v", err)
	}
	if !closed || !bytes.Equal(got, want[:testSeg]) {
		t.Fatalf("closed %v, read back equal %v", closed, bytes.Equal(got, want[:testSeg]))
	}
}
