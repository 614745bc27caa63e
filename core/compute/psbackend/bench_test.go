package psbackend_test

import (
	"context"
	"testing"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// benchBackend returns a Backend on a fresh in-process pageserver with one
// fork of 1024 written blocks.
func benchBackend(b *testing.B) (*psbackend.Backend, pg.RelTag) {
	ctx := context.Background()
	h := start(b, b.TempDir(), objectstore.NewMemory())
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		b.Fatal(err)
	}
	be := open(b, h, psbackend.Options{StandaloneCommit: true})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if err := be.CreateRel(ctx, rel, 1); err != nil {
		b.Fatal(err)
	}
	for blk := uint32(0); blk < 1024; blk++ {
		if err := be.WritePage(ctx, rel.Page(blk), page(byte(blk)), 2); err != nil {
			b.Fatal(err)
		}
	}
	if err := be.Sync(ctx, 2); err != nil {
		b.Fatal(err)
	}
	return be, rel
}

// BenchmarkReadPage: one GetPage round trip per 8 KiB page (no cache tier).
func BenchmarkReadPage(b *testing.B) {
	be, rel := benchBackend(b)
	buf := make([]byte, pg.BlockSize)
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.ReadPage(context.Background(), rel.Page(uint32(i%1024)), 0, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWritePagePending: PutPages above the commit LSN (kept pending
// until a Sync), one page per call.
func BenchmarkWritePagePending(b *testing.B) {
	be, rel := benchBackend(b)
	p := page(9)
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.WritePage(context.Background(), rel.Page(uint32(i%1024)), p, pg.LSN(100+i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := be.Sync(context.Background(), pg.LSN(100+b.N)); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWritePageSynced: a page write followed by Sync at its W (the
// pageserver appends and fsyncs its log each time).
func BenchmarkWritePageSynced(b *testing.B) {
	be, rel := benchBackend(b)
	p := page(9)
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := pg.LSN(100 + i)
		if err := be.WritePage(context.Background(), rel.Page(uint32(i%1024)), p, w); err != nil {
			b.Fatal(err)
		}
		if err := be.Sync(context.Background(), w); err != nil {
			b.Fatal(err)
		}
	}
}
