package timeline

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestCrashBetweenLayerWriteAndManifest: a crash after a flush wrote its
// layer files but before the manifest named them (and before the log was
// removed) leaves stray files; Open deletes them and replays the log, and
// a half-written temp file is removed too.
func TestCrashBetweenLayerWriteAndManifest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl := openT(t, dir, commit, nil, pg.TimelineID{0xE0}, nil, 0)
	for i := 0; i < 10; i++ {
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(100 + i), Data: page(byte(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	// What a flush would have written, without the manifest update.
	tl.mu.RLock()
	vs := tl.open.Sorted()
	tl.mu.RUnlock()
	stray, err := layer.WriteFiles(dir, layer.DeltaLayer, vs, 1<<20, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp-layer-123"), []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	// kill -9: abandon the instance.
	tl2 := openT(t, dir, commit, nil, pg.TimelineID{0xE0}, nil, 0)
	defer tl2.Close()
	for _, d := range stray {
		if _, err := os.Stat(filepath.Join(dir, d.Name)); !os.IsNotExist(err) {
			t.Fatalf("stray layer %s kept", d.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "tmp-layer-123")); !os.IsNotExist(err) {
		t.Fatal("temp file kept")
	}
	for i := 0; i < 10; i++ {
		got, err := tl2.GetPage(ctx, rel.Page(uint32(i)), LatestLSN, 0)
		if err != nil || !bytes.Equal(got, page(byte(i))) {
			t.Fatalf("page %d after the crash: %v", i, err)
		}
	}
	// The replayed log flushes normally.
	if err := tl2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := tl2.Nblocks(ctx, rel, LatestLSN); n != 10 {
		t.Fatalf("nblocks %d", n)
	}
	// Block 9 was written at 109: at 105 it does not exist yet.
	if _, err := tl2.Get(ctx, keyspace.RelBlock(rel.Page(9)), 105); !errors.Is(err, ErrNotFound) {
		t.Fatalf("page 9 at 105: %v", err)
	}
}
