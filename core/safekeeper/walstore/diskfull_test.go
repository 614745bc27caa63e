package walstore

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stratadb/strata/internal/smallfs"
	"github.com/stratadb/strata/sdk/pg"
)

// TestDiskFull fills a real (tmpfs) filesystem under a store: Write fails
// with ENOSPC and says which file; everything written before stays
// flushable and readable; a reopen while full recovers the flushed end; and
// once space is freed the same writer carries on from where it stopped.
func TestDiskFull(t *testing.T) {
	dir := filepath.Join(smallfs.Mount(t, 1<<20), "sk")
	s := open(t, dir)
	const start = pg.LSN(3 * testSeg)
	if err := s.Init(start, 42, 1); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	var all []byte
	lsn := start
	var werr error
	var chunk []byte
	for i := 0; i < 1000; i++ {
		chunk = randBytes(r, 5000) // crosses block and segment boundaries
		if werr = s.Write(lsn, chunk); werr != nil {
			break
		}
		all = append(all, chunk...)
		lsn += pg.LSN(len(chunk))
		if i%3 == 0 {
			if _, err := s.Flush(); err != nil {
				t.Fatalf("flush at %s: %v", lsn, err)
			}
		}
	}
	if werr == nil {
		t.Fatal("a 1 MiB filesystem took 5 MB of WAL")
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("write error %v: want ENOSPC", werr)
	}
	t.Logf("full at %s after %d bytes: %v", s.WriteLSN(), len(all), werr)
	// What the store took is consistent: it flushes, and a retry at the
	// write LSN fails the same way (no internal error).
	w := s.WriteLSN()
	if w < lsn || w > lsn+pg.LSN(len(chunk)) {
		t.Fatalf("write LSN %s outside the failed write [%s, %s]", w, lsn, lsn+pg.LSN(len(chunk)))
	}
	all = append(all, chunk[:w-lsn]...)
	chunk = chunk[w-lsn:]
	lsn = w
	f, err := s.Flush()
	if err != nil || f != w {
		t.Fatalf("flush when full: %s, %v; want %s", f, err, w)
	}
	if err := s.Write(lsn, chunk); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("retry when full: %v; want ENOSPC", err)
	}
	if got := readAll(t, s, start, f); !bytes.Equal(got, all) {
		t.Fatal("read back differs before the reopen")
	}

	// A restart while still full.
	s.Close()
	s = open(t, dir)
	if s.FlushLSN() != f || s.WriteLSN() != f {
		t.Fatalf("reopened full store at flush %s write %s; want %s", s.FlushLSN(), s.WriteLSN(), f)
	}
	if got := readAll(t, s, start, f); !bytes.Equal(got, all) {
		t.Fatal("read back differs after the reopen")
	}

	// Space freed: carry on.
	smallfs.Resize(t, filepath.Dir(dir), 8<<20)
	if err := s.Write(lsn, chunk); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
	all = append(all, chunk...)
	lsn += pg.LSN(len(chunk))
	for i := 0; i < 50; i++ {
		chunk = randBytes(r, 5000)
		if err := s.Write(lsn, chunk); err != nil {
			t.Fatal(err)
		}
		all = append(all, chunk...)
		lsn += pg.LSN(len(chunk))
	}
	if f, err := s.Flush(); err != nil || f != lsn {
		t.Fatalf("flush: %s %v", f, err)
	}
	s.Close()
	s = open(t, dir)
	if s.FlushLSN() != lsn {
		t.Fatalf("reopened at %s, want %s", s.FlushLSN(), lsn)
	}
	if got := readAll(t, s, start, lsn); !bytes.Equal(got, all) {
		t.Fatal("read back differs at the end")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}
