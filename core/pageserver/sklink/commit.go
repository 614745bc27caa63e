// Package sklink binds a pageserver timeline to its safekeeper group. It
// provides the two things the pageserver needs from the safekeepers:
//
//   - Commit, a timeline.CommitLSNSource: the quorum commit LSN that gates
//     the compute's page writes in writeback mode (DESIGN.md invariant 2),
//     learned by polling every safekeeper's status, fast while versions
//     wait for it and slowly otherwise, and surviving safekeepers that go
//     down and come back;
//   - Ingest: the fpi and pushdown image policies' WAL follower, which
//     streams committed WAL into the timeline from its last ingested
//     record and reports its positions back to the safekeepers.
//
// It is not the safekeeper client (core/safekeeper/server) nor the WAL
// decoder (core/pageserver/walingest); it wires them to a timeline.
package sklink

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrConfig marks an invalid configuration.
var ErrConfig = errors.New("sklink: invalid config")

// Config configures the link of one timeline.
type Config struct {
	// Safekeepers are the gRPC addresses of the whole group (its size sets
	// the quorum: a majority).
	Safekeepers []string
	// Timeline is the pageserver timeline bound to the group.
	Timeline pg.TimelineID
	// Gated are further timelines whose writes the same commit LSN gates
	// (no WAL ingest): in redo mode, the compute's non-relation files
	// (storage.page_source: redo keeps them on their own timeline, next
	// to the redo timeline that WAL ingest feeds).
	Gated []pg.TimelineID
	// FastPoll is the status poll interval while versions wait for the
	// commit LSN (default 2 ms).
	FastPoll time.Duration
	// SlowPoll is the poll interval otherwise (default 100 ms).
	SlowPoll time.Duration
	// StalledPoll is the poll interval while versions wait but the commit
	// LSN has not moved for StallAfter (default 20 ms): initdb on a new
	// compute writes every page above a commit LSN that cannot move before
	// Postgres streams, and a group without a quorum cannot move it either.
	// The first advance brings FastPoll back.
	StalledPoll time.Duration
	// StallAfter is how long versions wait without the commit LSN moving
	// before the pollers slow down to StalledPoll (default 100 ms).
	StallAfter time.Duration
	// CallTimeout bounds one status call (default 1 s).
	CallTimeout time.Duration
	// MaxBackoff bounds the retry delay of an unreachable safekeeper
	// (default 5 s; the delay starts at 50 ms and doubles).
	MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.FastPoll <= 0 {
		c.FastPoll = 2 * time.Millisecond
	}
	if c.SlowPoll <= 0 {
		c.SlowPoll = 100 * time.Millisecond
	}
	if c.StalledPoll <= 0 {
		c.StalledPoll = 20 * time.Millisecond
	}
	c.StalledPoll = max(c.StalledPoll, c.FastPoll)
	if c.StallAfter <= 0 {
		c.StallAfter = 100 * time.Millisecond
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if len(c.Safekeepers) == 0 {
		return fmt.Errorf("%w: no safekeepers", ErrConfig)
	}
	if c.Timeline.IsZero() {
		return fmt.Errorf("%w: no timeline", ErrConfig)
	}
	for _, g := range c.Gated {
		if g.IsZero() || g == c.Timeline {
			return fmt.Errorf("%w: gated timeline %s is empty or the bound timeline", ErrConfig, g)
		}
	}
	seen := map[string]bool{}
	for _, a := range c.Safekeepers {
		if a == "" || seen[a] {
			return fmt.Errorf("%w: safekeeper address %q empty or repeated", ErrConfig, a)
		}
		seen[a] = true
	}
	return nil
}

// Peer is what the link last learned from one safekeeper.
type Peer struct {
	Addr     string
	Up       bool // the last status call succeeded
	Term     uint64
	Accepted bool
	Flush    pg.LSN
	Commit   pg.LSN
	At       time.Time // of the last successful call
	Err      error     // of the last failed call
}

// Quorum computes the commit LSN that the peers' last statuses prove:
//
//   - the highest commit LSN any safekeeper reports (each computes it
//     from its peers' flush LSNs in its term);
//   - the flush LSN that a majority of the group holds in the highest term
//     seen, counting only safekeepers that applied that term's Accept (or
//     term 0, when no election ever ran): WAL that a majority flushed in
//     one term is committed, and every later election's durable end is at
//     or above it. This one is ahead of the safekeepers' own commit LSN by
//     their peer poll interval, which is what the compute's fsync waits.
//
// n is the size of the group.
func Quorum(peers []Peer, n int) pg.LSN {
	var best pg.LSN
	var maxTerm uint64
	for _, p := range peers {
		if !p.Up {
			continue
		}
		best = max(best, p.Commit)
		maxTerm = max(maxTerm, p.Term)
	}
	var flushes []pg.LSN
	for _, p := range peers {
		if p.Up && p.Term == maxTerm && (p.Accepted || p.Term == 0) {
			flushes = append(flushes, p.Flush)
		}
	}
	q := n/2 + 1
	if len(flushes) >= q {
		sort.Slice(flushes, func(i, j int) bool { return flushes[i] > flushes[j] })
		best = max(best, flushes[q-1])
	}
	return best
}

// Hooks connect a Commit to its timeline; both may be nil.
type Hooks struct {
	// Advanced is called (from a poller goroutine, never concurrently with
	// itself) after the commit LSN rose; the pageserver releases gated
	// versions there (Timeline.CommitAdvanced).
	Advanced func(pg.LSN)
	// Waiting reports whether versions wait for the commit LSN; while it
	// does, the pollers use FastPoll.
	Waiting func() bool
}

// Commit is the commit LSN of a safekeeper group, a
// timeline.CommitLSNSource. Create it with NewCommit, start Run, read
// CommitLSN from any goroutine.
type Commit struct {
	cfg     Config
	log     zerolog.Logger
	clients []*server.Client
	m       *metrics

	commit   atomic.Uint64
	advanced atomic.Int64 // when the commit LSN last rose (UnixNano)
	hooks    atomic.Pointer[Hooks]
	advMu    sync.Mutex // serializes Hooks.Advanced

	sleepers atomic.Int32 // pollers in a SlowPoll sleep

	mu    sync.Mutex
	peers []Peer
	wake  chan struct{} // closed on Kick
	subs  []chan struct{}
}

var _ timeline.CommitLSNSource = (*Commit)(nil)

// NewCommit returns the commit LSN source of cfg's group; reg may be nil.
func NewCommit(cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Commit, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Commit{cfg: cfg, log: log.With().Str("component", "sklink").Stringer("timeline", cfg.Timeline).Logger(),
		wake: make(chan struct{})}
	for _, a := range cfg.Safekeepers {
		cl, err := server.Dial(a)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.clients = append(c.clients, cl)
		c.peers = append(c.peers, Peer{Addr: a})
	}
	c.hooks.Store(&Hooks{})
	c.m = newMetrics(reg, cfg)
	return c, nil
}

// SetHooks installs hooks (they may be set after Run started).
func (c *Commit) SetHooks(h Hooks) { c.hooks.Store(&h) }

// CommitLSN implements timeline.CommitLSNSource. It never decreases.
func (c *Commit) CommitLSN() pg.LSN { return pg.LSN(c.commit.Load()) }

// Kick makes pollers in a slow sleep look again at once (Hooks.Waiting
// may have become true); a no-op while they poll fast. Safe from any
// goroutine.
func (c *Commit) Kick() {
	if c.sleepers.Load() == 0 {
		return
	}
	c.mu.Lock()
	close(c.wake)
	c.wake = make(chan struct{})
	c.mu.Unlock()
}

// Peers returns the last view of every safekeeper.
func (c *Commit) Peers() []Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Peer(nil), c.peers...)
}

// Wait blocks until the commit LSN reaches lsn or ctx ends.
func (c *Commit) Wait(ctx context.Context, lsn pg.LSN) error {
	for {
		c.mu.Lock()
		if c.CommitLSN() >= lsn {
			c.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		c.subs = append(c.subs, ch)
		c.mu.Unlock()
		c.Kick()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Close releases the connections. REQUIRES: Run has returned.
func (c *Commit) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cl := range c.clients {
		errs = append(errs, cl.Close())
	}
	return errors.Join(errs...)
}

// Run polls every safekeeper until ctx ends; it returns ctx's error.
func (c *Commit) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.poll(ctx, i)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// waiting reports whether versions wait for the commit LSN (Hooks.Waiting)
// and whether a Wait call does.
func (c *Commit) waiting() (versions, callers bool) {
	if h := c.hooks.Load(); h.Waiting != nil {
		versions = h.Waiting()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return versions, len(c.subs) > 0
}

// fastSleep is the poll interval while something waits for the commit
// LSN: FastPoll, or StalledPoll once versions (and no Wait call) have
// waited StallAfter since the later of waitStart and the last advance.
func (c *Commit) fastSleep(waitStart time.Time, callers bool) time.Duration {
	if callers {
		return c.cfg.FastPoll
	}
	since := waitStart
	if a := time.Unix(0, c.advanced.Load()); a.After(since) {
		since = a
	}
	if time.Since(since) >= c.cfg.StallAfter {
		return c.cfg.StalledPoll
	}
	return c.cfg.FastPoll
}

func (c *Commit) poll(ctx context.Context, i int) {
	cl := c.clients[i]
	backoff := 50 * time.Millisecond
	wasUp := true
	fails := 0
	var waitStart time.Time // when versions began to wait, zero while none do
	for {
		if fails >= 3 {
			// A fresh connection: gRPC's own reconnect backoff grows to
			// minutes, ours stays within MaxBackoff.
			if ncl, err := server.Dial(cl.Addr); err == nil {
				cl.Close()
				cl = ncl
				c.mu.Lock()
				c.clients[i] = ncl
				c.mu.Unlock()
			}
			fails = 0
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		start := time.Now()
		st, err := cl.Status(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		var sleep time.Duration
		if err != nil {
			c.m.errors.WithLabelValues(cl.Addr).Inc()
			c.m.up.WithLabelValues(cl.Addr).Set(0)
			if wasUp {
				c.log.Warn().Err(err).Str("safekeeper", cl.Addr).Dur("retry_in", backoff).Msg("safekeeper unreachable")
			}
			wasUp = false
			fails++
			c.update(i, func(p *Peer) { p.Up, p.Err = false, err })
			sleep = backoff
			backoff = min(2*backoff, c.cfg.MaxBackoff)
		} else {
			c.m.rtt.Observe(time.Since(start).Seconds())
			c.m.up.WithLabelValues(cl.Addr).Set(1)
			c.m.flush.WithLabelValues(cl.Addr).Set(float64(st.FlushLSN))
			if !wasUp {
				c.log.Info().Str("safekeeper", cl.Addr).Stringer("flush", st.FlushLSN).Msg("safekeeper reachable")
			}
			wasUp = true
			fails = 0
			backoff = 50 * time.Millisecond
			c.update(i, func(p *Peer) {
				*p = Peer{Addr: cl.Addr, Up: true, Term: st.Term, Accepted: st.Accepted, Flush: st.FlushLSN, Commit: st.CommitLSN, At: time.Now()}
			})
		}
		// A reachable safekeeper sleeps SlowPoll unless versions wait,
		// and wakes on Kick; an unreachable one keeps its backoff. The
		// order (wake channel, sleepers, then Waiting) makes sure that a
		// Kick after the check wakes us and one before it is seen by it.
		var wake chan struct{}
		slow := false
		if err == nil {
			c.mu.Lock()
			wake = c.wake
			c.mu.Unlock()
			c.sleepers.Add(1)
			sleep, slow = c.cfg.SlowPoll, true
			versions, callers := c.waiting()
			if !versions {
				waitStart = time.Time{}
			} else if waitStart.IsZero() {
				waitStart = time.Now()
			}
			if versions || callers {
				c.sleepers.Add(-1)
				sleep, slow, wake = c.fastSleep(waitStart, callers), false, nil
			}
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-wake:
		}
		t.Stop()
		if slow {
			c.sleepers.Add(-1)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// update changes peer i and recomputes the commit LSN.
func (c *Commit) update(i int, fn func(p *Peer)) {
	c.mu.Lock()
	fn(&c.peers[i])
	q := Quorum(c.peers, len(c.peers))
	var maxFlush pg.LSN
	for _, p := range c.peers {
		if p.Up {
			maxFlush = max(maxFlush, p.Flush)
		}
	}
	old := pg.LSN(c.commit.Load())
	advanced := q > old
	var subs []chan struct{}
	if advanced {
		c.commit.Store(uint64(q))
		c.advanced.Store(time.Now().UnixNano())
		subs, c.subs = c.subs, nil
	}
	c.mu.Unlock()
	cur := c.CommitLSN()
	c.m.commit.Set(float64(cur))
	if maxFlush > cur {
		c.m.lag.Set(float64(maxFlush - cur))
	} else {
		c.m.lag.Set(0)
	}
	if !advanced {
		return
	}
	for _, ch := range subs {
		close(ch)
	}
	if h := c.hooks.Load(); h.Advanced != nil {
		c.advMu.Lock()
		h.Advanced(cur)
		c.advMu.Unlock()
	}
}

type metrics struct {
	commit prometheus.Gauge
	lag    prometheus.Gauge
	flush  *prometheus.GaugeVec
	up     *prometheus.GaugeVec
	errors *prometheus.CounterVec
	rtt    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, cfg Config) *metrics {
	l := prometheus.Labels{"timeline": cfg.Timeline.String()}
	m := &metrics{
		commit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_pageserver_sk_commit_lsn", Help: "Commit LSN of the timeline's safekeeper group, as the pageserver knows it.", ConstLabels: l}),
		lag:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_pageserver_sk_commit_lag_bytes", Help: "Highest flush LSN of a reachable safekeeper minus the commit LSN.", ConstLabels: l}),
		flush:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_sk_flush_lsn", Help: "Flush LSN each safekeeper last reported.", ConstLabels: l}, []string{"safekeeper"}),
		up:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_sk_up", Help: "1 when the last status call to the safekeeper succeeded.", ConstLabels: l}, []string{"safekeeper"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_pageserver_sk_link_errors_total", Help: "Failed status calls per safekeeper.", ConstLabels: l}, []string{"safekeeper"}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "strata_pageserver_sk_status_seconds", Help: "Safekeeper status call latency.",
			ConstLabels: l, Buckets: prometheus.ExponentialBuckets(20e-6, 2, 16)}),
	}
	if reg != nil {
		reg.MustRegister(m.commit, m.lag, m.flush, m.up, m.errors, m.rtt)
	}
	return m
}
