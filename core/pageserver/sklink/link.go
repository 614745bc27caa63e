package sklink

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/plugins/replication/pgstream"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
)

// Timelines finds a timeline by ID; *pageserver.Pageserver implements it.
type Timelines interface {
	Timeline(id pg.TimelineID) (*timeline.Timeline, error)
}

// Link binds one timeline of a pageserver to its safekeeper group: the
// commit LSN of its writeback gate and, with Ingest, WAL ingest.
//
// Use: l := New(...); deps = l.Deps(deps); ps := pageserver.New(.., deps);
// go l.Run(ctx, ps); after Run returns, l.Close().
type Link struct {
	cfg    Config
	log    zerolog.Logger
	ingest bool
	Commit *Commit
	src    replication.Source
}

// Options of New.
type Options struct {
	// Ingest follows the group's committed WAL into the timeline (image
	// policies fpi and pushdown; not writeback, whose page versions come
	// from the compute and would conflict with WAL deltas).
	Ingest bool
	// Consumer names the pageserver at the safekeepers (feedback, WAL
	// retention); default "pageserver-<timeline>".
	Consumer string
}

// New returns a link; reg may be nil.
func New(cfg Config, opts Options, log zerolog.Logger, reg prometheus.Registerer) (*Link, error) {
	c, err := NewCommit(cfg, log, reg)
	if err != nil {
		return nil, err
	}
	l := &Link{cfg: c.cfg, log: c.log, ingest: opts.Ingest, Commit: c}
	if opts.Ingest {
		src, err := pgstream.New(pgstream.Config{Safekeepers: cfg.Safekeepers}, log)
		if err != nil {
			c.Close()
			return nil, err
		}
		l.src = src
	}
	return l, nil
}

// Deps returns d with the bound timeline's commit LSN source and a write
// hook that makes the pollers fast while versions are pending; other
// timelines keep d's behaviour.
func (l *Link) Deps(d pageserver.Deps) pageserver.Deps {
	prev, prevAfter := d.Commit, d.AfterWrite
	d.Commit = func(id pg.TimelineID) timeline.CommitLSNSource {
		if id == l.cfg.Timeline {
			return l.Commit
		}
		if prev != nil {
			return prev(id)
		}
		return nil
	}
	d.AfterWrite = func(tl *timeline.Timeline) {
		if prevAfter != nil {
			prevAfter(tl)
		}
		if tl.ID() == l.cfg.Timeline && tl.PendingCount() > 0 {
			l.Commit.Kick()
		}
	}
	return d
}

// Run polls the safekeepers, releases gated versions as the commit LSN
// rises and, with Ingest, follows the WAL, until ctx ends. The timeline
// need not exist yet: Run uses it once it does (ingest once it has a base,
// a last record LSN above 0, e.g. an imported initdb output).
func (l *Link) Run(ctx context.Context, ps Timelines) error {
	lookup := func() *timeline.Timeline {
		tl, err := ps.Timeline(l.cfg.Timeline)
		if err != nil {
			return nil
		}
		return tl
	}
	l.Commit.SetHooks(Hooks{
		Advanced: func(pg.LSN) {
			if tl := lookup(); tl != nil {
				if err := tl.CommitAdvanced(); err != nil && !errors.Is(err, timeline.ErrClosed) {
					l.log.Error().Err(err).Msg("releasing gated versions")
				}
			}
		},
		Waiting: func() bool {
			tl := lookup()
			return tl != nil && tl.PendingCount() > 0
		},
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = l.Commit.Run(ctx)
	}()
	if l.ingest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.runIngest(ctx, lookup)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

func (l *Link) runIngest(ctx context.Context, lookup func() *timeline.Timeline) {
	logged := false
	for {
		tl := lookup()
		if tl != nil && tl.LSNs().LastRecord > 0 {
			start := tl.LSNs().LastRecord
			l.log.Info().Stringer("from", start).Msg("WAL ingest starts")
			in := &walingest.Ingester{TL: tl, BatchSize: 256}
			err := in.Follow(ctx, l.src, "pageserver-"+l.cfg.Timeline.String(), start, l.log)
			if ctx.Err() != nil {
				return
			}
			l.log.Error().Err(err).Msg("WAL ingest stopped")
		} else if !logged {
			l.log.Info().Msg("WAL ingest waits for the timeline and its base (last record LSN > 0)")
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// Close releases the connections. REQUIRES: Run has returned.
func (l *Link) Close() error {
	var errs []error
	if l.src != nil {
		errs = append(errs, l.src.Close())
	}
	errs = append(errs, l.Commit.Close())
	return errors.Join(errs...)
}
