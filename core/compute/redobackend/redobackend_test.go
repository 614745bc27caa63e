package redobackend_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/fusefs/backendtest"
	"github.com/stratadb/strata/core/compute/redobackend"
	"github.com/stratadb/strata/sdk/pg"
)

// fakePages is a pageserver holding fixed pages; it records every GetPage.
type fakePages struct {
	mu    sync.Mutex
	rels  []fusefs.RelInfo
	pages map[pg.PageKey][]byte
	after map[pg.PageKey]pg.LSN // a page exists only for not_modified_since at or above
	calls []call
}

type call struct {
	key pg.PageKey
	nms pg.LSN
}

func (f *fakePages) GetPage(_ context.Context, key pg.PageKey, nms pg.LSN) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{key, nms})
	p, ok := f.pages[key]
	if a, gated := f.after[key]; gated && nms < a {
		ok = false
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", redobackend.ErrNotFound, key)
	}
	return bytes.Clone(p), nil
}

func (f *fakePages) ListRels(context.Context) ([]fusefs.RelInfo, error) { return f.rels, nil }

func (f *fakePages) takeCalls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func TestAcceptance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) fusefs.Backend {
		b, err := redobackend.Open(context.Background(), redobackend.Options{Pages: &fakePages{}, Files: fusefs.NewMemory()})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// pageAt is a page filled with v whose header LSN is lsn.
func pageAt(v byte, lsn pg.LSN) []byte {
	p := bytes.Repeat([]byte{v}, pg.BlockSize)
	binary.LittleEndian.PutUint32(p, uint32(lsn>>32))
	binary.LittleEndian.PutUint32(p[4:], uint32(lsn))
	return p
}

// TestLocalStoreAndPageserverReads: writes stay local; a page the bounded
// store evicted is read from the pageserver with not_modified_since = its
// page LSN; a block of the pageserver's relation that the compute never
// held is asked with the filesystem's not_modified_since; blocks past the
// known end read as zeros without a GetPage; FSM and unlogged forks are
// pinned, never evicted and never read from the pageserver; the
// pageserver's FSM forks are not listed.
func TestLocalStoreAndPageserverReads(t *testing.T) {
	ctx := context.Background()
	heap := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	fsm := heap
	fsm.Fork = pg.FSMFork
	fp := &fakePages{
		rels:  []fusefs.RelInfo{{Rel: heap, Nblocks: 4}, {Rel: fsm, Nblocks: 1}},
		pages: map[pg.PageKey][]byte{heap.Page(0): pageAt(0xA0, 0x100), heap.Page(1): pageAt(0xA1, 0x200), heap.Page(5): pageAt(0xEE, 0x900)},
	}
	b, err := redobackend.Open(ctx, redobackend.Options{Pages: fp, Files: fusefs.NewMemory(), MaxPages: 3})
	if err != nil {
		t.Fatal(err)
	}
	rels, _ := b.ListRels(ctx)
	if len(rels) != 1 || rels[0].Rel != heap || rels[0].Nblocks != 4 {
		t.Fatalf("ListRels %v: want only the heap with 4 blocks (the pageserver's FSM hidden)", rels)
	}
	buf := make([]byte, pg.BlockSize)

	// Never held here: asked with the filesystem's value.
	if err := b.ReadPage(ctx, heap.Page(0), 0x1000, buf); err != nil || !bytes.Equal(buf, fp.pages[heap.Page(0)]) {
		t.Fatalf("block 0: %v", err)
	}
	if c := fp.takeCalls(); len(c) != 1 || c[0] != (call{heap.Page(0), 0x1000}) {
		t.Fatalf("calls %v", c)
	}
	// Unknown to the pageserver: zeros.
	if err := b.ReadPage(ctx, heap.Page(3), 0x1000, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("block 3: %v", err)
	}
	fp.takeCalls()

	// Writes: blocks 1..6 (4..6 extend the fork); never sent anywhere.
	for blk := uint32(1); blk <= 6; blk++ {
		if err := b.WritePage(ctx, heap.Page(blk), pageAt(byte(blk), pg.LSN(0x2000+blk)), 0x3000); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := b.Nblocks(ctx, heap); n != 7 {
		t.Fatalf("nblocks %d", n)
	}
	if s := b.Stats(); s.Pages != 3 || s.Evicted != 3 {
		t.Fatalf("stats %+v: want 3 pages kept, 3 evicted", s)
	}
	// Recent ones are local.
	for blk := uint32(4); blk <= 6; blk++ {
		if err := b.ReadPage(ctx, heap.Page(blk), 0x5000, buf); err != nil || !bytes.Equal(buf, pageAt(byte(blk), pg.LSN(0x2000+blk))) {
			t.Fatalf("local block %d: %v", blk, err)
		}
	}
	if c := fp.takeCalls(); len(c) != 0 {
		t.Fatalf("local reads asked the pageserver: %v", c)
	}
	// Evicted block 1: from the pageserver, not modified since its page LSN.
	if err := b.ReadPage(ctx, heap.Page(1), 0x5000, buf); err != nil {
		t.Fatal(err)
	}
	if c := fp.takeCalls(); len(c) != 1 || c[0] != (call{heap.Page(1), 0x2001}) {
		t.Fatalf("evicted block 1: calls %v, want not_modified_since 0/2001", c)
	}

	// A truncation below an evicted block, then re-extension: the block
	// reads as zeros without asking (the pageserver may hold an old version).
	if err := b.TruncateRel(ctx, heap, 2, 0x6000); err != nil {
		t.Fatal(err)
	}
	if err := b.TruncateRel(ctx, heap, 6, 0x6001); err != nil {
		t.Fatal(err)
	}
	for blk := uint32(2); blk < 6; blk++ {
		if err := b.ReadPage(ctx, heap.Page(blk), 0x7000, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
			t.Fatalf("re-extended block %d: %v", blk, err)
		}
	}
	if c := fp.takeCalls(); len(c) != 0 {
		t.Fatalf("re-extended blocks asked the pageserver: %v", c)
	}

	// FSM fork created by the compute: pinned, whatever MaxPages says.
	if err := b.CreateRel(ctx, fsm, 0x8000); err != nil {
		t.Fatal(err)
	}
	for blk := uint32(0); blk < 5; blk++ {
		if err := b.WritePage(ctx, fsm.Page(blk), pageAt(0xF0+byte(blk), 0), 0x8000); err != nil {
			t.Fatal(err)
		}
	}
	for blk := uint32(0); blk < 5; blk++ {
		if err := b.ReadPage(ctx, fsm.Page(blk), 0x9000, buf); err != nil || buf[100] != 0xF0+byte(blk) {
			t.Fatalf("FSM block %d: %v %x", blk, err, buf[100])
		}
	}
	if s := b.Stats(); s.Pinned != 5 {
		t.Fatalf("stats %+v: want the 5 FSM pages pinned", s)
	}
	// Visibility-map pages are pinned (their LSN does not cover implicit clears).
	vm := heap
	vm.Fork = pg.VMFork
	if err := b.CreateRel(ctx, vm, 0x8000); err != nil {
		t.Fatal(err)
	}
	for blk := uint32(0); blk < 4; blk++ {
		if err := b.WritePage(ctx, vm.Page(blk), pageAt(0x70+byte(blk), 0x10), 0x8000); err != nil {
			t.Fatal(err)
		}
	}
	if s := b.Stats(); s.Pinned != 9 {
		t.Fatalf("stats %+v: want 5 FSM and 4 VM pages pinned", s)
	}
	// An unlogged relation (init fork): its main fork is pinned too.
	ul := pg.RelTag{Spc: 1663, DB: 5, Rel: 20000}
	ulInit := ul
	ulInit.Fork = pg.InitFork
	for _, r := range []pg.RelTag{ul, ulInit} {
		if err := b.CreateRel(ctx, r, 0x9000); err != nil {
			t.Fatal(err)
		}
	}
	for blk := uint32(0); blk < 6; blk++ {
		if err := b.WritePage(ctx, ul.Page(blk), pageAt(0x50+byte(blk), 0), 0x9000); err != nil {
			t.Fatal(err)
		}
	}
	for blk := uint32(0); blk < 6; blk++ {
		if err := b.ReadPage(ctx, ul.Page(blk), 0x9000, buf); err != nil || buf[100] != 0x50+byte(blk) {
			t.Fatalf("unlogged block %d: %v %x", blk, err, buf[100])
		}
	}
	if c := fp.takeCalls(); len(c) != 0 {
		t.Fatalf("pinned pages asked the pageserver: %v", c)
	}
	// Unlink forgets everything of the fork.
	if err := b.UnlinkRel(ctx, heap, 0xA000); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadPage(ctx, heap.Page(0), 0xA000, buf); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("read of an unlinked fork: %v", err)
	}
	if err := b.Remove(ctx, "base/5", 0xA000); !errors.Is(err, fusefs.ErrNotEmpty) {
		t.Fatalf("removing a folder that holds forks: %v", err)
	}
}

// TestEvictedPageUnknownToPageserver: an evicted page with content that the
// pageserver does not have at its page LSN (a FILE_COPY clone's page keeps
// the template's LSN, older than the copy record) is asked for again at the
// compute's WAL position, and is an error, never zeros, if still unknown;
// an evicted all-zeros page (a new block) reads as zeros.
func TestEvictedPageUnknownToPageserver(t *testing.T) {
	ctx := context.Background()
	rel := pg.RelTag{Spc: 1663, DB: 7, Rel: 16400}
	fp := &fakePages{pages: map[pg.PageKey][]byte{}}
	b, err := redobackend.Open(ctx, redobackend.Options{Pages: fp, Files: fusefs.NewMemory(), MaxPages: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateRel(ctx, rel, 0x5000); err != nil {
		t.Fatal(err)
	}
	copied := pageAt(0xC0, 0x100) // the template's LSN
	for blk, p := range [][]byte{copied, make([]byte, pg.BlockSize), pageAt(0xC2, 0x5100)} {
		if err := b.WritePage(ctx, rel.Page(uint32(blk)), p, 0x5000); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, pg.BlockSize)

	// No WAL position known: an error naming the page, not zeros.
	err = b.ReadPage(ctx, rel.Page(0), 0x5000, buf)
	if !errors.Is(err, redobackend.ErrNotFound) || !strings.Contains(err.Error(), "written and evicted here") {
		t.Fatalf("read without a WAL position: %v", err)
	}
	fp.takeCalls()

	// With W, the pageserver is asked again at W; it has the page there
	// (it ingested the copy record while waiting).
	w := pg.LSN(0x9000)
	b.SetWALPosition(func() pg.LSN { return w })
	fp.mu.Lock()
	fp.after = map[pg.PageKey]pg.LSN{rel.Page(0): 0x8000}
	fp.pages[rel.Page(0)] = copied
	fp.mu.Unlock()
	if err := b.ReadPage(ctx, rel.Page(0), 0x5000, buf); err != nil || !bytes.Equal(buf, copied) {
		t.Fatalf("copied page: %v", err)
	}
	if c := fp.takeCalls(); len(c) != 2 || c[0] != (call{rel.Page(0), 0x100}) || c[1] != (call{rel.Page(0), w}) {
		t.Fatalf("calls %v: want the page LSN 0/100, then W 0/9000", c)
	}
	if s := b.Stats(); s.Refetches != 1 {
		t.Fatalf("stats %+v: want one refetch", s)
	}
	// Still unknown at W: an error.
	fp.mu.Lock()
	delete(fp.pages, rel.Page(0))
	fp.mu.Unlock()
	if err := b.ReadPage(ctx, rel.Page(0), 0x5000, buf); !errors.Is(err, redobackend.ErrNotFound) {
		t.Fatalf("page unknown even at W: %v", err)
	}
	// W not past the page's LSN: no second question, an error.
	w = 0x100
	if err := b.ReadPage(ctx, rel.Page(0), 0x5000, buf); !errors.Is(err, redobackend.ErrNotFound) {
		t.Fatalf("W at the page LSN: %v", err)
	}
	fp.takeCalls()

	// The evicted new (all-zeros) block: zeros, one question only.
	w = 0x9000
	buf[0] = 1
	if err := b.ReadPage(ctx, rel.Page(1), 0x5000, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("new block: %v", err)
	}
	if c := fp.takeCalls(); len(c) != 1 {
		t.Fatalf("new block: calls %v", c)
	}
}
