package pageserver_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

// writePage stores one page of b in timeline id at W 100, makes it
// durable and uploads it.
func writePage(t *testing.T, ps *pageserver.Pageserver, id pg.TimelineID, b byte) {
	t.Helper()
	ctx := context.Background()
	tl, err := ps.Timeline(id)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{b}, pg.BlockSize)
	if _, err := tl.PutPages(ctx, []timeline.PageWrite{{Page: unlistedRel.Page(0), W: 100, Data: data}}); err != nil {
		t.Fatal(err)
	}
	if err := ps.AdvanceCommitLSN(id, 100); err != nil {
		t.Fatal(err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
}

var unlistedRel = pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}

func readPage(t *testing.T, ps *pageserver.Pageserver, id pg.TimelineID) byte {
	t.Helper()
	tl, err := ps.Timeline(id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tl.GetPage(context.Background(), unlistedRel.Page(0), timeline.LatestLSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	return got[0]
}

// TestStartWhileStoreDown: a pageserver restarted while its object store
// does not answer serves the timelines on its disk; it refuses to make a
// timeline (the store may already hold that ID) and says that a timeline
// only the store holds is not listed yet; once the store answers, it
// opens that one too and makes timelines again. On an empty disk, or
// with a store that refuses (not a passing failure), it does not start.
func TestStartWhileStoreDown(t *testing.T) {
	defer pageserver.SetListEvery(100 * time.Millisecond)()
	ctx := context.Background()
	store := faulty.New(objectstore.NewMemory(), faulty.Config{Seed: 1})
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	local, other, fresh := pg.TimelineID{0xA1}, pg.TimelineID{0xB2}, pg.TimelineID{0xC3}

	ps, err := pageserver.New(ctx, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.CreateTimeline(ctx, local); err != nil {
		t.Fatal(err)
	}
	writePage(t, ps, local, 1)
	ps.Close()
	// Another pageserver's timeline: in the store, not on this disk.
	cfg2 := cfg
	cfg2.DataDir = t.TempDir()
	ps2, err := pageserver.New(ctx, cfg2, pageserver.Deps{Log: zerolog.Nop(), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps2.CreateTimeline(ctx, other); err != nil {
		t.Fatal(err)
	}
	writePage(t, ps2, other, 2)
	ps2.Close()

	store.Add(faulty.Rule{Transient: true})
	ps, err = pageserver.New(ctx, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: store})
	if err != nil {
		t.Fatalf("restart with the store down and the timeline on disk: %v", err)
	}
	defer ps.Close()
	if got := readPage(t, ps, local); got != 1 {
		t.Fatalf("local timeline's page reads %d, want 1", got)
	}
	_, err = ps.Timeline(other)
	if !errors.Is(err, pageserver.ErrNoTimeline) || !errors.Is(err, pageserver.ErrNotListed) {
		t.Fatalf("a timeline only the store holds, store down: %v; want ErrNoTimeline and ErrNotListed", err)
	}
	if _, err := ps.CreateTimeline(ctx, fresh); !errors.Is(err, pageserver.ErrNotListed) {
		t.Fatalf("creating a timeline with the store down: %v; want ErrNotListed", err)
	}
	if _, err := ps.Branch(ctx, local, other, 0); !errors.Is(err, pageserver.ErrNotListed) {
		t.Fatalf("branching onto an ID the store holds, store down: %v; want ErrNotListed", err)
	}
	// Writes go on, gated as always; the upload waits for the store.
	tl, _ := ps.Timeline(local)
	data := bytes.Repeat([]byte{3}, pg.BlockSize)
	if _, err := tl.PutPages(ctx, []timeline.PageWrite{{Page: unlistedRel.Page(0), W: 200, Data: data}}); err != nil {
		t.Fatal(err)
	}
	if err := ps.AdvanceCommitLSN(local, 200); err != nil {
		t.Fatal(err)
	}
	if got := readPage(t, ps, local); got != 3 {
		t.Fatalf("after a write with the store down the page reads %d, want 3", got)
	}

	// On an empty disk there is nothing to serve without the list.
	empty := cfg
	empty.DataDir = t.TempDir()
	if ps3, err := pageserver.New(ctx, empty, pageserver.Deps{Log: zerolog.Nop(), Store: store}); err == nil {
		ps3.Close()
		t.Fatal("a pageserver on an empty disk started while its store does not answer")
	}
	// A store that refuses (not a passing failure) stops the start.
	store.Reset()
	store.Add(faulty.Rule{Ops: faulty.OpList, Err: errors.New("access denied")})
	cfg4 := cfg2 // ps2's folder, closed
	if ps4, err := pageserver.New(ctx, cfg4, pageserver.Deps{Log: zerolog.Nop(), Store: store}); err == nil || !strings.Contains(err.Error(), "access denied") {
		if err == nil {
			ps4.Close()
		}
		t.Fatalf("a store that refuses to list: %v; want the start to fail with its error", err)
	}

	store.Reset()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err = ps.Timeline(other); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the store answers again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := readPage(t, ps, other); got != 2 {
		t.Fatalf("the store's timeline reads %d, want 2", got)
	}
	if _, err := ps.CreateTimeline(ctx, fresh); err != nil {
		t.Fatalf("creating a timeline once the store answers: %v", err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatalf("upload once the store answers: %v", err)
	}
}
