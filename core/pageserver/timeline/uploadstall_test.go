package timeline

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

// TestWritesGoOnWhileUploadStalls: an upload stuck on an object store
// that does not answer holds up neither the writes nor the flushes. The
// writes here outrun the background loop's flushes many times over, so
// each one past maxFrozen frozen layers flushes them itself; that flush
// used to wait for the upload's lock (the stall timeout, 2 minutes by
// default, per attempt). A publish with a deadline gives up at it
// rather than wait for the upload under way. After the stall, everything
// written reaches the store.
func TestWritesGoOnWhileUploadStalls(t *testing.T) {
	ctx := context.Background()
	store := faulty.New(objectstore.NewMemory(), faulty.Config{Seed: 1})
	remote := &manifest.Remote{Store: store}
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	id, dir := pg.TimelineID{0x5A}, t.TempDir()
	opts := smallOpts()
	opts.NoBackground = false
	opts.BackgroundInterval = 10 * time.Millisecond
	tl, err := Open(ctx, id, dir, opts, Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote})
	if err != nil {
		t.Fatal(err)
	}
	// No deferred Close: when the writes block, so would Close (it takes
	// the write lock), and the test would hang instead of failing.
	write := func(i int) {
		t.Helper()
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(100 + i), Data: page(byte(i))}}); err != nil {
			t.Error(err)
		}
	}
	putAndUpload(t, tl, 0, 10)

	// Every upload from here on hangs until its context ends.
	store.Add(faulty.Rule{Ops: faulty.OpPut, Fault: faulty.Delay, Latency: time.Hour})
	// The writes run on their own goroutine: a blocked one must fail the
	// test, not hang it.
	var i, stalledAt int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i = 10; stalledAt == 0 || i < stalledAt+400; i++ {
			if stalledAt == 0 && store.Fired() > 0 {
				stalledAt = i
			}
			write(i)
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("writes (16 KiB layers, %d frozen at most) blocked for 60 s while an upload stalled", maxFrozen)
	}
	if st := tl.LSNs(); st.RemoteConsistent >= pg.LSN(100+stalledAt) {
		t.Fatalf("remote consistent LSN %s: the store took writes made after it stalled", st.RemoteConsistent)
	}
	for j := 0; j < i; j++ {
		got, err := tl.GetPage(ctx, rel.Page(uint32(j)), LatestLSN, 0)
		if err != nil || !bytes.Equal(got, page(byte(j))) {
			t.Fatalf("page %d during the stall: %v", j, err)
		}
	}
	// A publish with a deadline (the pageserver's at shutdown) gives up
	// at its deadline; it does not wait for the upload that hangs.
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- tl.Publish(pctx) }()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a publish succeeded while every upload hangs")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a publish with a 0.5 s deadline waited 30 s for the upload that hangs")
	}
	// Close ends the stuck upload; the next start uploads the rest.
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	store.Reset()
	tl = openT(t, dir, commit, remote, id, nil, 0)
	if err := tl.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	tl.Close()
	checkPages(t, remote, id, commit, i)
}
