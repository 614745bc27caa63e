package timeline

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestQuietGCSavesNoManifest: a GC round on a timeline where nothing
// changed leaves the local manifest file alone (no rewrite, no fsync);
// a change (a flush, a raised cutoff) still writes it, and a restart reads
// what the last save wrote.
func TestQuietGCSavesNoManifest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	opts := smallOpts()
	opts.GCHorizon = 50
	opts.PITR = time.Nanosecond
	open := func() *Timeline {
		tl, err := Open(ctx, pg.TimelineID{9}, dir, opts, Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	path := filepath.Join(dir, manifestFile)
	stat := func() os.FileInfo {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	cur := open()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: 0})
	put := func(lsn pg.LSN) {
		commit.Set(lsn)
		if _, err := cur.Put(ctx, []Change{{Key: k, LSN: lsn, Kind: layer.Image, Data: []byte{byte(lsn)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for lsn := pg.LSN(100); lsn <= 300; lsn += 100 {
		put(lsn)
	}
	if err := cur.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cur.GC(ctx); err != nil {
		t.Fatal(err)
	}
	before := stat()
	for i := 0; i < 3; i++ {
		if _, err := cur.GC(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := stat(); !os.SameFile(before, after) {
		t.Fatal("quiet GC rounds rewrote the local manifest")
	}

	// A change is saved: a flush adds a layer, and the next GC raises the
	// cutoff (the history is older than pitr, the horizon is behind).
	put(400)
	if err := cur.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if after := stat(); os.SameFile(before, after) {
		t.Fatal("a flush did not write the local manifest")
	}
	flushed := stat()
	if _, err := cur.GC(ctx); err != nil {
		t.Fatal(err)
	}
	cutoff := cur.LSNs().GCCutoff
	if cutoff == 0 {
		t.Fatal("GC did not raise the cutoff")
	}
	if after := stat(); os.SameFile(flushed, after) {
		t.Fatal("a raised GC cutoff was not saved")
	}
	cur.Close()

	cur = open()
	defer cur.Close()
	if got := cur.LSNs().GCCutoff; got != cutoff {
		t.Fatalf("after a restart the cutoff is %s, saved %s", got, cutoff)
	}
}
