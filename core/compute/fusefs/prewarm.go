package fusefs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// PrewarmStats is what a Prewarm did so far.
type PrewarmStats struct {
	// Total is the number of pages asked for.
	Total int
	// Loaded pages were read from the Backend into the cache tier.
	Loaded int
	// Cached pages were in the cache tier already.
	Cached int
	// Skipped pages no longer exist (their fork was dropped or truncated)
	// or were written while they were read, so the read copy may be older
	// than the one Postgres wrote: it is not cached.
	Skipped int
	// Elapsed is the time since Prewarm started.
	Elapsed time.Duration
}

// Done is the number of pages handled.
func (s PrewarmStats) Done() int { return s.Loaded + s.Cached + s.Skipped }

// Prewarm reads the pages of keys from the Backend into the cache tier with
// workers concurrent reads, while Postgres runs. progress, when not nil, is
// called about once a second and once at the end. It stops at the first
// read error other than a missing page, or when ctx is done.
//
// Postgres orders its own fills and writes of a block (one buffer, its I/O
// lock); Prewarm is outside that order. A page is therefore cached only if
// no mutation of its fork started between the moment before its read and
// the moment it is cached: the fork's generation is taken and compared
// under the fork's exclusive lock, which waits out the writes in flight
// (they hold the lock shared from before the generation moves until their
// page is in the cache).
func (f *FS) Prewarm(ctx context.Context, keys []pg.PageKey, workers int, progress func(PrewarmStats)) (PrewarmStats, error) {
	t0 := time.Now()
	if f.cache == nil {
		return PrewarmStats{Total: len(keys)}, errors.New("fusefs: prewarm without a cache tier")
	}
	workers = max(1, workers)
	var loaded, cached, skipped atomic.Int64
	stats := func() PrewarmStats {
		return PrewarmStats{Total: len(keys), Loaded: int(loaded.Load()), Cached: int(cached.Load()),
			Skipped: int(skipped.Load()), Elapsed: time.Since(t0)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan pg.PageKey)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			page := make([]byte, pg.BlockSize)
			for key := range next {
				res, err := f.prewarmPage(ctx, key, page)
				if err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				switch res {
				case prewarmLoaded:
					loaded.Add(1)
				case prewarmCached:
					cached.Add(1)
				default:
					skipped.Add(1)
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
feed:
	for _, k := range keys {
		for {
			select {
			case next <- k:
				continue feed
			case <-tick.C:
				if progress != nil {
					progress(stats())
				}
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(next)
	wg.Wait()
	s := stats()
	if progress != nil {
		progress(s)
	}
	if firstErr != nil {
		return s, firstErr
	}
	return s, context.Cause(ctx)
}

type prewarmResult int

const (
	prewarmLoaded prewarmResult = iota
	prewarmCached
	prewarmSkipped
)

func (f *FS) prewarmPage(ctx context.Context, key pg.PageKey, page []byte) (prewarmResult, error) {
	f.relMu.Lock()
	st := f.rels[key.Tag()]
	f.relMu.Unlock()
	if st == nil {
		return prewarmSkipped, nil
	}
	st.mu.Lock()
	ok := st.exists && key.Block < st.nblocks
	gen := st.gen.Load()
	st.mu.Unlock()
	if !ok {
		return prewarmSkipped, nil
	}
	if f.cache.Get(key, page) {
		return prewarmCached, nil
	}
	if err := f.be.ReadPage(ctx, key, f.lw.Get(key), page); err != nil {
		if errors.Is(err, ErrNotFound) {
			return prewarmSkipped, nil
		}
		return 0, fmt.Errorf("fusefs: prewarm read of %s: %w", key, err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.exists || key.Block >= st.nblocks || st.gen.Load() != gen {
		return prewarmSkipped, nil
	}
	f.cache.Put(key, page)
	return prewarmLoaded, nil
}
