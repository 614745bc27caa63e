package timeline

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestPushdownMaterializes: with PushdownPolicy{N: 3}, the third delta
// after a base version makes Ingest store an image at the same LSN, so
// reads stop there.
func TestPushdownMaterializes(t *testing.T) {
	ctx := context.Background()
	tl, err := Open(ctx, pg.TimelineID{0xD0}, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: &CommitLSN{},
		Redo: concatRedo{}, Policy: PushdownPolicy{N: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1})
	steps := []Change{
		{Key: k, LSN: 10, Kind: layer.WillInit, Data: []byte("a")},
		{Key: k, LSN: 20, Kind: layer.Delta, Data: []byte("b")},
		{Key: k, LSN: 30, Kind: layer.Delta, Data: []byte("c")},
		{Key: k, LSN: 40, Kind: layer.Delta, Data: []byte("d")},
	}
	for _, c := range steps {
		if err := tl.Ingest(ctx, []Change{c}, c.LSN); err != nil {
			t.Fatal(err)
		}
	}
	cs, _, err := tl.collect(ctx, k, 40)
	if err != nil {
		t.Fatal(err)
	}
	// b, c, d are three deltas after the will_init a: an image at 40,
	// ranked above the delta at the same LSN, ends the read.
	if len(cs) != 1 || cs[0].v.Kind != layer.Image || cs[0].v.LSN != 40 || string(cs[0].v.Data) != "abcd" {
		for _, c := range cs {
			t.Logf("%s %s %q", c.v.LSN, c.v.Kind, c.v.Data)
		}
		t.Fatal("no image materialized after 3 deltas")
	}
	if got, _ := tl.Get(ctx, k, 40); string(got) != "abcd" {
		t.Fatalf("value %q", got)
	}
	if got, _ := tl.Get(ctx, k, 35); string(got) != "abc" {
		t.Fatalf("value at 35 %q", got)
	}
}

// TestBackpressure: a writer that never lets the background flush (there is
// none here) still keeps at most maxFrozen frozen layers.
func TestBackpressure(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	o := smallOpts()
	o.CheckpointDistance = 8 << 10
	tl, err := Open(ctx, pg.TimelineID{0xD1}, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	for i := 0; i < 60; i++ {
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(10 + i), Data: page(byte(i))}}); err != nil {
			t.Fatal(err)
		}
		tl.mu.RLock()
		n := len(tl.frozen)
		tl.mu.RUnlock()
		if n > maxFrozen {
			t.Fatalf("%d frozen layers", n)
		}
	}
	if len(tl.Layers()) == 0 {
		t.Fatal("nothing flushed")
	}
}
