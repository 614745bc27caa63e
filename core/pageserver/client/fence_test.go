package client_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// TestBeginTermFencesDeadCompute plays a compute of term 1 that dies with
// pending versions, some below and some above the durable end E that the
// new compute of term 2 got from the election: BeginTerm(2, E) drops only
// the ones above E; when the commit LSN later passes them they never
// become durable; writes of term 1 are refused on every mutation call; the
// term survives a pageserver restart, and the restart shows a new
// incarnation.
func TestBeginTermFencesDeadCompute(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h := start(t, dir, nil)
	c := h.c
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	old, err := client.Dial(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	old.SetTerm(1)
	// Durable base at 100 (block 0), then pending writes of term 1.
	if _, err := old.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(0), W: 100, Data: page(1)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.AdvanceCommitLSN(ctx, tl, 100); err != nil {
		t.Fatal(err)
	}
	a, err := old.PutPagesAck(ctx, tl, []client.PageWrite{
		{Page: rel.Page(0), W: 150, Data: page(2)}, // below E: kept
		{Page: rel.Page(1), W: 250, Data: page(3)}, // above E: dropped
	})
	if err != nil {
		t.Fatal(err)
	}
	if a.Incarnation == 0 || a.Incarnation != h.ps.Incarnation() || a.Durable >= 150 {
		t.Fatalf("ack %+v, incarnation %d", a, h.ps.Incarnation())
	}
	if err := old.WriteFile(ctx, tl, "postgresql.auto.conf", 0, page(4), 260); err != nil {
		t.Fatal(err)
	}
	// The new compute won term 2 with durable end E = 200.
	n, ack, err := c.BeginTerm(ctx, tl, 2, 200)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 { // block 1 and the size it extended, the file's block and meta
		t.Fatalf("BeginTerm dropped %d versions, want 4", n)
	}
	if ack.Incarnation != a.Incarnation || c.Term() != 2 {
		t.Fatalf("ack %+v term %d", ack, c.Term())
	}
	got, err := c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN})
	if err != nil || !bytes.Equal(got, page(2)) {
		t.Fatalf("block 0 (pending below E) lost: %v", err)
	}
	if sz, err := c.Nblocks(ctx, tl, []pg.RelTag{rel}, client.LatestLSN, 0); err != nil || sz[0].Nblocks != 1 {
		t.Fatalf("relation size after the drop: %+v %v", sz, err)
	}
	if _, err := c.GetFile(ctx, tl, "postgresql.auto.conf", client.LatestLSN); err == nil {
		t.Fatal("the dead compute's file write survived BeginTerm")
	}
	// Term 1 is fenced on every mutation.
	if _, err := old.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(5), W: 300, Data: page(5)}}); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("PutPages of term 1: %v", err)
	}
	if err := old.SetRelSize(ctx, tl, rel, 9, 300); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("SetRelSize of term 1: %v", err)
	}
	if err := old.DropRel(ctx, tl, rel, 300); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("DropRel of term 1: %v", err)
	}
	if err := old.WriteFile(ctx, tl, "x", 0, []byte("x"), 300); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("WriteFile of term 1: %v", err)
	}
	if err := old.UnlinkFile(ctx, tl, "x", 300); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("UnlinkFile of term 1: %v", err)
	}
	if _, _, err := old.BeginTerm(ctx, tl, 1, 200); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("BeginTerm of term 1 after 2: %v", err)
	}
	// The same term again is a no-op (a retried call).
	if n, _, err := c.BeginTerm(ctx, tl, 2, 0); err != nil || n != 0 {
		t.Fatalf("BeginTerm retried: %d %v", n, err)
	}
	// Term 0 is unfenced; term 2 writes.
	if _, err := c.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(1), W: 230, Data: page(6)}}); err != nil {
		t.Fatal(err)
	}
	// The commit LSN passes every W: the dropped versions must not appear.
	if err := c.AdvanceCommitLSN(ctx, tl, 400); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(1), RequestLSN: client.LatestLSN}); err != nil || !bytes.Equal(got, page(6)) {
		t.Fatalf("block 1 is not the new term's write: %v", err)
	}
	if got, err := c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(1), RequestLSN: 260}); err == nil && bytes.Equal(got, page(3)) {
		t.Fatal("the dropped version of block 1 is readable at 260")
	}
	d, err := c.GetDurable(ctx, tl)
	if err != nil || d.Durable < 230 || d.Incarnation != a.Incarnation {
		t.Fatalf("GetDurable %+v %v", d, err)
	}
	infos, err := c.ListTimelines(ctx)
	if err != nil || infos[0].Term != 2 || infos[0].Incarnation != a.Incarnation {
		t.Fatalf("ListTimelines %+v %v", infos, err)
	}
	// Restart: a new incarnation, the same term.
	h.stop()
	h2 := start(t, dir, nil)
	d2, err := h2.c.GetDurable(ctx, tl)
	if err != nil || d2.Incarnation == a.Incarnation || d2.Incarnation == 0 {
		t.Fatalf("incarnation after restart %+v (before %d) %v", d2, a.Incarnation, err)
	}
	if h2.c.Incarnation() != d2.Incarnation {
		t.Fatalf("client incarnation %d, answer %d", h2.c.Incarnation(), d2.Incarnation)
	}
	h2.c.SetTerm(1)
	if _, err := h2.c.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(7), W: 500, Data: page(7)}}); !errors.Is(err, pageserver.ErrStaleTerm) {
		t.Fatalf("term 1 after restart: %v", err)
	}
	if got, err := h2.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN}); err != nil || !bytes.Equal(got, page(2)) {
		t.Fatalf("block 0 after restart: %v", err)
	}
}

// TestIncarnationLosesPending shows what the incarnation protects: a
// pending version is gone after a restart, and only the changed
// incarnation tells the writer.
func TestIncarnationLosesPending(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h := start(t, dir, nil)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	a, err := h.c.PutPagesAck(ctx, tl, []client.PageWrite{{Page: rel.Page(0), W: 100, Data: page(1)}})
	if err != nil || a.Durable >= 100 {
		t.Fatalf("%+v %v", a, err)
	}
	h.stop()
	h2 := start(t, dir, nil)
	d, err := h2.c.GetDurable(ctx, tl)
	if err != nil {
		t.Fatal(err)
	}
	if d.Incarnation == a.Incarnation {
		t.Fatal("same incarnation after a restart")
	}
	if _, err := h2.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN}); err == nil {
		t.Fatal("a pending version survived the restart")
	}
}

// TestBeginTermRace: writers of term 1 keep writing pages above E while
// the new compute begins term 2; every term 1 write is refused from then
// on, and none that was acknowledged survives, even after the commit LSN
// passes every W.
func TestBeginTermRace(t *testing.T) {
	ctx := context.Background()
	h := start(t, t.TempDir(), nil)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	const e = 1000
	type acked struct{ blk, w uint32 }
	var mu sync.Mutex
	var accepted []acked
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := uint32(0); g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			old, err := client.Dial(h.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer old.Close()
			old.SetTerm(1)
			for i := uint32(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				blk, w := g*1000+i%100, e+1+i
				_, err := old.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(blk), W: pg.LSN(w), Data: page(byte(g + 1))}})
				if errors.Is(err, pageserver.ErrStaleTerm) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				accepted = append(accepted, acked{blk, w})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	n, _, err := h.c.BeginTerm(ctx, tl, 2, e)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait() // every writer saw ErrStaleTerm (or stopped on error)
	close(stop)
	// Every acknowledged term 1 write was accepted before BeginTerm took
	// the fence, so it was pending (commit LSN 0) and dropped.
	if n < len(accepted) {
		t.Fatalf("BeginTerm dropped %d versions, %d term 1 page writes were acknowledged", n, len(accepted))
	}
	if err := h.c.AdvanceCommitLSN(ctx, tl, 1<<40); err != nil {
		t.Fatal(err)
	}
	infos, err := h.c.ListTimelines(ctx)
	if err != nil || infos[0].LSNs.Pending != 0 {
		t.Fatalf("%+v %v", infos, err)
	}
	for _, a := range accepted {
		if _, err := h.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(a.blk), RequestLSN: client.LatestLSN}); !errors.Is(err, timeline.ErrNotFound) {
			t.Fatalf("block %d written by term 1 at W %d is readable after BeginTerm(2, %d): %v", a.blk, a.w, e, err)
		}
	}
	t.Logf("%d term 1 writes acknowledged, %d versions dropped", len(accepted), n)
}
