// Package pgstream is the pg-stream replication plugin: stock Postgres
// streams WAL with physical replication to a quorum of strata safekeepers
// (core/safekeeper, run by `strata safekeeper`), and this package is the
// replication.Source its consumers use: it streams committed WAL from any
// safekeeper of the quorum, fails over to the next one on errors, and sends
// the consumer's progress back.
//
// Unlike other plugins it wraps a strata runtime service (the safekeeper's
// gRPC client in core/safekeeper/server); the safekeepers themselves are the
// plugin's server side.
package pgstream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
)

// Config configures the plugin (YAML: replication: {type: pg-stream,
// pg_stream: {safekeepers: [...]}}).
type Config struct {
	// Safekeepers are the gRPC addresses of the safekeepers.
	Safekeepers []string `mapstructure:"safekeepers"`
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if len(c.Safekeepers) == 0 {
		return errors.New("pgstream: at least one safekeeper address is required")
	}
	return nil
}

// Source is the pg-stream replication.Source.
type Source struct {
	log     zerolog.Logger
	clients []*server.Client

	mu     sync.Mutex
	next   int // safekeeper to try first
	closed bool
}

var _ replication.Source = (*Source)(nil)

// New returns a source over the configured safekeepers.
func New(cfg Config, log zerolog.Logger) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Source{log: log.With().Str("replication", "pg-stream").Logger()}
	for _, a := range cfg.Safekeepers {
		c, err := server.Dial(a)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.clients = append(s.clients, c)
	}
	return s, nil
}

func convErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, walstore.ErrNotHeld):
		return fmt.Errorf("%w: %v", replication.ErrNotHeld, err)
	case errors.Is(err, walstore.ErrCorrupt):
		return fmt.Errorf("%w: %v", replication.ErrCorrupt, err)
	}
	return err
}

// order returns the clients starting with the preferred one.
func (s *Source) order() ([]*server.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, replication.ErrClosed
	}
	out := append([]*server.Client(nil), s.clients[s.next:]...)
	return append(out, s.clients[:s.next]...), nil
}

func (s *Source) skip(c *server.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.clients {
		if x == c {
			s.next = (i + 1) % len(s.clients)
		}
	}
}

// Positions implements replication.Source: the highest commit LSN any
// reachable safekeeper reports.
func (s *Source) Positions(ctx context.Context) (replication.Positions, error) {
	cs, err := s.order()
	if err != nil {
		return replication.Positions{}, err
	}
	var best replication.Positions
	var errs []error
	ok := false
	for _, c := range cs {
		st, err := c.Status(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok || st.CommitLSN > best.Commit {
			best = replication.Positions{SystemID: st.SystemID, Start: st.StartLSN, Commit: st.CommitLSN}
			ok = true
		}
	}
	if !ok {
		return best, fmt.Errorf("pgstream: no safekeeper reachable: %w", errors.Join(errs...))
	}
	return best, nil
}

// Stream implements replication.Source.
func (s *Source) Stream(ctx context.Context, consumer string, start pg.LSN) (replication.Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	st := &stream{s: s, ctx: ctx, cancel: cancel, consumer: consumer, pos: start}
	if err := st.connect(); err != nil {
		cancel()
		return nil, err
	}
	return st, nil
}

// Close implements replication.Source.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, c := range s.clients {
		c.Close()
	}
	return nil
}

type stream struct {
	s        *Source
	ctx      context.Context
	cancel   context.CancelFunc
	consumer string

	mu   sync.Mutex
	cur  *server.Consumer
	from *server.Client
	pos  pg.LSN
	last replication.Progress
}

// connect opens a stream on the safekeeper that can deliver the most: of
// those that hold the start, the one with the highest commit LSN (a stream
// ends at its safekeeper's commit LSN, and a safekeeper that missed the end
// of the WAL while Postgres stopped keeps missing it), the preferred order
// breaking ties.
func (st *stream) connect() error {
	cs, err := st.s.order()
	if err != nil {
		return err
	}
	var errs []error
	type cand struct {
		c        *server.Client
		commit   pg.LSN
		archived bool // the start is below its WAL: it reads the archive
	}
	var cands []cand
	for _, c := range cs {
		// A safekeeper that does not hold the start (it removed that WAL
		// after archiving it, or it lags) is skipped, unless it archives:
		// it then streams what it removed from the archive.
		stat, err := c.Status(st.ctx)
		if err != nil {
			errs = append(errs, err)
			st.s.skip(c)
			continue
		}
		below := st.pos < stat.StartLSN
		if below && stat.ArchivedLSN < stat.StartLSN {
			errs = append(errs, fmt.Errorf("%w: %s starts at %s", replication.ErrNotHeld, c.Addr, stat.StartLSN))
			continue
		}
		cands = append(cands, cand{c, stat.CommitLSN, below})
	}
	// The highest commit LSN first, then one that holds the start itself.
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].commit != cands[j].commit {
			return cands[i].commit > cands[j].commit
		}
		return !cands[i].archived && cands[j].archived
	})
	for _, cd := range cands {
		c := cd.c
		cons, err := c.Consume(st.ctx, st.consumer, st.pos)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st.mu.Lock()
		st.cur, st.from = cons, c
		last := st.last
		st.mu.Unlock()
		if last != (replication.Progress{}) {
			_ = cons.Feedback(server.Feedback(last))
		}
		return nil
	}
	return convErr(fmt.Errorf("pgstream: no safekeeper can stream from %s: %w", st.pos, errors.Join(errs...)))
}

// Recv implements replication.Stream; it fails over to another safekeeper
// when the current one goes away.
func (st *stream) Recv() (replication.Chunk, error) {
	for attempt := 0; ; attempt++ {
		st.mu.Lock()
		cur, from := st.cur, st.from
		st.mu.Unlock()
		if st.ctx.Err() != nil {
			return replication.Chunk{}, fmt.Errorf("%w: %w", replication.ErrClosed, st.ctx.Err())
		}
		if cur != nil {
			ch, err := cur.Recv()
			if err == nil {
				st.mu.Lock()
				st.pos = ch.Start + pg.LSN(len(ch.Data))
				st.mu.Unlock()
				return replication.Chunk{Start: ch.Start, Data: ch.Data, Commit: ch.CommitLSN}, nil
			}
			if st.ctx.Err() != nil {
				return replication.Chunk{}, fmt.Errorf("%w: %w", replication.ErrClosed, st.ctx.Err())
			}
			// Another member may hold the WAL, or an intact copy of it;
			// once each had its turn the error stands (a segment missing
			// or damaged in the archive that all of them read from).
			if (errors.Is(err, walstore.ErrNotHeld) || errors.Is(err, walstore.ErrCorrupt)) && attempt > len(st.s.clients) {
				return replication.Chunk{}, convErr(err)
			}
			st.s.log.Warn().Err(err).Str("safekeeper", from.Addr).Msg("pgstream: stream failed; failing over")
			cur.Close()
			st.s.skip(from)
		}
		if err := st.connect(); err != nil {
			if attempt > 3*len(st.s.clients) {
				return replication.Chunk{}, err
			}
			select {
			case <-st.ctx.Done():
			case <-timeAfter(attempt):
			}
		}
	}
}

// Feedback implements replication.Stream.
func (st *stream) Feedback(p replication.Progress) error {
	st.mu.Lock()
	st.last = p
	cur := st.cur
	st.mu.Unlock()
	if cur == nil {
		return nil
	}
	return cur.Feedback(server.Feedback(p))
}

// Close implements replication.Stream.
func (st *stream) Close() error {
	st.cancel()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cur != nil {
		st.cur.Close()
	}
	return nil
}
