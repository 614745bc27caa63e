package timeline

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/smallfs"
	"github.com/stratadb/strata/sdk/pg"
)

// TestDiskFull fills a real (tmpfs) filesystem under a timeline with
// durable page writes: the write that does not fit fails with ENOSPC; every
// write acknowledged before reads back, before and after a restart; once
// space is freed the same timeline takes writes again without a restart.
func TestDiskFull(t *testing.T) {
	ctx := context.Background()
	dir := smallfs.Mount(t, 2<<20)
	commit := &CommitLSN{}
	commit.Set(1 << 40) // every write is durable at once
	o := smallOpts()
	id := pg.TimelineID{0xDF}
	open := func() *Timeline {
		tl, err := Open(ctx, id, dir, o, Deps{Log: zerolog.Nop(), Commit: commit})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tl := open()
	defer func() { tl.Close() }()
	want := map[pg.PageKey][]byte{}
	page := func(i int) []byte {
		return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5A}, pg.BlockSize/3+1)[:pg.BlockSize]
	}
	var werr error
	i := 0
	for ; i < 2000; i++ {
		pk := rel.Page(uint32(i % 100))
		_, werr = tl.PutPages(ctx, []PageWrite{{Page: pk, W: pg.LSN(1000 + 10*i), Data: page(i)}})
		if werr != nil {
			break
		}
		want[pk] = page(i)
		if i%50 == 49 {
			if werr = tl.Flush(ctx); werr != nil {
				break
			}
		}
	}
	if werr == nil {
		t.Fatal("16 MB of page writes fit on a 2 MiB disk")
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("write %d failed with %v; want ENOSPC", i, werr)
	}
	t.Logf("full after %d writes: %v", i, werr)
	// The write that failed may show (it is in memory and becomes durable
	// with the next sync that succeeds) or not; what a read saw then must
	// never go back later.
	failed := rel.Page(uint32(i % 100))
	seen, err := tl.GetPage(ctx, failed, LatestLSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(seen, page(i)) && !bytes.Equal(seen, want[failed]) {
		t.Fatal("the page of the failed write is neither its old nor its new version")
	}
	want[failed] = seen
	check := func(tl *Timeline, when string) {
		t.Helper()
		for pk, p := range want {
			got, err := tl.GetPage(ctx, pk, LatestLSN, 0)
			if err != nil || !bytes.Equal(got, p) {
				t.Fatalf("%s: %s: %v (equal %v)", when, pk, err, bytes.Equal(got, p))
			}
		}
	}
	check(tl, "when full")

	smallfs.Resize(t, dir, 64<<20)
	for j := 0; j < 300; j++ {
		i++
		pk := rel.Page(uint32(i % 100))
		if pk == failed {
			continue
		}
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: pk, W: pg.LSN(1000 + 10*i), Data: page(i)}}); err != nil {
			t.Fatalf("write after freeing space: %v", err)
		}
		want[pk] = page(i)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatalf("flush after freeing space: %v", err)
	}
	check(tl, "after freeing space")
	tl.Close()
	tl = open()
	check(tl, "after a restart")
}
