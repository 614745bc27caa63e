package walstore

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/sdk/pg"
)

const testSeg = 64 << 10

// open opens the store in dir as a safekeeper does by default: with raw
// system calls on the write and flush path (internal/rawio).
func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, SegmentSize: testSeg, VerifyOnOpen: true, Guard: &rawio.Guard{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	r.Read(b)
	return b
}

func readAll(t *testing.T, s *Store, from, to pg.LSN) []byte {
	t.Helper()
	var out []byte
	for p := from; p < to; {
		b, err := s.Read(p, int(to-p))
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		if len(b) == 0 {
			t.Fatalf("read %s: no progress", p)
		}
		out = append(out, b...)
		p += pg.LSN(len(b))
	}
	return out
}

func TestSegmentName(t *testing.T) {
	if got := SegmentName(1, 0x1FF, pg.WALSegmentSize); got != "0000000100000001000000FF" {
		t.Fatalf("got %s", got)
	}
	tli, no, err := ParseSegmentName("0000000100000001000000FF", pg.WALSegmentSize)
	if err != nil || tli != 1 || no != 0x1FF {
		t.Fatalf("parse: %v %v %v", tli, no, err)
	}
}

func TestWriteFlushReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(3 * testSeg)
	if err := s.Init(start, 42, 1); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	var want []byte
	lsn := start
	for i := 0; i < 200; i++ {
		b := randBytes(r, 1+r.Intn(3000))
		if err := s.Write(lsn, b); err != nil {
			t.Fatal(err)
		}
		lsn += pg.LSN(len(b))
		want = append(want, b...)
		if i%7 == 0 {
			if f, err := s.Flush(); err != nil || f != lsn {
				t.Fatalf("flush = %s, %v; want %s", f, err, lsn)
			}
		}
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// Unflushed bytes after the last flush are not durable and not claimed.
	if err := s.Write(lsn, []byte("unflushed tail")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, start, lsn); !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
	if err := s.Write(lsn+1, []byte("x")); !errors.Is(err, ErrNotContiguous) {
		t.Fatalf("gap write: %v", err)
	}
	s.Close()
	// The control file's flush LSN is the one from Init: reopening must find
	// the durable end from the checksums alone.
	s2 := open(t, dir)
	if s2.FlushLSN() != lsn {
		t.Fatalf("recovered flush %s, want %s", s2.FlushLSN(), lsn)
	}
	if got := readAll(t, s2, start, lsn); !bytes.Equal(got, want) {
		t.Fatal("read back after reopen differs")
	}
	// Segment files are named like pg_wal's and hold the bytes at their offsets.
	seg0, err := os.ReadFile(filepath.Join(dir, "pg_wal", SegmentName(1, 3, testSeg)))
	if err != nil {
		t.Fatal(err)
	}
	if len(seg0) != testSeg || !bytes.Equal(seg0, want[:testSeg]) {
		t.Fatal("segment file content differs")
	}
	if _, err := s2.Read(start-1, 10); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("read below start: %v", err)
	}
	// Appending continues at the recovered end.
	if err := s2.Write(lsn, []byte("more")); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptBlockDetectedAndRepaired(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := rand.New(rand.NewSource(2))
	want := randBytes(r, 2*testSeg+5000)
	if err := s.Init(0x10000, 1, 1); err != nil {
		t.Fatal(err)
	}
	start := pg.LSN(0x10000)
	if err := s.Write(start, want); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.UpdateControl(nil)
	s.Close()
	// Flip one byte in the middle of the second segment.
	path := filepath.Join(dir, "pg_wal", SegmentName(1, 2, testSeg))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	f.ReadAt(b[:], 20000)
	b[0] ^= 0x40
	f.WriteAt(b[:], 20000)
	f.Close()

	s2 := open(t, dir)
	bad := s2.CorruptBlocks()
	badLSN := pg.LSN(2*testSeg + 16384)
	if len(bad) != 1 || bad[0] != badLSN {
		t.Fatalf("corrupt blocks %v, want [%s]", bad, badLSN)
	}
	if _, err := s2.Read(badLSN+100, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of corrupt block: %v", err)
	}
	// A wrong copy is refused; the right one is accepted.
	good := want[badLSN-start : badLSN-start+BlockSize]
	wrong := append([]byte(nil), good...)
	wrong[5] ^= 1
	if err := s2.Repair(badLSN, wrong); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("repair with wrong bytes: %v", err)
	}
	if err := s2.Repair(badLSN, good); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s2, start, start+pg.LSN(len(want))); !bytes.Equal(got, want) {
		t.Fatal("read after repair differs")
	}
}

func TestCorruptControlFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.UpdateControl(func(c *Control) { c.Term = 7 }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, ControlFileName)
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 0x01
	os.WriteFile(path, b, 0o600)
	_, err := Open(Options{Dir: dir, SegmentSize: testSeg})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with flipped control byte: %v", err)
	}
	t.Log(err)
}

func TestTruncate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := rand.New(rand.NewSource(3))
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	old := randBytes(r, 3*testSeg)
	s.Write(start, old)
	s.Flush()
	s.UpdateControl(nil)
	cut := start + testSeg + 1234
	if err := s.Truncate(cut); err != nil {
		t.Fatal(err)
	}
	if s.FlushLSN() != cut {
		t.Fatalf("flush after truncate %s", s.FlushLSN())
	}
	// New, different bytes after the cut, ending on a block boundary so that
	// stale checksum entries, if any were left, would be picked up at reopen.
	fresh := randBytes(r, int(BlockSize-uint64(cut)%BlockSize)+BlockSize)
	if err := s.Write(cut, fresh); err != nil {
		t.Fatal(err)
	}
	s.Flush()
	end := cut + pg.LSN(len(fresh))
	s.Close()
	s2 := open(t, dir)
	if s2.FlushLSN() != end {
		t.Fatalf("reopen flush %s want %s", s2.FlushLSN(), end)
	}
	want := append(append([]byte(nil), old[:cut-start]...), fresh...)
	if got := readAll(t, s2, start, end); !bytes.Equal(got, want) {
		t.Fatal("content after truncate differs")
	}
	if _, err := os.Stat(filepath.Join(dir, "pg_wal", SegmentName(1, 3, testSeg))); !os.IsNotExist(err) {
		t.Fatalf("segment past truncation still there: %v", err)
	}
}

func TestRemoveBefore(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	s.Init(0, 1, 1)
	s.Write(0, make([]byte, 3*testSeg+10))
	s.Flush()
	if err := s.RemoveBefore(2*testSeg + 5); err != nil {
		t.Fatal(err)
	}
	if s.StartLSN() != 2*testSeg {
		t.Fatalf("start %s", s.StartLSN())
	}
	if _, err := os.Stat(filepath.Join(dir, "pg_wal", SegmentName(1, 1, testSeg))); !os.IsNotExist(err) {
		t.Fatal("segment 1 not removed")
	}
	if _, err := s.Read(testSeg, 10); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("read removed: %v", err)
	}
}

// TestCrashDuringTruncate: a crash after the control file recorded the
// truncation but before the checksum entries were cleared must not bring
// the truncated tail back.
func TestCrashDuringTruncate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(testSeg)
	s.Init(start, 1, 1)
	s.Write(start, bytes.Repeat([]byte{7}, 2*testSeg))
	s.Flush()
	cut := start + testSeg/2
	// What Truncate persists first, then "crash".
	s.mu.Lock()
	s.flushLSN, s.writeLSN = cut, cut
	s.mu.Unlock()
	if err := s.UpdateControl(func(c *Control) { c.Truncating = true }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := open(t, dir)
	if s2.FlushLSN() != cut {
		t.Fatalf("after a crash mid-truncate the flush LSN is %s, want %s", s2.FlushLSN(), cut)
	}
	if s2.Control().Truncating {
		t.Fatal("truncating flag not cleared by recovery")
	}
	s2.Close()
	s3 := open(t, dir)
	if s3.FlushLSN() != cut {
		t.Fatalf("second reopen: flush %s, want %s", s3.FlushLSN(), cut)
	}
}

// TestReadInto: reads into a caller's buffer give Read's bytes, stop at the
// flush LSN (inside a block) and at the segment's end, and refuse a start
// inside a block or a buffer of part of a block; a corrupt block fails
// them like Read.
func TestReadInto(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	const start = pg.LSN(testSeg)
	if err := s.Init(start, 7, 1); err != nil {
		t.Fatal(err)
	}
	data := randBytes(rand.New(rand.NewSource(3)), testSeg+5*BlockSize+100) // into the next segment, ending inside a block
	if err := s.Write(start, data); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	end := start + pg.LSN(len(data))
	buf := make([]byte, 3*BlockSize)
	var got []byte
	for p := start; p < end; {
		n, err := s.ReadInto(p, buf)
		if err != nil {
			t.Fatalf("ReadInto %s: %v", p, err)
		}
		if n == 0 || n > len(buf) {
			t.Fatalf("ReadInto %s: %d bytes into %d", p, n, len(buf))
		}
		if (p+pg.LSN(n))%testSeg != 0 && p+pg.LSN(n) != end && n != len(buf) {
			t.Fatalf("ReadInto %s: short read of %d bytes, neither at the segment's end nor the flush LSN", p, n)
		}
		got = append(got, buf[:n]...)
		p += pg.LSN(n)
	}
	if !bytes.Equal(got, data) || !bytes.Equal(got, readAll(t, s, start, end)) {
		t.Fatal("ReadInto's bytes differ from what was written or from Read's")
	}
	if n, err := s.ReadInto(end-end%BlockSize, buf); err != nil || n != int(end%BlockSize) {
		t.Fatalf("ReadInto of the last, partial block: %d bytes, %v; want %d", n, err, end%BlockSize)
	}
	if _, err := s.ReadInto(start+10, buf); err == nil {
		t.Fatal("ReadInto from inside a block succeeded")
	}
	if _, err := s.ReadInto(start, buf[:BlockSize+1]); err == nil {
		t.Fatal("ReadInto into part of a block succeeded")
	}
	if _, err := s.ReadInto(start-BlockSize, buf); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("ReadInto below the start LSN: %v", err)
	}
	// A block whose bytes changed on disk fails like Read.
	f, err := os.OpenFile(filepath.Join(dir, "pg_wal", SegmentName(1, 1, testSeg)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[BlockSize+1]}, BlockSize+1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.ReadInto(start, buf); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadInto over a corrupt block: %v", err)
	}
}

// TestCloseDuringFlush: a store closed while a Flush had its bytes on the
// way to disk (a safekeeper shutting down under load). Before, the Flush
// then woke the flush waiters by closing the channel Close had closed
// already, and the process panicked ("close of closed channel", seen in
// CI in core/pageserver/e2e). Now the Flush returns ErrClosed, and the
// waiters' channel stays closed.
func TestCloseDuringFlush(t *testing.T) {
	var s *Store
	var err error
	s, err = Open(Options{Dir: t.TempDir(), SegmentSize: testSeg, Guard: &rawio.Guard{},
		ObserveFsync: func(time.Duration) { s.Close() }}) // runs between the I/O and the bookkeeping
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(pg.LSN(testSeg), 42, 1); err != nil {
		t.Fatal(err)
	}
	waiter := s.FlushNotify()
	if err := s.Write(pg.LSN(testSeg), []byte("bytes in flight")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("flush of a store closed under it: %v, want ErrClosed", err)
	}
	select {
	case <-waiter:
	default:
		t.Fatal("a flush waiter was not woken by Close")
	}
	if _, err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
}
