package timeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestPITRAfterRestart: the LSN-time history that pitr reads comes back
// from the layer files' times at Open. Layers written just now keep the
// cutoff at zero after a restart (their history is younger than pitr);
// once the files are two hours old, a restarted pageserver moves the cutoff
// past them. Before, the history was lost at every restart, and a
// pageserver restarted more often than pitr never collected anything.
func TestPITRAfterRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	commit := &CommitLSN{}
	opts := smallOpts()
	opts.PITR = time.Hour
	opts.GCHorizon = 10
	open := func() *Timeline {
		tl, err := Open(ctx, pg.TimelineID{7}, dir, opts, Deps{Log: zerolog.Nop(), Commit: commit, Redo: concatRedo{}})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tl := open()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: 0})
	putHistory(t, tl, commit, k, 1, 20)
	gcCutoff := func(tl *Timeline) pg.LSN {
		if _, err := tl.GC(ctx); err != nil {
			t.Fatal(err)
		}
		return tl.LSNs().GCCutoff
	}
	if c := gcCutoff(tl); c != 0 {
		t.Fatalf("cutoff %s with every version younger than pitr", c)
	}
	tl.Close()

	tl = open()
	if c := gcCutoff(tl); c != 0 {
		t.Fatalf("cutoff %s after a restart, with layer files written just now", c)
	}
	tl.Close()

	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	n := 0
	for _, e := range ents {
		if layer.ValidName(e.Name()) {
			if err := os.Chtimes(filepath.Join(dir, e.Name()), old, old); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n < 4 {
		t.Fatalf("%d layer files, want the four flushes and the image layer", n)
	}
	tl = open()
	defer tl.Close()
	c := gcCutoff(tl)
	if c != 2000-10 {
		t.Fatalf("cutoff %s after a restart with two-hour-old layers; want %s: every layer is older than pitr, so gc_horizon (10) below the last record %s decides", c, pg.LSN(2000-10), pg.LSN(2000))
	}
	if d, err := tl.Get(ctx, k, LatestLSN); err != nil || string(d) != "v20" {
		t.Fatalf("latest value %q, %v; want v20", d, err)
	}
}

// putHistory writes versions "v<i>" of k at LSN 100*i for i in [from, to],
// each committed, flushing after every fifth, then makes an image layer
// at the durable LSN: a history that GC can cut.
func putHistory(t *testing.T, tl *Timeline, commit *CommitLSN, k keyspace.Key, from, to int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i <= to; i++ {
		lsn := pg.LSN(100 * i)
		commit.Set(lsn)
		if _, err := tl.Put(ctx, []Change{{Key: k, LSN: lsn, Kind: layer.Image, Data: []byte(fmt.Sprintf("v%d", i))}}); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if err := tl.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tl.CreateImageLayer(ctx, tl.LSNs().Durable); err != nil {
		t.Fatal(err)
	}
}
