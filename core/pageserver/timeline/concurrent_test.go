package timeline

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestConcurrentWithBackground runs writers and readers against a timeline
// whose background loop flushes, compacts, writes image layers, GCs,
// uploads and evicts all the time, and checks read-your-writes and reads
// at older LSNs. Run it with -race.
//
// In order, W is drawn and the write made under one lock: writes reach the
// timeline in W order, as from the one compute that writes a timeline.
// Unordered, a write can arrive below an image layer made meanwhile; the
// timeline raises it to the image's LSN, so read-your-write holds, but
// reads at its own W need not see it (PutPages), and are not checked.
// Before writes were raised, the unordered run read the image's older page
// about once in 100 runs under load.
func TestConcurrentWithBackground(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(map[bool]string{true: "ordered", false: "unordered"}[ordered], func(t *testing.T) {
			concurrentWithBackground(t, ordered)
		})
	}
}

func concurrentWithBackground(t *testing.T, ordered bool) {
	ctx := context.Background()
	commit := &CommitLSN{}
	o := smallOpts()
	o.NoBackground = false
	o.BackgroundInterval = 3 * time.Millisecond
	o.CheckpointDistance = 64 << 10
	o.LayerTargetSize = 32 << 10
	o.CompactionThreshold = 3
	o.GCHorizon = 2000
	o.MaxLocalBytes = 64 << 10
	remote := &manifest.Remote{Store: objectstore.NewMemory()}
	tl, err := Open(ctx, pg.TimelineID{0xC0}, t.TempDir(), o, Deps{Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), Commit: commit, Remote: remote,
		Policy: WritebackPolicy{ImageLayerBytes: 128 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	var lsnMu sync.Mutex
	lsn := pg.LSN(1000)
	put := func(rel pg.RelTag, blk uint32, p []byte) (pg.LSN, error) {
		lsnMu.Lock()
		lsn += 10
		w := lsn
		if !ordered {
			lsnMu.Unlock()
		}
		_, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(blk), W: w, Data: p}})
		if ordered {
			lsnMu.Unlock()
		}
		return w, err
	}
	dur := 1500 * time.Millisecond
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			type ver struct {
				lsn  pg.LSN
				data []byte
			}
			hist := map[uint32][]ver{}
			rel := pg.RelTag{Spc: 1663, DB: 1, Rel: uint32(100 + w)}
			for i := 0; time.Now().Before(stop); i++ {
				blk := uint32(i % 24)
				p := bytes.Repeat([]byte(fmt.Sprintf("w%d-%d;", w, i)), pg.BlockSize)[:pg.BlockSize]
				l, err := put(rel, blk, p)
				if err != nil {
					errs <- err
					return
				}
				if i%3 == 0 {
					commit.Set(l)
				}
				hist[blk] = append(hist[blk], ver{l, p})
				got, err := tl.GetPage(ctx, rel.Page(blk), LatestLSN, 0)
				if err != nil || !bytes.Equal(got, p) {
					errs <- fmt.Errorf("writer %d: read-your-write of blk %d: %v", w, blk, err)
					return
				}
				// An older version, if still above the GC cutoff.
				hv := hist[blk]
				if ordered && len(hv) > 2 {
					old := hv[len(hv)-2]
					if old.lsn > tl.LSNs().GCCutoff+50 {
						got, err := tl.GetPage(ctx, rel.Page(blk), old.lsn, 0)
						if err != nil && tl.LSNs().GCCutoff < old.lsn {
							errs <- fmt.Errorf("writer %d: old read: %v", w, err)
							return
						}
						if err == nil && !bytes.Equal(got, old.data) {
							errs <- fmt.Errorf("writer %d: blk %d at %s: wrong version", w, blk, old.lsn)
							return
						}
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := tl.layers.Stats()
	t.Logf("layers: %d images, deltas by level %v; cutoff %s; remote %s", st.Images, st.ByLevel, tl.LSNs().GCCutoff, tl.LSNs().RemoteConsistent)
}
