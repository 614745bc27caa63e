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

// TestBackgroundUploadThroughFaultyStore: the background loop uploads
// through sdk/objectstore/faulty (failed calls, uploads and downloads that
// break mid-stream, latency) with no retry wrapper; it must retry until the
// remote consistent LSN covers every write, and a pageserver on an empty
// disk must then read every page back (reads retried by the caller).
func TestBackgroundUploadThroughFaultyStore(t *testing.T) {
	ctx := context.Background()
	mem := objectstore.NewMemory()
	fs := faulty.New(mem, faulty.Config{Seed: 42, Rules: []faulty.Rule{
		{Fault: faulty.FailCall, Transient: true, Probability: 0.2},
		{Ops: faulty.OpPut | faulty.OpGet, Fault: faulty.FailStream, After: 20000, Transient: true, Probability: 0.2},
		{Fault: faulty.Delay, Latency: 200 * time.Microsecond},
	}})
	remote := &manifest.Remote{Store: fs, Parallel: 4}
	commit := &CommitLSN{}
	o := smallOpts()
	o.NoBackground = false
	o.BackgroundInterval = 5 * time.Millisecond
	o.LayerTargetSize = 64 << 10
	id := pg.TimelineID{0xFA}
	var tl *Timeline
	var err error
	for i := 0; i < 50; i++ { // reading the (missing) remote manifest may fail
		if tl, err = Open(ctx, id, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	want := map[pg.PageKey][]byte{}
	var last pg.LSN
	for i := 0; i < 200; i++ {
		pk := rel.Page(uint32(i % 50))
		last = pg.LSN(1000 + 10*i)
		p := bytes.Repeat([]byte{byte(i)}, pg.BlockSize)
		commit.Set(last)
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: pk, W: last, Data: p}}); err != nil {
			t.Fatal(err)
		}
		want[pk] = p
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for tl.LSNs().RemoteConsistent < last && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := tl.LSNs().RemoteConsistent; got < last {
		t.Fatalf("remote consistent LSN %s, want %s", got, last)
	}
	tl.Close()
	var tl2 *Timeline
	for i := 0; i < 50; i++ {
		if tl2, err = Open(ctx, id, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Remote: remote}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer tl2.Close()
	for pk, p := range want {
		var got []byte
		for i := 0; i < 50; i++ {
			if got, err = tl2.GetPage(ctx, pk, LatestLSN, 0); err == nil {
				break
			}
		}
		if err != nil || !bytes.Equal(got, p) {
			t.Fatalf("%s: %v", pk, err)
		}
	}
}
