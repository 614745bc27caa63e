package walstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratadb/strata/sdk/pg"
)

// unwrittenExtents returns how many of path's extents are allocated but
// unwritten (fallocated), by FS_IOC_FIEMAP; ok is false where the
// filesystem cannot tell (tmpfs, say).
func unwrittenExtents(t *testing.T, path string) (n int, ok bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const (
		fsIocFiemap     = 0xC020660B // _IOWR('f', 11, struct fiemap)
		fiemapFlagSync  = 0x1
		extentUnwritten = 0x800
		headerSize      = 32
		extentSize      = 56
		extentsPerCall  = 64
		extentFlagsAt   = 40
		extentLogicalAt = 0
		extentLengthAt  = 16
		mappedExtentsAt = 20
		extentCountAt   = 24
	)
	buf := make([]byte, headerSize+extentSize*extentsPerCall)
	var start uint64
	for {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:], fiemapFlagSync)
		binary.NativeEndian.PutUint32(buf[extentCountAt:], extentsPerCall)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0])))
		if errno != 0 {
			return 0, false
		}
		mapped := int(binary.NativeEndian.Uint32(buf[mappedExtentsAt:]))
		if mapped == 0 {
			return n, true
		}
		var last bool
		for i := 0; i < mapped; i++ {
			e := buf[headerSize+i*extentSize:]
			flags := binary.NativeEndian.Uint32(e[extentFlagsAt:])
			if flags&extentUnwritten != 0 {
				n++
			}
			last = flags&0x1 != 0 // FIEMAP_EXTENT_LAST
			start = binary.NativeEndian.Uint64(e[extentLogicalAt:]) + binary.NativeEndian.Uint64(e[extentLengthAt:])
		}
		if last {
			return n, true
		}
	}
}

func waitSpare(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		ready := s.spareReady
		s.mu.Unlock()
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare segment after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Every segment, the first (zero-filled in the Write) and the next ones
// (spares renamed into place), is written zeros: a WAL write needs no
// extent conversion, so a Flush's fdatasync commits no journal.
func TestSegmentsAreWrittenZeros(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	start := pg.LSN(2 * testSeg)
	if err := s.Init(start, 1, 1); err != nil {
		t.Fatal(err)
	}
	spare := filepath.Join(dir, spareName)
	lsn := start
	var want []byte
	for seg := 0; seg < 4; seg++ {
		if seg > 0 {
			waitSpare(t, s)
		}
		b := bytes.Repeat([]byte{byte(seg + 1)}, testSeg)
		if seg == 3 {
			b = b[:testSeg/2] // the rest of the segment is never written
		}
		if err := s.Write(lsn, b); err != nil {
			t.Fatal(err)
		}
		lsn += pg.LSN(len(b))
		want = append(want, b...)
		if _, err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitSpare(t, s) // the last segment took the spare: another is made
	st, err := os.Stat(spare)
	if err != nil || st.Size() != testSeg {
		t.Fatalf("spare segment: %v, %v", st, err)
	}
	if got := readAll(t, s, start, lsn); !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
	names, err := os.ReadDir(filepath.Join(dir, "pg_wal"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 4 {
		t.Fatalf("pg_wal holds %d files, want the 4 segments", len(names))
	}
	for _, d := range names {
		if _, _, err := ParseSegmentName(d.Name(), testSeg); err != nil {
			t.Fatalf("pg_wal holds %s", d.Name())
		}
		n, ok := unwrittenExtents(t, filepath.Join(dir, "pg_wal", d.Name()))
		if !ok {
			t.Skip("the filesystem of the test folder does not report extents")
		}
		if n != 0 {
			t.Fatalf("segment %s has %d unwritten (fallocated) extents", d.Name(), n)
		}
	}
	if n, _ := unwrittenExtents(t, spare); n != 0 {
		t.Fatalf("the spare segment has %d unwritten extents", n)
	}
}

// A spare left by a crash while it was written is removed and made again;
// a complete one is used.
func TestSpareSegmentAfterCrash(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Init(testSeg, 1, 1); err != nil {
		t.Fatal(err)
	}
	waitSpare(t, s)
	s.Close()
	half := filepath.Join(dir, spareTmpName)
	if err := os.WriteFile(half, make([]byte, testSeg/2), 0o600); err != nil {
		t.Fatal(err)
	}
	// A complete spare with a marker: it must become the next segment as is
	// (its bytes past the durable end are not read).
	spare := filepath.Join(dir, spareName)
	before, err := os.Stat(spare)
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir)
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the half-written spare is still there: %v", err)
	}
	if err := s2.Write(testSeg, []byte("first record")); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Flush(); err != nil {
		t.Fatal(err)
	}
	seg, err := os.Stat(filepath.Join(dir, "pg_wal", SegmentName(1, 1, testSeg)))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, seg) {
		t.Fatal("the new segment is not the spare left from before the restart")
	}
	waitSpare(t, s2)
}

// Without a spare (the disk was too slow, or full), a new segment is
// zero-filled in the Write, and the WAL is the same.
func TestSegmentWithoutSpare(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Init(testSeg, 1, 1); err != nil {
		t.Fatal(err)
	}
	s.stopSpare()
	s.mu.Lock()
	s.spareReady = false
	s.mu.Unlock()
	os.Remove(filepath.Join(dir, spareName))
	data := bytes.Repeat([]byte("wal!"), testSeg/2) // two segments
	if err := s.Write(testSeg, data); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, testSeg, testSeg+pg.LSN(len(data))); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	for no := uint64(1); no <= 2; no++ {
		st, err := os.Stat(filepath.Join(dir, "pg_wal", SegmentName(1, no, testSeg)))
		if err != nil || st.Size() != testSeg {
			t.Fatalf("segment %d: %v %v", no, st, err)
		}
	}
}
