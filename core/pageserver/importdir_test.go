package pageserver_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestImportDataDirSegments: a relation with a second segment file, many
// small relations and other files load concurrently into the right keys,
// sizes and files; pg_wal is skipped.
func TestImportDataDirSegments(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(p string, data []byte) {
		t.Helper()
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pages := func(n int, seed byte) []byte {
		return bytes.Repeat([]byte{seed}, n*pg.BlockSize)
	}
	write("base/5/16384", pages(3, 1))
	write("base/5/16384.1", pages(2, 2))
	write("base/5/16384_fsm", pages(1, 3))
	for i := 0; i < 40; i++ {
		write("base/5/"+strconv.Itoa(20000+i), pages(1+i%3, byte(10+i)))
	}
	write("PG_VERSION", []byte("15\n"))
	write("global/pg_filenode.map", bytes.Repeat([]byte{7}, 512))
	write("pg_wal/000000010000000000000001", []byte("skipped"))

	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	ps, err := pageserver.New(ctx, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: objectstore.NewMemory()})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	tl, err := ps.CreateTimeline(ctx, pg.TimelineID{0x1D})
	if err != nil {
		t.Fatal(err)
	}
	if err := pageserver.ImportDataDir(ctx, tl, dir, 100); err != nil {
		t.Fatal(err)
	}
	main := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.MainFork}
	if n, ok, err := tl.Nblocks(ctx, main, timeline.LatestLSN); err != nil || !ok || n != pageserver.RelSegmentBlocks+2 {
		t.Fatalf("relation 16384: %d blocks (exists %v, %v), want %d", n, ok, err, pageserver.RelSegmentBlocks+2)
	}
	for blk, want := range map[uint32]byte{0: 1, 2: 1, pageserver.RelSegmentBlocks: 2, pageserver.RelSegmentBlocks + 1: 2} {
		got, err := tl.GetPage(ctx, main.Page(blk), timeline.LatestLSN, 0)
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{want}, pg.BlockSize)) {
			t.Fatalf("block %d: %v", blk, err)
		}
	}
	for i := 0; i < 40; i++ {
		r := pg.RelTag{Spc: 1663, DB: 5, Rel: uint32(20000 + i)}
		if n, ok, err := tl.Nblocks(ctx, r, timeline.LatestLSN); err != nil || !ok || n != uint32(1+i%3) {
			t.Fatalf("relation %d: %d blocks (exists %v, %v), want %d", r.Rel, n, ok, err, 1+i%3)
		}
	}
	if b, err := tl.ReadFile(ctx, "global/pg_filenode.map", timeline.LatestLSN); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{7}, 512)) {
		t.Fatalf("global/pg_filenode.map: %d bytes, %v", len(b), err)
	}
	if _, err := tl.ReadFile(ctx, "pg_wal/000000010000000000000001", timeline.LatestLSN); err == nil {
		t.Fatal("pg_wal was imported")
	}
}
