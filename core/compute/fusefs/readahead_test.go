package fusefs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// countingBackend counts the Backend's single and batched page reads.
type countingBackend struct {
	Backend
	single, batches, batched atomic.Int64
}

func (c *countingBackend) ReadPage(ctx context.Context, key pg.PageKey, nms pg.LSN, page []byte) error {
	c.single.Add(1)
	return c.Backend.ReadPage(ctx, key, nms, page)
}

func (c *countingBackend) ReadPages(ctx context.Context, keys []pg.PageKey, nms []pg.LSN, pages [][]byte) []error {
	c.batches.Add(1)
	c.batched.Add(int64(len(keys)))
	errs := make([]error, len(keys))
	for i, k := range keys {
		errs[i] = c.Backend.ReadPage(ctx, k, nms[i], pages[i])
	}
	return errs
}

func pageOf(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

// TestReadAhead: a process that reads a fork block by block gets every
// block right, and all but the first blocks come from batches fetched
// ahead of it; a write, a truncation and a re-extension after the blocks
// were fetched are never hidden by the fetched copies.
func TestReadAhead(t *testing.T) {
	e := newEnv(t)
	e.readAhead = 8
	be := &countingBackend{Backend: NewMemory()}
	f := e.mount(t, be, nil)
	if err := os.MkdirAll(filepath.Join(e.mnt, "base", "5"), 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.mnt, "base", "5", "16384")
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	const blocks = 100
	for b := 0; b < blocks; b++ {
		if _, err := fh.WriteAt(pageOf(byte(b+1)), int64(b)*pg.BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	read := func(b int) []byte {
		t.Helper()
		buf := make([]byte, pg.BlockSize)
		if _, err := fh.ReadAt(buf, int64(b)*pg.BlockSize); err != nil {
			t.Fatalf("block %d: %v", b, err)
		}
		return buf
	}
	for b := 0; b < blocks; b++ {
		if got := read(b); !bytes.Equal(got, pageOf(byte(b+1))) {
			t.Fatalf("block %d reads %d", b, got[0])
		}
	}
	fetched, used, _, batches := f.Waits().ReadAhead()
	t.Logf("sequential read of %d blocks: %d single reads, %d batches of %d pages; read-ahead fetched %d, used %d",
		blocks, be.single.Load(), be.batches.Load(), be.batched.Load(), fetched, used)
	if n := be.single.Load(); n > 4 {
		t.Errorf("%d single page reads for a sequential read of %d blocks, want at most 4 (the rest fetched ahead)", n, blocks)
	}
	if batches == 0 || used < blocks-4 {
		t.Errorf("read-ahead: %d batches, %d of %d blocks used", batches, used, blocks)
	}

	// Fetch ahead from block 3, then change what was fetched.
	read(0)
	read(1)
	read(2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if f2, _, _, _ := f.Waits().ReadAhead(); f2 >= fetched+8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no read-ahead after three blocks in a row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := fh.WriteAt(pageOf(200), 5*pg.BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(7 * pg.BlockSize); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(pageOf(201), 9*pg.BlockSize); err != nil {
		t.Fatal(err)
	}
	for b, want := range map[int][]byte{3: pageOf(4), 4: pageOf(5), 5: pageOf(200), 6: pageOf(7), 7: make([]byte, pg.BlockSize), 8: make([]byte, pg.BlockSize), 9: pageOf(201)} {
		if got := read(b); !bytes.Equal(got, want) {
			t.Errorf("block %d after the write, truncation and extension reads %d, want %d", b, got[0], want[0])
		}
	}
}

// TestReadAheadSparseReader: a reader that reads every third block in
// order (as ANALYZE reads its sample) is served by the read-ahead: the
// fetched copies of the blocks it skips are dropped at once, so unread
// pages do not fill the cap and stop the windows that follow.
func TestReadAheadSparseReader(t *testing.T) {
	e := newEnv(t)
	e.readAhead = 16
	be := &countingBackend{Backend: NewMemory()}
	f := e.mount(t, be, nil)
	if err := os.MkdirAll(filepath.Join(e.mnt, "base", "5"), 0o700); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(filepath.Join(e.mnt, "base", "5", "16384"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	const blocks = 3000
	for b := 0; b < blocks; b++ {
		if _, err := fh.WriteAt(pageOf(byte(b%250+1)), int64(b)*pg.BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, pg.BlockSize)
	reads := 0
	for b := 0; b < blocks; b += 3 {
		if _, err := fh.ReadAt(buf, int64(b)*pg.BlockSize); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, pageOf(byte(b%250+1))) {
			t.Fatalf("block %d reads %d", b, buf[0])
		}
		reads++
	}
	fetched, used, dropped, batches := f.Waits().ReadAhead()
	t.Logf("%d reads of every third block: %d single reads; read-ahead %d batches, %d pages fetched, %d used, %d dropped",
		reads, be.single.Load(), batches, fetched, used, dropped)
	if n := be.single.Load(); n > int64(reads)/20 {
		t.Errorf("%d of %d reads went to the backend one page at a time, want at most 5%%", n, reads)
	}
	if used < uint64(reads)*9/10 {
		t.Errorf("read-ahead served %d of %d reads", used, reads)
	}
}
