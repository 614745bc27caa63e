package psbackend_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestFullBufferSentInBackground: a full write buffer reaches the
// pageserver without a Sync (the background flusher sends it). While the
// pageserver refuses page writes, writes still succeed until the buffer
// holds four times WriteBuffer; then the writer sends it itself and gets
// the error. Nothing is lost: once the pageserver takes writes again, a
// Sync sends every buffered page and a fresh Backend reads them all.
func TestFullBufferSentInBackground(t *testing.T) {
	ctx := context.Background()
	h := start(t, t.TempDir(), objectstore.NewMemory())
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	be := open(t, h, psbackend.Options{StandaloneCommit: true, WriteBuffer: 4})
	defer be.Close()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if err := be.CreateRel(ctx, rel, 1); err != nil {
		t.Fatal(err)
	}
	w := pg.LSN(10)
	write := func(blk uint32) error {
		w++
		return be.WritePage(ctx, rel.Page(blk), page(byte(blk+1)), w)
	}
	for blk := uint32(0); blk < 4; blk++ {
		if err := write(blk); err != nil {
			t.Fatal(err)
		}
	}
	// No Sync: the flusher sends the full buffer.
	deadline := time.Now().Add(10 * time.Second)
	for h.count("PutPages") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a full buffer was not sent within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}

	h.failPuts.Store(true)
	var failed uint32
	for blk := uint32(4); blk < 40; blk++ {
		if err := write(blk); err != nil {
			failed = blk
			break
		}
	}
	// The writes go on until the buffer holds 16 pages: blocks 0-3 (if
	// their send was still in flight) and 4-15, or 4-19. Sending in the
	// writer's call, the first failure would be at block 7.
	if failed < 15 || failed > 19 {
		t.Fatalf("with the pageserver refusing writes, the first failed write was block %d", failed)
	}
	buf := make([]byte, pg.BlockSize)
	for blk := uint32(0); blk <= failed; blk++ {
		if err := be.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(byte(blk+1))) {
			t.Fatalf("block %d read back while unsent: %v, %d", blk, err, buf[0])
		}
	}
	if err := be.Sync(ctx, w); err == nil {
		t.Fatal("Sync succeeded while the pageserver refused page writes")
	}

	h.failPuts.Store(false)
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	other := open(t, h, psbackend.Options{})
	defer other.Close()
	if n, err := other.Nblocks(ctx, rel); err != nil || n != failed+1 {
		t.Fatalf("pageserver size %d, %v; want %d", n, err, failed+1)
	}
	for blk := uint32(0); blk <= failed; blk++ {
		if err := other.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(byte(blk+1))) {
			t.Fatalf("block %d after Sync: %v, %d", blk, err, buf[0])
		}
	}
}
