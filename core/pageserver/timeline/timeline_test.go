package timeline

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

func page(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

func openT(t *testing.T, dir string, commit CommitLSNSource, remote *manifest.Remote, id pg.TimelineID, anc *Timeline, ancLSN pg.LSN) *Timeline {
	t.Helper()
	tl, err := Open(context.Background(), id, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote, Ancestor: anc, AncestorLSN: ancLSN})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

var rel = pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}

func TestDurabilityGate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	commit.Set(100)
	tl := openT(t, dir, commit, nil, pg.TimelineID{1}, nil, 0)
	// W=90 is below the commit LSN: durable at once.
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 90, Data: page(1)}}); err != nil {
		t.Fatal(err)
	}
	// W=150 is above: visible, not durable.
	d, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 150, Data: page(2)}})
	if err != nil {
		t.Fatal(err)
	}
	if d >= 150 || tl.LSNs().Pending == 0 {
		t.Fatalf("durable %s pending %d: the gate let W=150 through at commit 100", d, tl.LSNs().Pending)
	}
	if got, _ := tl.GetPage(ctx, rel.Page(0), LatestLSN, 0); !bytes.Equal(got, page(2)) {
		t.Fatal("pending write not visible to the writer")
	}
	if got, _ := tl.GetPage(ctx, rel.Page(0), 120, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("read at 120 must see W=90")
	}
	// Flushing does not write pending versions into layer files.
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range tl.Layers() {
		if l.LSNEnd > 150 {
			t.Fatalf("layer %s holds a gated version", l.Name)
		}
	}
	// A crash (Close without the commit LSN moving) forgets the pending version.
	tl.Close()
	tl = openT(t, dir, commit, nil, pg.TimelineID{1}, nil, 0)
	if got, _ := tl.GetPage(ctx, rel.Page(0), LatestLSN, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("the gated version survived a restart before the commit LSN reached it")
	}
	// Once the quorum reaches W, the version is durable.
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 150, Data: page(3)}}); err != nil {
		t.Fatal(err)
	}
	commit.Set(150)
	if err := tl.CommitAdvanced(); err != nil {
		t.Fatal(err)
	}
	if l := tl.LSNs(); l.Pending != 0 || l.Durable < 150 {
		t.Fatalf("after commit: %+v", l)
	}
	tl.Close()
	tl = openT(t, dir, commit, nil, pg.TimelineID{1}, nil, 0)
	defer tl.Close()
	if got, _ := tl.GetPage(ctx, rel.Page(0), LatestLSN, 0); !bytes.Equal(got, page(3)) {
		t.Fatal("committed version lost by a restart")
	}
	// Same W twice: the later write wins.
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 150, Data: page(4)}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := tl.GetPage(ctx, rel.Page(0), 150, 0); !bytes.Equal(got, page(4)) {
		t.Fatal("a later write at the same W must win")
	}
}

func TestRelationsAndWaitLSN(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl := openT(t, t.TempDir(), commit, nil, pg.TimelineID{2}, nil, 0)
	defer tl.Close()
	if err := tl.SetRelSize(ctx, rel, 0, 10); err != nil {
		t.Fatal(err)
	}
	if n, ok, _ := tl.Nblocks(ctx, rel, LatestLSN); !ok || n != 0 {
		t.Fatal("created relation")
	}
	if _, ok, _ := tl.Nblocks(ctx, rel, 9); ok {
		t.Fatal("relation exists before it was created")
	}
	if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(4), W: 20, Data: page(7)}}); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := tl.Nblocks(ctx, rel, LatestLSN); n != 5 {
		t.Fatalf("nblocks %d after writing block 4", n)
	}
	if got, err := tl.GetPage(ctx, rel.Page(2), LatestLSN, 0); err != nil || !bytes.Equal(got, make([]byte, pg.BlockSize)) {
		t.Fatalf("unwritten block inside the relation: %v", err)
	}
	if _, err := tl.GetPage(ctx, rel.Page(9), LatestLSN, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("block past the end: %v", err)
	}
	other := pg.RelTag{Spc: 1663, DB: 5, Rel: 16390, Fork: pg.FSMFork}
	_ = tl.SetRelSize(ctx, other, 3, 30)
	if sz, _ := tl.DBSize(ctx, 1663, 5, LatestLSN); sz != 8*pg.BlockSize {
		t.Fatalf("db size %d", sz)
	}
	if err := tl.DropRel(ctx, rel, 40); err != nil {
		t.Fatal(err)
	}
	rels, _ := tl.ListRels(ctx, keyspace.DBRange(1663, 5), LatestLSN)
	if len(rels) != 1 || rels[0] != other {
		t.Fatalf("rels after drop: %v", rels)
	}
	if rels, _ := tl.ListRels(ctx, keyspace.RelsRange, 35); len(rels) != 2 {
		t.Fatalf("rels at 35: %v", rels)
	}
	// not_modified_since ahead of what was ingested: wait, then time out.
	start := time.Now()
	if _, err := tl.GetPage(ctx, rel.Page(4), LatestLSN, 1000); !errors.Is(err, ErrWaitLSNTimeout) {
		t.Fatalf("want timeout, got %v", err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Fatal("did not wait")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = tl.Ingest(ctx, nil, 1000)
	}()
	if _, err := tl.GetPage(ctx, rel.Page(4), LatestLSN, 1000); err != nil {
		t.Fatalf("wait for ingest: %v", err)
	}
}

func TestFiles(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl := openT(t, t.TempDir(), commit, nil, pg.TimelineID{3}, nil, 0)
	defer tl.Close()
	ctl := bytes.Repeat([]byte("c"), 8192)
	if err := tl.WriteFile(ctx, "global/pg_control", 0, ctl, 10); err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteFile(ctx, "PG_VERSION", 0, []byte("15\n"), 10); err != nil {
		t.Fatal(err)
	}
	// Partial write in the middle of a block, then an extension with a gap.
	if err := tl.WriteFile(ctx, "global/pg_control", 100, []byte("XY"), 20); err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteFile(ctx, "pg_xact/0000", 3*8192+5, []byte("z"), 30); err != nil {
		t.Fatal(err)
	}
	got, err := tl.ReadFile(ctx, "global/pg_control", LatestLSN)
	want := bytes.Clone(ctl)
	copy(want[100:], "XY")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("pg_control: %v", err)
	}
	if old, _ := tl.ReadFile(ctx, "global/pg_control", 15); !bytes.Equal(old, ctl) {
		t.Fatal("pg_control at 15")
	}
	x, _ := tl.ReadFile(ctx, "pg_xact/0000", LatestLSN)
	if len(x) != 3*8192+6 || x[3*8192+5] != 'z' || bytes.Count(x, []byte{0}) != len(x)-1 {
		t.Fatalf("pg_xact: %d bytes", len(x))
	}
	// Truncate then extend: the cut bytes read as zeros.
	if err := tl.TruncateFile(ctx, "global/pg_control", 50, 40); err != nil {
		t.Fatal(err)
	}
	if err := tl.WriteFile(ctx, "global/pg_control", 8192, []byte("Q"), 41); err != nil {
		t.Fatal(err)
	}
	got, _ = tl.ReadFile(ctx, "global/pg_control", LatestLSN)
	if len(got) != 8193 || !bytes.Equal(got[:50], ctl[:50]) || bytes.Count(got[50:8192], []byte{0}) != 8142 || got[8192] != 'Q' {
		t.Fatalf("truncate+extend: %d bytes", len(got))
	}
	if err := tl.UnlinkFile(ctx, "PG_VERSION", 50); err != nil {
		t.Fatal(err)
	}
	files, _ := tl.ListFiles(ctx, LatestLSN)
	if len(files) != 2 {
		t.Fatalf("files: %+v", files)
	}
	if files, _ := tl.ListFiles(ctx, 45); len(files) != 3 {
		t.Fatalf("files at 45: %+v", files)
	}
	if _, err := tl.ReadFile(ctx, "PG_VERSION", LatestLSN); !errors.Is(err, ErrNotFound) {
		t.Fatal("unlinked file readable")
	}
}

// TestReplaceFile: ReplaceFile makes data the whole file in one step,
// shorter or longer than before or new; earlier LSNs read the old content,
// and an extension after a shrink reads zeros, not the old tail.
func TestReplaceFile(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl := openT(t, t.TempDir(), commit, nil, pg.TimelineID{6}, nil, 0)
	defer tl.Close()
	long := bytes.Repeat([]byte("old!"), 3*8192/4+2) // three blocks and 8 bytes
	if err := tl.WriteFile(ctx, "postgresql.auto.conf", 0, long, 10); err != nil {
		t.Fatal(err)
	}
	short := []byte("work_mem = '64MB'\n")
	if err := tl.ReplaceFile(ctx, "postgresql.auto.conf", short, 20); err != nil {
		t.Fatal(err)
	}
	if got, err := tl.ReadFile(ctx, "postgresql.auto.conf", LatestLSN); err != nil || !bytes.Equal(got, short) {
		t.Fatalf("after a shorter replace: %q, %v", got, err)
	}
	if got, _ := tl.ReadFile(ctx, "postgresql.auto.conf", 15); !bytes.Equal(got, long) {
		t.Fatalf("at 15, before the replace: %d bytes", len(got))
	}
	if err := tl.WriteFile(ctx, "postgresql.auto.conf", 2*8192, []byte("Z"), 30); err != nil {
		t.Fatal(err)
	}
	got, _ := tl.ReadFile(ctx, "postgresql.auto.conf", LatestLSN)
	if len(got) != 2*8192+1 || !bytes.Equal(got[:len(short)], short) || bytes.Count(got[len(short):2*8192], []byte{0}) != 2*8192-len(short) {
		t.Fatalf("extended after the replace: %d bytes, old bytes past the replaced end", len(got))
	}
	longer := bytes.Repeat([]byte("new"), 9000)
	if err := tl.ReplaceFile(ctx, "postgresql.auto.conf", longer, 40); err != nil {
		t.Fatal(err)
	}
	if got, _ := tl.ReadFile(ctx, "postgresql.auto.conf", LatestLSN); !bytes.Equal(got, longer) {
		t.Fatalf("after a longer replace: %d bytes", len(got))
	}
	if err := tl.ReplaceFile(ctx, "pg_logical/replorigin_checkpoint", []byte("fresh"), 50); err != nil {
		t.Fatal(err)
	}
	if got, _ := tl.ReadFile(ctx, "pg_logical/replorigin_checkpoint", LatestLSN); string(got) != "fresh" {
		t.Fatalf("a new file by replace: %q", got)
	}
	if err := tl.ReplaceFile(ctx, "postgresql.auto.conf", nil, 60); err != nil {
		t.Fatal(err)
	}
	if size, ok, err := tl.StatFile(ctx, "postgresql.auto.conf", LatestLSN); err != nil || !ok || size != 0 {
		t.Fatalf("replaced by nothing: size %d, exists %v, %v", size, ok, err)
	}
}

// TestBranch: a branch at X reads the parent's state at X, keeps it when
// the parent changes later ("branch before DELETE reads deleted rows"),
// and its own writes do not leak into the parent.
func TestBranch(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	store := objectstore.NewMemory()
	remote := &manifest.Remote{Store: store}
	parent := openT(t, t.TempDir(), commit, remote, pg.TimelineID{4}, nil, 0)
	defer parent.Close()
	_, _ = parent.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 100, Data: page(1)}, {Page: rel.Page(1), W: 100, Data: page(1)}})
	_ = parent.Flush(ctx)
	childID := pg.TimelineID{5}
	child := openT(t, t.TempDir(), commit, remote, childID, parent, 150)
	// The parent "deletes" after the branch point.
	_, _ = parent.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 200, Data: page(9)}})
	_ = parent.DropRel(ctx, pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}, 200)
	_, _ = child.PutPages(ctx, []PageWrite{{Page: rel.Page(1), W: 210, Data: page(5)}})
	if got, _ := child.GetPage(ctx, rel.Page(0), LatestLSN, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("branch sees the parent's write after the branch point")
	}
	if got, _ := child.GetPage(ctx, rel.Page(1), LatestLSN, 0); !bytes.Equal(got, page(5)) {
		t.Fatal("branch lost its own write")
	}
	if got, _ := parent.GetPage(ctx, rel.Page(1), LatestLSN, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("branch write leaked into the parent")
	}
	if n, _, _ := child.Nblocks(ctx, rel, LatestLSN); n != 2 {
		t.Fatalf("child nblocks %d", n)
	}
	// GC on the parent keeps what the branch point needs.
	parent.SetRetainLSNs([]pg.LSN{150})
	_ = parent.Flush(ctx)
	if err := parent.CreateImageLayer(ctx, 200); err != nil {
		t.Fatal(err)
	}
	parent.opts.GCHorizon = 0
	if _, err := parent.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if c := parent.LSNs().GCCutoff; c > 150 {
		t.Fatalf("parent GC cutoff %s passed the branch point", c)
	}
	if got, _ := child.GetPage(ctx, rel.Page(0), LatestLSN, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("branch read after parent GC")
	}
	// Image layers on the branch materialize the ancestor's pages too.
	_ = child.Flush(ctx)
	if err := child.CreateImageLayer(ctx, 210); err != nil {
		t.Fatal(err)
	}
	if got, _ := child.GetPage(ctx, rel.Page(0), 210, 0); !bytes.Equal(got, page(1)) {
		t.Fatal("branch image layer")
	}
	// A scan of the branch in windows of one key finds what one window
	// finds, over its own files and its ancestor's.
	_, _ = child.PutPages(ctx, []PageWrite{{Page: rel.Page(7), W: 220, Data: page(6)}})
	for _, upto := range []pg.LSN{150, 210, LatestLSN} {
		for _, tl := range []*Timeline{child, parent} {
			if len(scanInWindows(t, tl, upto, 1)) == 0 {
				t.Fatalf("no key at %s", upto)
			}
		}
	}
	child.Close()
}

// TestFencingAndEviction: a second pageserver that takes the timeline over
// from the object store fences the first; cold layers are evicted and
// fetched back on demand.
func TestFencingAndEviction(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	id := pg.TimelineID{6}
	a := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer a.Close()
	for i := 0; i < 20; i++ {
		_, _ = a.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(100 + i), Data: page(byte(i))}})
	}
	_ = a.Flush(ctx)
	if err := a.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	a.opts.MaxLocalBytes = 1
	if n := a.EvictCold(); n == 0 || a.LocalBytes() != 0 {
		t.Fatalf("evicted %d, %d bytes left", n, a.LocalBytes())
	}
	for i := 0; i < 20; i++ {
		if got, err := a.GetPage(ctx, rel.Page(uint32(i)), 110, 0); i <= 10 && (err != nil || !bytes.Equal(got, page(byte(i)))) {
			t.Fatalf("page %d after eviction: %v", i, err)
		}
	}
	if a.LocalBytes() == 0 {
		t.Fatal("nothing fetched back")
	}
	b := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer b.Close()
	_, _ = b.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 500, Data: page(50)}})
	_ = b.Flush(ctx)
	if err := b.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = a.PutPages(ctx, []PageWrite{{Page: rel.Page(0), W: 600, Data: page(60)}})
	_ = a.Flush(ctx)
	if err := a.Upload(ctx); !errors.Is(err, manifest.ErrFenced) {
		t.Fatalf("old owner not fenced: %v", err)
	}
	m, err := remote.Latest(ctx, id)
	if err != nil || m.Generation != 2 {
		t.Fatalf("latest manifest: %v %+v", err, m)
	}
}
