package sklink

import (
	"context"
	"errors"
	"slices"
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
	stalls stallCheck // across the streams of runIngest
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
		if l.bound(id) {
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
		if l.bound(tl.ID()) && tl.PendingCount() > 0 {
			l.Commit.Kick()
		}
	}
	return d
}

// bound reports whether the group's commit LSN gates timeline id.
func (l *Link) bound(id pg.TimelineID) bool {
	return id == l.cfg.Timeline || slices.Contains(l.cfg.Gated, id)
}

// Run polls the safekeepers, releases gated versions as the commit LSN
// rises and, with Ingest, follows the WAL, until ctx ends. The timeline
// need not exist yet: Run uses it once it does (ingest once it has a base,
// a last record LSN above 0, e.g. an imported initdb output).
func (l *Link) Run(ctx context.Context, ps Timelines) error {
	lookupID := func(id pg.TimelineID) *timeline.Timeline {
		tl, err := ps.Timeline(id)
		if err != nil {
			return nil
		}
		return tl
	}
	lookup := func() *timeline.Timeline { return lookupID(l.cfg.Timeline) }
	all := append([]pg.TimelineID{l.cfg.Timeline}, l.cfg.Gated...)
	l.Commit.SetHooks(Hooks{
		Advanced: func(pg.LSN) {
			for _, id := range all {
				if tl := lookupID(id); tl != nil {
					if err := tl.CommitAdvanced(); err != nil && !errors.Is(err, timeline.ErrClosed) {
						l.log.Error().Err(err).Stringer("timeline", id).Msg("releasing gated versions")
					}
				}
			}
		},
		Waiting: func() bool {
			for _, id := range all {
				if tl := lookupID(id); tl != nil && tl.PendingCount() > 0 {
					return true
				}
			}
			return false
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
			fctx, cancel := context.WithCancel(ctx)
			go l.watchIngest(fctx, cancel, tl)
			err := in.Follow(fctx, l.src, "pageserver-"+l.cfg.Timeline.String(), start, l.log)
			cancel()
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

// ingestStall is how long WAL ingest may make no progress while the
// group's commit LSN is ahead of it before its stream is opened again.
const ingestStall = 10 * time.Second

// stallSlack is how far the commit LSN may stay ahead of ingest and the
// stream still be opened again only once for that gap (one WAL page).
const stallSlack = 8192

// watchIngest cancels a WAL stream that delivers nothing while the
// group's commit LSN is ahead of the timeline's last ingested record (a
// stream that hangs; seen once after a restart of the whole cluster,
// cause not found yet; a restart that resumed inside a WAL record, fixed
// since, looked the same from here): a GetPage that waits for that WAL
// would otherwise time out. The caller opens a new stream.
func (l *Link) watchIngest(ctx context.Context, cancel context.CancelFunc, tl *timeline.Timeline) {
	t := time.NewTicker(ingestStall)
	defer t.Stop()
	last := tl.LSNs().LastRecord
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := tl.LSNs().LastRecord
		commit := l.Commit.CommitLSN()
		if l.stalls.reopen(last, cur, commit) {
			l.log.Warn().Stringer("ingested", cur).Stringer("commit", commit).Dur("stalled", ingestStall).Msg("WAL ingest makes no progress; opening the stream again")
			cancel()
			return
		}
		last = cur
	}
}

// stallCheck decides, once per ingestStall, whether a WAL stream that
// ingested nothing since the last check is opened again.
type stallCheck struct {
	mu          sync.Mutex
	smallCur    pg.LSN // the last small gap reopened for
	smallCommit pg.LSN
}

// reopen reports whether to open the stream again: ingest stayed at cur
// (last == cur) while the commit LSN is ahead of it. A gap of more than a
// WAL page always counts. A smaller gap counts once for each (cur, commit):
// it can be the end of the WAL that a stopped Postgres left (its shutdown
// checkpoint record) and a hung stream would never deliver it, but it
// could also be a gap that a new stream does not close either, and that
// one must not reopen the stream every ingestStall.
func (s *stallCheck) reopen(last, cur, commit pg.LSN) bool {
	if cur != last || commit <= cur {
		return false
	}
	if commit > cur+stallSlack {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur == s.smallCur && commit == s.smallCommit {
		return false
	}
	s.smallCur, s.smallCommit = cur, commit
	return true
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
