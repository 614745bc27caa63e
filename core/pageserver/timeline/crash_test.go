package timeline

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
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

// TestResumeAtRecordBoundary: the LSN a restarted timeline resumes WAL
// ingest from (its last record LSN) is the end of a WAL record, never the
// LSN just below the oldest version still in memory. A manifest saved
// while ingested versions sat in memory named that LSN (0/2231F1F, say:
// inside a record), and a pageserver that lost those versions in a kill
// -9, or that started on an empty disk from the object store, opened its
// WAL stream there and never ingested again.
func TestResumeAtRecordBoundary(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	id := pg.TimelineID{0xE1}
	tl := openT(t, dir, commit, remote, id, nil, 0)
	ingestTwoRecords(t, tl)
	// The next batch is ingested but not synced, and a manifest is saved
	// meanwhile (the background loop does, after each flush and upload).
	b := []Change{{Key: keyspace.RelBlock(rel.Page(2)), LSN: 0x2008, Kind: layer.Image, Data: page(3)}}
	if err := tl.IngestBuffered(ctx, b, 0x2008); err != nil {
		t.Fatal(err)
	}
	if err := tl.saveLocal(); err != nil {
		t.Fatal(err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	// kill -9 before the log was synced: the batch is lost.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), logPrefix) {
			if err := os.Truncate(filepath.Join(dir, e.Name()), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	tl2 := openT(t, dir, commit, remote, id, nil, 0)
	defer tl2.Close()
	if got := tl2.LSNs().LastRecord; got != 0x1018 {
		t.Errorf("after a kill -9 the timeline resumes at %s, want 0/1018 (the end of the last record it holds)", got)
	}
	// A pageserver on an empty disk, from the object store alone.
	tl3 := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl3.Close()
	if got := tl3.LSNs().LastRecord; got != 0x1018 {
		t.Errorf("from the object store the timeline resumes at %s, want 0/1018", got)
	}
	if got, err := tl3.GetPage(ctx, rel.Page(1), LatestLSN, 0); err != nil || !bytes.Equal(got, page(2)) {
		t.Fatalf("page 1 from the object store: %v", err)
	}
}

// TestFirstDataPublishedAtOnce: a new timeline's first durable data (a
// new cluster's initdb output, one gated batch) is frozen at the next
// background round instead of after the checkpoint timeout (an hour
// here), so the object store holds it before anything else happens; a
// pageserver on an empty disk then finds it. Later data waits for the
// usual triggers.
func TestFirstDataPublishedAtOnce(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(50)
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	id := pg.TimelineID{0xE2}
	tl := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl.Close()
	round := func() {
		t.Helper()
		if err := tl.CommitAdvanced(); err != nil {
			t.Fatal(err)
		}
		tl.maybeFreeze()
		if err := tl.flushFrozen(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tl.Upload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// One page: below the checkpoint distance (16 KiB here).
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 90, Data: page(1)}}); err != nil {
		t.Fatal(err)
	}
	round()
	if n := len(tl.Layers()); n != 0 {
		t.Fatalf("%d layers before the batch is durable, want 0 (gated versions are never flushed)", n)
	}
	commit.Set(100)
	round()
	m, err := remote.Latest(ctx, id)
	if err != nil || len(m.Layers) == 0 {
		t.Fatalf("the object store's manifest after the first durable batch: %+v, %v; want a layer", m, err)
	}
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(2), W: 95, Data: page(3)}}); err != nil {
		t.Fatal(err)
	}
	round()
	if n := len(tl.Layers()); n != len(m.Layers) {
		t.Fatalf("%d layers after a later write, want %d: only a timeline without layers flushes at once", n, len(m.Layers))
	}
	tl2 := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl2.Close()
	if got, err := tl2.GetPage(ctx, rel.Page(0), LatestLSN, 0); err != nil || !bytes.Equal(got, page(1)) {
		t.Fatalf("page 0 from the object store alone: %v", err)
	}
}

// TestBatchNeverSpansLayers: the consistent LSN, where a timeline restarted
// from the object store resumes WAL ingest, must cover every version in
// layer files and none in memory, so one ingest batch (its deltas, then the
// image policy's images at the same LSNs) must land in one in-memory
// layer. The deltas used to fill the open layer past the checkpoint
// distance and freeze it before the images were stored in the next one:
// once the first was flushed, the manifest's consistent LSN was below
// deltas in layer files, and a pageserver on an empty disk ingested those
// records again (seen under strata up: "will not overwrite used item").
func TestBatchNeverSpansLayers(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	id := pg.TimelineID{0xE3}
	open := func(dir string) *Timeline {
		tl, err := Open(ctx, id, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote,
			Redo: concatRedo{}, Policy: PushdownPolicy{N: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tl := open(t.TempDir())
	defer tl.Close()
	k := keyspace.RelBlock(rel.Page(0))
	if err := tl.Ingest(ctx, []Change{{Key: k, LSN: 0x100, Kind: layer.WillInit, Data: []byte("a")}}, 0x100); err != nil {
		t.Fatal(err)
	}
	// More than the checkpoint distance (16 KiB) in one batch: a new page
	// (a base: no image due) and a delta of k, for which the policy adds a
	// small image at 0x200.
	big := bytes.Repeat([]byte("n"), 20<<10)
	if err := tl.Ingest(ctx, []Change{
		{Key: keyspace.RelBlock(rel.Page(1)), LSN: 0x200, Kind: layer.WillInit, Data: big},
		{Key: k, LSN: 0x200, Kind: layer.Delta, Data: []byte("b")},
	}, 0x200); err != nil {
		t.Fatal(err)
	}
	if err := tl.flushFrozen(ctx); err != nil {
		t.Fatal(err)
	}
	tl.mu.RLock()
	m := tl.manifestLocked()
	tl.mu.RUnlock()
	for _, d := range m.Layers {
		if d.IsDelta() && d.LSNEnd-1 > m.DiskConsistentLSN {
			t.Fatalf("layer %s holds versions up to %s, above the consistent LSN %s", d.Name, d.LSNEnd-1, m.DiskConsistentLSN)
		}
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	tl2 := open(t.TempDir())
	defer tl2.Close()
	if got := tl2.LSNs().LastRecord; got > 0x100 && got < 0x200 {
		t.Fatalf("from the object store the timeline resumes at %s, inside what its layers hold", got)
	}
}

// TestMaterializedImageKeepsRecordFloor: WAL ingest stores images
// materialized after their batch at the batch's end LSN (walingest's SLRU
// pages), in a call of their own. When that call opened a new in-memory
// layer, the layer's floor became the LSN just below the images, inside
// the last record, and a manifest published meanwhile named it as the
// consistent LSN: a replacement from the object store could not resume WAL
// ingest there (CI, TestReplacePageserverDuringIngest: "cannot resume WAL
// ingest at 0/233118F: not the start of a WAL record"). The images are
// made of versions stored already: the record end stays the floor.
func TestMaterializedImageKeepsRecordFloor(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	id := pg.TimelineID{0xE2}
	tl := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl.Close()
	ingestTwoRecords(t, tl)
	// The materialized image lands in a new in-memory layer.
	img := []Change{{Key: keyspace.SLRUBlock(keyspace.SLRUXact, 0, 0), LSN: 0x1018, Kind: layer.Image, Data: page(3)}}
	if err := tl.IngestBuffered(ctx, img, 0x1018); err != nil {
		t.Fatal(err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tl.LSNs().RemoteConsistent; got != 0x1018 {
		t.Errorf("the object store's consistent LSN is %s, want 0/1018 (the end of the last record)", got)
	}
	tl2 := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl2.Close()
	if got := tl2.LSNs().LastRecord; got != 0x1018 {
		t.Errorf("a replacement from the object store resumes at %s, want 0/1018", got)
	}
}

// ingestTwoRecords ingests two WAL records, ending at 0x1010 and 0x1018
// (pages 0 and 1 of rel, page(1) and page(2)), and flushes them into a
// layer file: their versions carry those LSNs, and the timeline's last
// record LSN becomes 0x1018.
func ingestTwoRecords(t *testing.T, tl *Timeline) {
	t.Helper()
	ctx := context.Background()
	a := []Change{
		{Key: keyspace.RelBlock(rel.Page(0)), LSN: 0x1010, Kind: layer.Image, Data: page(1)},
		{Key: keyspace.RelBlock(rel.Page(1)), LSN: 0x1018, Kind: layer.Image, Data: page(2)},
	}
	if err := tl.Ingest(ctx, a, 0x1018); err != nil {
		t.Fatal(err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
