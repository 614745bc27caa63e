// Package safekeeper is strata's WAL safekeeper: a durable receiver of a
// stock Postgres 15's WAL. Three of them, with synchronous_standby_names =
// 'ANY 2 (sk1, sk2, sk3)', make every acknowledged commit durable on two
// disks (DESIGN.md invariant 1).
//
// A Node ties the parts together: walstore (segments, checksums, control
// file), stream (the Postgres replication client), election (the pure term
// logic), server (the gRPC API) and archive (uploads to the object store).
// It is not the compute agent: the agent is the election's proposer and uses
// server.Client. See docs/design/safekeeper.md.
package safekeeper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coremetrics "github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/core/safekeeper/election"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/stream"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Deps are a Node's collaborators.
type Deps struct {
	Logger zerolog.Logger
	// Registry receives the metrics (nil: a private registry).
	Registry *prometheus.Registry
	// Archive is the object store for WAL archiving (nil: no archiving).
	Archive objectstore.Store
}

// Node is one running safekeeper.
type Node struct {
	cfg     Config
	log     zerolog.Logger
	reg     *prometheus.Registry
	m       *metrics
	st      *walstore.Store
	arch    *archive.Archiver
	peers   []*server.Client
	grpcSrv *grpc.Server
	lis     net.Listener

	mu        sync.Mutex
	acc       *election.Acceptor
	follow    string             // connection string of the followed Postgres ("" = nobody)
	cancelStr context.CancelFunc // cancels the current stream session
	sessDone  chan struct{}      // closed when the current session has returned
	wake      chan struct{}
	commit    pg.LSN
	commitCh  chan struct{}
	peerFlush map[string]peerInfo
	consumers *consumerSet
	// archTrouble: the current run of failed archive steps (Status).
	archTrouble trouble.Run
	serverEnd   pg.LSN
	fullAt      pg.LSN     // the flush LSN a full disk stopped at, plus one (0: not full)
	election    sync.Mutex // serializes Vote and Accept

	// wantedAt is when a reader last waited for the commit LSN
	// (CommitNotify; unix nanoseconds); wanted wakes the peer poller when
	// such a wait starts after none for peerWantHold.
	wantedAt atomic.Int64
	wanted   chan struct{}
}

type peerInfo struct {
	term  uint64
	flush pg.LSN
	at    time.Time
}

// New opens the safekeeper's store (verifying it) and prepares the node;
// Run starts it.
func New(cfg Config, deps Deps) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	log := deps.Logger.With().Str("safekeeper", cfg.ID).Logger()
	n := &Node{cfg: cfg, log: log, reg: reg, m: newMetrics(reg, cfg.ID, cfg.DataDir), wake: make(chan struct{}, 1),
		commitCh: make(chan struct{}), wanted: make(chan struct{}, 1), peerFlush: map[string]peerInfo{}, consumers: newConsumerSet()}
	var guard *rawio.Guard
	if cfg.RawSyscalls {
		guard = &rawio.Guard{OnSlow: func(op string, took time.Duration) {
			n.m.slowRaw.Inc()
			log.Warn().Str("call", op).Dur("took", took).Dur("usual_calls_for", rawio.DefaultCooldown).
				Msg("safekeeper: a raw system call was slow (a busy or stalled disk?); the WAL path makes the usual calls for a while")
		}}
	}
	st, err := walstore.Open(walstore.Options{Dir: cfg.DataDir, VerifyOnOpen: cfg.VerifyOnStart,
		ObserveFsync: n.m.observeFsync, Guard: guard, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("safekeeper %s: %w", cfg.ID, err)
	}
	n.st = st
	ctl := st.Control()
	n.acc = election.NewAcceptor(acceptorState(ctl))
	n.commit = ctl.CommitLSN
	n.follow = n.followTarget(ctl)
	dial := server.Dial
	if cfg.RawSyscalls {
		dial = server.DialRaw
	}
	for _, p := range cfg.Peers {
		c, err := dial(p)
		if err != nil {
			st.Close()
			return nil, err
		}
		n.peers = append(n.peers, c)
	}
	if deps.Archive != nil && cfg.Archive.Enabled {
		rank, size := groupRank(cfg.ListenAddr, cfg.Peers)
		n.arch = archive.New(archive.Options{Store: deps.Archive, Prefix: cfg.Archive.Prefix,
			PartialAfter: cfg.Archive.PartialAfter, PartialEvery: cfg.Archive.PartialEvery,
			Rank: rank, GroupSize: size, Takeover: cfg.Archive.Takeover, Logger: log}, st)
	}
	n.m.flushLSN.Set(lsnFloat(st.FlushLSN()))
	n.m.term.Set(float64(ctl.Term))
	return n, nil
}

// groupRank places self among the group's addresses (sorted, so every
// member agrees) for the archive's segment owners.
func groupRank(self string, peers []string) (rank, size int) {
	all := append([]string{self}, peers...)
	sort.Strings(all)
	return slices.Index(all, self), len(all)
}

func acceptorState(c walstore.Control) election.AcceptorState {
	h := make(election.History, len(c.TermHistory))
	for i, e := range c.TermHistory {
		h[i] = election.TermStart{Term: e.Term, Start: e.Start}
	}
	return election.AcceptorState{Term: c.Term, ComputeID: c.ComputeID, Accepted: c.Accepted || c.Term == 0,
		History: h, Start: c.StartLSN, Flush: c.FlushLSN}
}

// followTarget says which Postgres to stream from: the configured one until
// the first election, then the current term's compute once accepted.
func (n *Node) followTarget(c walstore.Control) string {
	if c.Term == 0 {
		return n.cfg.Postgres
	}
	if !c.Accepted {
		return ""
	}
	return withHostPort(n.cfg.Postgres, c.ComputePostgres)
}

// withHostPort replaces the host and port of a connection string.
func withHostPort(conn, hostport string) string {
	if hostport == "" || conn == "" {
		return conn
	}
	if u, err := url.Parse(conn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = hostport
		return u.String()
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return conn
	}
	return conn + " host=" + host + " port=" + port
}

// Store returns the node's WAL store.
func (n *Node) Store() *walstore.Store { return n.st }

// Registry returns the metrics registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Addr returns the gRPC listen address once Run has started listening.
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis == nil {
		return ""
	}
	return n.lis.Addr().String()
}

// Listen opens the gRPC listener (Run calls it when the caller did not).
func (n *Node) Listen() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis != nil || n.cfg.ListenAddr == "" {
		return nil
	}
	l, err := net.Listen("tcp", n.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("safekeeper %s: listen: %w", n.cfg.ID, err)
	}
	if n.cfg.RawSyscalls {
		l = rawio.WrapListener(l)
	}
	n.lis = l
	return nil
}

// Run serves until ctx ends, then closes the store.
func (n *Node) Run(ctx context.Context) error {
	defer n.st.Close()
	defer func() {
		for _, p := range n.peers {
			p.Close()
		}
	}()
	if err := n.Listen(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	goFn := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	if n.lis != nil {
		n.grpcSrv = grpc.NewServer(server.ServerOptions()...)
		server.Register(n.grpcSrv, n)
		goFn(func(context.Context) { _ = n.grpcSrv.Serve(n.lis) })
		n.log.Info().Str("addr", n.lis.Addr().String()).Msg("safekeeper: gRPC listening")
	}
	if n.cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{})) // /metrics, and any other path as before
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		coremetrics.HandleProfiler(mux)
		hs := &http.Server{Addr: n.cfg.MetricsAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		goFn(func(ctx context.Context) {
			go func() { <-ctx.Done(); hs.Close() }()
			_ = hs.ListenAndServe()
		})
	}
	goFn(n.streamLoop)
	goFn(n.controlLoop)
	goFn(n.peerLoop)
	goFn(n.repairLoop)
	archived := make(chan struct{})
	if n.arch != nil {
		goFn(func(ctx context.Context) { defer close(archived); n.archiveLoop(ctx) })
	} else {
		close(archived)
	}
	<-ctx.Done()
	// The peers, stopping too, ask this node for its flush LSN before
	// their last archive step; it answers until its own is done.
	<-archived
	if n.grpcSrv != nil {
		n.grpcSrv.Stop()
	}
	wg.Wait()
	_ = n.st.UpdateControl(nil)
	return nil
}

// streamLoop keeps a replication session with the followed Postgres,
// reconnecting after failures and switching on term changes.
func (n *Node) streamLoop(ctx context.Context) {
	var refused connectFailures
	for ctx.Err() == nil {
		n.mu.Lock()
		target := n.follow
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		n.cancelStr, n.sessDone = cancel, done
		n.mu.Unlock()
		if target == "" {
			close(done)
			select {
			case <-ctx.Done():
			case <-n.wake:
			case <-sctx.Done():
			}
			cancel()
			continue
		}
		err := stream.Run(sctx, stream.Config{ConnString: target, AppName: n.cfg.ID, Slot: n.cfg.SlotName(),
			StatusInterval: n.cfg.StatusInterval, RawSocket: n.cfg.RawSyscalls, Logger: n.log}, n.st, (*observer)(n))
		cancel()
		close(done)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, context.Canceled) {
			refused = connectFailures{}
			continue // term change
		}
		if walRemoved(err) {
			// Postgres no longer holds the WAL this node needs next (it
			// joined the term late, or came back after a long time):
			// the peers of the term do.
			if cerr := n.catchUpFromPeers(ctx); cerr == nil {
				continue
			} else {
				err = errors.Join(err, cerr)
			}
		}
		delay := n.cfg.ReconnectDelay
		if errors.Is(err, syscall.ENOSPC) {
			// Every retry re-receives up to a segment from Postgres, so
			// retry slowly, and say it once.
			delay = max(delay, diskFullRetry)
			if n.noteDiskFull() {
				n.log.Error().Err(err).Str("data_dir", n.cfg.DataDir).Dur("retry", delay).
					Msg("safekeeper: disk full, WAL cannot be stored; commits go on with the other safekeepers of the quorum; free space in the data folder and this safekeeper catches up")
			}
		} else if errors.Is(err, stream.ErrConnect) {
			refused.note(n.log, time.Now(), err)
		} else {
			refused = connectFailures{}
			n.log.Warn().Err(err).Msg("safekeeper: replication session ended; reconnecting")
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		case <-n.wake:
		}
	}
}

// connectWarnAfter is how long Postgres may refuse replication connections
// before a safekeeper warns, and then how often it says so again.
const connectWarnAfter = 30 * time.Second

// connectFailures keeps a Postgres that does not accept replication
// connections from filling the log with a line every ReconnectDelay. While
// the compute starts Postgres (initdb, crash recovery, a restart after a
// crash) that is expected: the first failure of a run is said at info; a
// run that lasts connectWarnAfter is said at warn, and then once per
// connectWarnAfter, with the number of attempts.
type connectFailures struct {
	since, said time.Time
	attempts    int
}

func (c *connectFailures) note(log zerolog.Logger, now time.Time, err error) {
	c.attempts++
	switch {
	case c.attempts == 1:
		c.since, c.said = now, now
		log.Info().Err(err).Msg("safekeeper: Postgres does not accept the replication connection yet; retrying")
	case now.Sub(c.said) >= connectWarnAfter:
		c.said = now
		log.Warn().Err(err).Int("attempts", c.attempts).Str("for", now.Sub(c.since).Round(time.Second).String()).
			Msg("safekeeper: still no replication connection to Postgres; retrying")
	}
}

// walRemoved reports whether err is Postgres' "requested WAL segment ...
// has already been removed".
func walRemoved(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "58P01" // undefined_file
}

// catchUpFromPeers fetches the WAL from this node's end up to the flush LSN
// of a peer that follows the same compute in the same accepted term (or,
// before any election, the same configured Postgres in term 0): within a
// term every member's WAL is a prefix of that compute's, so the peer's
// bytes are the ones Postgres would have sent.
func (n *Node) catchUpFromPeers(ctx context.Context) error {
	// No election may change the term or write the store meanwhile.
	n.election.Lock()
	defer n.election.Unlock()
	n.mu.Lock()
	a := n.acc.State()
	peers := slices.Clone(n.peers)
	n.mu.Unlock()
	if !a.Accepted {
		return errors.New("safekeeper: catch up from peers: not a member of an accepted term")
	}
	var errs []error
	for _, p := range peers {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := p.Status(cctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Addr, err))
			continue
		}
		from := n.st.WriteLSN()
		if st.Term != a.Term || !st.Accepted || st.ComputeID != a.ComputeID || st.FlushLSN <= from {
			continue
		}
		if err := n.fetchFrom(ctx, p.Addr, from, st.FlushLSN); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Addr, err))
			continue
		}
		flush := n.st.FlushLSN()
		n.mu.Lock()
		n.acc.Appended(flush)
		n.mu.Unlock()
		n.m.flushLSN.Set(lsnFloat(flush))
		n.updateCommit()
		n.log.Info().Str("peer", p.Addr).Str("from", from.String()).Str("to", flush.String()).Uint64("term", a.Term).
			Msg("safekeeper: Postgres no longer holds the WAL needed; caught up from a peer")
		return nil
	}
	if len(errs) == 0 {
		return fmt.Errorf("safekeeper: catch up from peers: no peer of term %d is ahead of %s", a.Term, n.st.WriteLSN())
	}
	return fmt.Errorf("safekeeper: catch up from peers: %w", errors.Join(errs...))
}

// diskFullRetry is the pause before reconnecting to Postgres after the
// disk filled up.
const diskFullRetry = 5 * time.Second

// noteDiskFull records that a session failed on a full disk; it reports
// whether that is news (the last one did not).
func (n *Node) noteDiskFull() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.m.diskFull.Set(1)
	if n.fullAt != 0 {
		return false
	}
	n.fullAt = n.st.FlushLSN() + 1 // +1: a flush that adds a byte clears it
	return true
}

// repeatedErr tells an error worth logging from a repeat of the last one
// (a full disk fails every round of a loop the same way).
type repeatedErr struct {
	last string
	at   time.Time
}

// fresh reports whether err differs from the last error or the last was
// logged a minute ago or more.
func (r *repeatedErr) fresh(err error) bool {
	msg := err.Error()
	if msg == r.last && time.Since(r.at) < time.Minute {
		return false
	}
	r.last, r.at = msg, time.Now()
	return true
}

type observer Node

func (o *observer) Flushed(flush, serverEnd pg.LSN) {
	n := (*Node)(o)
	n.mu.Lock()
	prev := n.acc.State().Flush
	n.acc.Appended(flush)
	if flush < prev {
		n.acc.Truncated(flush)
	}
	n.serverEnd = max(n.serverEnd, serverEnd)
	end := n.serverEnd
	cleared := n.fullAt != 0 && flush >= n.fullAt
	if cleared {
		n.fullAt = 0
	}
	n.mu.Unlock()
	if cleared {
		n.m.diskFull.Set(0)
		n.log.Info().Str("flush_lsn", flush.String()).Msg("safekeeper: WAL is stored again after a full disk")
	}
	if flush > prev {
		n.m.bytesIn.Add(float64(flush - prev))
	}
	n.m.flushLSN.Set(lsnFloat(flush))
	if end > flush {
		n.m.lagBytes.Set(float64(end - flush))
	} else {
		n.m.lagBytes.Set(0)
	}
	n.updateCommit()
}

// updateCommit recomputes the commit LSN: the highest LSN that a majority of
// {this node, peers in the same term} has flushed.
func (n *Node) updateCommit() {
	flush := n.st.FlushLSN()
	n.mu.Lock()
	term := n.acc.State().Term
	flushes := []pg.LSN{flush}
	for _, p := range n.peerFlush {
		if p.term == term && time.Since(p.at) < 10*time.Second {
			flushes = append(flushes, p.flush)
		}
	}
	quorum := (len(n.cfg.Peers)+1)/2 + 1
	if len(n.cfg.Peers) == 0 {
		quorum = 1
	}
	var c pg.LSN
	if len(flushes) >= quorum {
		sort.Slice(flushes, func(i, j int) bool { return flushes[i] > flushes[j] })
		c = min(flushes[quorum-1], flush)
	}
	changed := c > n.commit
	if changed {
		n.commit = c
		close(n.commitCh)
		n.commitCh = make(chan struct{})
	}
	n.mu.Unlock()
	if changed {
		n.m.commitLSN.Set(lsnFloat(c))
	}
}

// peerLoop polls the peers' flush LSNs to compute the commit LSN.
//
// How fast depends on who waits for it. A reader of committed WAL (the
// pageserver's WAL ingest in redo mode, a compute fetching its WAL tail)
// waits through CommitNotify; while one did in the last peerWantHold, the
// peers are polled every peerBusyPoll while this node holds flushed WAL not
// known committed, and at once after it flushes more. With no such reader
// (writeback mode: the pageserver learns the commit LSN from every
// safekeeper's flush LSN itself) the commit LSN only feeds the control
// file and the archiver, and a poll every peerIdlePoll serves them; the
// busy rate cost each safekeeper about a quarter of its CPU under load.
func (n *Node) peerLoop(ctx context.Context) {
	if len(n.cfg.Peers) == 0 {
		// A lone safekeeper is its own quorum: commit follows flush.
		for {
			ch := n.st.FlushNotify()
			n.updateCommit()
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
		}
	}
	for {
		// Taken before the poll, so that a flush during it wakes the wait.
		flushed := n.st.FlushNotify()
		n.pollPeers(ctx)
		wait, wake := n.nextPoll(flushed)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-wake:
			t.Stop()
		case <-n.wanted:
			t.Stop()
		}
	}
}

// pollPeers asks every peer for its flush LSN (and its consumers'
// progress), each within a second, and recomputes the commit LSN.
func (n *Node) pollPeers(ctx context.Context) {
	n.m.peerPolls.Inc()
	var wg sync.WaitGroup
	for _, p := range n.peers {
		wg.Add(1)
		go func(p *server.Client) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := p.Status(cctx)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.peerFlush[p.Addr] = peerInfo{term: st.Term, flush: st.FlushLSN, at: time.Now()}
			// A consumer streams from one member; the others learn
			// its progress here (for removalBound).
			for id, fb := range st.Consumers {
				n.noteConsumerLocked(id, fb)
			}
			n.mu.Unlock()
		}(p)
	}
	wg.Wait()
	n.updateCommit()
}

// nextPoll returns how long the peer poller waits before its next round
// and what else ends the wait (nil: nothing); flushed is the FlushNotify
// channel taken before the round.
func (n *Node) nextPoll(flushed <-chan struct{}) (time.Duration, <-chan struct{}) {
	if time.Now().UnixNano()-n.wantedAt.Load() > int64(peerWantHold) {
		return peerIdlePoll, nil
	}
	// The commit LSN never passes this node's own flush LSN. Once it is
	// there, the peers can tell nothing new until this node flushes more:
	// poll at peerIdlePoll then, and at once when it flushes.
	flush := n.st.FlushLSN()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.commit >= flush {
		return peerIdlePoll, flushed
	}
	return peerBusyPoll, nil
}

// The peers' flush LSNs are polled every peerBusyPoll while a reader waits
// for the commit LSN (one did in the last peerWantHold) and this node has
// flushed WAL that is not known committed, else every peerIdlePoll: a
// peer's status is fresh for 10 s in updateCommit.
const (
	peerBusyPoll = 50 * time.Millisecond
	peerIdlePoll = time.Second
	peerWantHold = 2 * time.Second
)

// controlLoop records flush and commit LSNs in the control file regularly.
func (n *Node) controlLoop(ctx context.Context) {
	var ctlErrs repeatedErr
	t := time.NewTicker(n.cfg.ControlSyncInterval)
	defer t.Stop()
	var last walstore.Control
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		commit := n.CommitLSN()
		cur := n.st.Control()
		if cur.FlushLSN == last.FlushLSN && cur.CommitLSN >= commit {
			continue
		}
		commit = min(commit, n.st.FlushLSN())
		if err := n.st.UpdateControl(func(c *walstore.Control) { c.CommitLSN = max(c.CommitLSN, commit) }); err != nil {
			if ctlErrs.fresh(err) {
				n.log.Error().Err(err).Msg("safekeeper: write control file (the same error is logged once a minute)")
			}
			continue
		}
		last = n.st.Control()
	}
}

// CommitLSN implements server.Backend.
func (n *Node) CommitLSN() pg.LSN {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.commit
}

// CommitNotify implements server.Backend. A caller waits for the commit
// LSN: the peers are polled at the busy rate for peerWantHold (peerLoop).
func (n *Node) CommitNotify() <-chan struct{} {
	now := time.Now().UnixNano()
	if now-n.wantedAt.Swap(now) > int64(peerWantHold) {
		select {
		case n.wanted <- struct{}{}:
		default:
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.commitCh
}

// Sent implements server.Backend.
func (n *Node) Sent(b int) { n.m.bytesOut.Add(float64(b)) }

// Feedback implements server.Backend.
func (n *Node) Feedback(consumer string, fb server.Feedback) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noteConsumerLocked(consumer, fb)
}

// noteConsumerLocked merges a consumer's progress, reported by the
// consumer or by a peer, into what this node knows. REQUIRES: n.mu held.
func (n *Node) noteConsumerLocked(consumer string, fb server.Feedback) {
	n.consumers.note(consumer, fb, time.Now())
}

// expireConsumers forgets the consumers that stayed behind the commit LSN
// without progress for Archive.ConsumerExpiry.
func (n *Node) expireConsumers() {
	commit := n.CommitLSN()
	n.mu.Lock()
	gone := n.consumers.expire(time.Now(), commit, n.cfg.Archive.ConsumerExpiry)
	n.mu.Unlock()
	for id, fb := range gone {
		n.m.consumersExpired.Inc()
		n.log.Warn().Str("consumer", id).Stringer("durable", fb.Durable).Stringer("commit", commit).
			Dur("expiry", n.cfg.Archive.ConsumerExpiry).
			Msg("safekeeper: forgot a WAL consumer that made no progress for the expiry time; its WAL no longer holds local WAL back (should it return, what it needs is streamed from the archive)")
	}
}

// Status implements server.Backend.
func (n *Node) Status() server.Status {
	c := n.st.Control()
	n.mu.Lock()
	a := n.acc.State()
	commit := n.commit
	consumers := n.consumers.snapshot()
	arch := n.archTrouble
	n.mu.Unlock()
	return server.Status{ID: n.cfg.ID, Term: a.Term, ComputeID: a.ComputeID, Accepted: a.Accepted, History: a.History,
		StartLSN: c.StartLSN, FlushLSN: c.FlushLSN, CommitLSN: commit, ArchivedLSN: c.ArchivedLSN,
		SystemID: c.SystemID, Timeline: c.Timeline, SegmentSize: n.st.SegmentSize(), Consumers: consumers, Archive: arch}
}

// stopFollowingLocked ends the current replication session and follows
// nobody; the returned channel is closed once the session has returned (no
// more writes, no more acknowledgements). REQUIRES: n.mu held.
func (n *Node) stopFollowingLocked() <-chan struct{} {
	n.follow = ""
	if n.cancelStr != nil {
		n.cancelStr()
	}
	if n.sessDone == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return n.sessDone
}

func waitDone(ctx context.Context, c <-chan struct{}) error {
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Vote implements server.Backend: a granted vote is persisted before the
// reply, and ends streaming from the old term's compute at once.
func (n *Node) Vote(ctx context.Context, req election.VoteRequest) (election.VoteResponse, error) {
	n.election.Lock()
	defer n.election.Unlock()
	n.mu.Lock()
	before := n.acc.State()
	resp := n.acc.Vote(req)
	var done <-chan struct{}
	if resp.Granted {
		done = n.stopFollowingLocked()
	}
	a := n.acc.State()
	n.mu.Unlock()
	if !resp.Granted {
		resp.Flush = n.st.FlushLSN()
		return resp, nil
	}
	// Report the flush LSN only once the old session is gone: no
	// acknowledgement can go out after it.
	if err := waitDone(ctx, done); err != nil {
		return election.VoteResponse{}, err
	}
	if err := n.st.UpdateControl(func(c *walstore.Control) {
		c.Term, c.ComputeID, c.Accepted = a.Term, a.ComputeID, false
	}); err != nil {
		n.mu.Lock()
		n.acc = election.NewAcceptor(before)
		n.mu.Unlock()
		return election.VoteResponse{}, err
	}
	n.m.term.Set(float64(a.Term))
	n.log.Info().Uint64("term", a.Term).Str("compute", a.ComputeID).Str("flush_lsn", resp.Flush.String()).Msg("safekeeper: voted")
	resp.Flush = n.st.FlushLSN()
	return resp, nil
}

// Accept implements server.Backend: truncate the divergent tail, fetch the
// missing WAL from the donor, persist the new term history and follow the
// new compute.
func (n *Node) Accept(ctx context.Context, req election.AcceptRequest, postgres string) (pg.LSN, error) {
	n.election.Lock()
	defer n.election.Unlock()
	n.mu.Lock()
	done := n.stopFollowingLocked()
	n.mu.Unlock()
	if err := waitDone(ctx, done); err != nil {
		return 0, err
	}
	n.mu.Lock()
	n.acc.Truncated(n.st.FlushLSN())
	plan, err := n.acc.Accept(req)
	n.mu.Unlock()
	if err != nil {
		n.mu.Lock()
		n.follow = n.followTarget(n.st.Control())
		n.mu.Unlock()
		return 0, err
	}
	if plan.Truncate < n.st.WriteLSN() {
		n.log.Warn().Str("to", plan.Truncate.String()).Str("from", n.st.WriteLSN().String()).Uint64("term", req.Term).Msg("safekeeper: truncating divergent WAL")
		if err := n.st.Truncate(plan.Truncate); err != nil {
			return 0, err
		}
	}
	if n.st.IsEmpty() && plan.FetchFrom < plan.FetchTo {
		// A new, empty safekeeper starts where the donor's WAL starts (a
		// segment boundary).
		c, err := n.peerClient(plan.Donor)
		if err != nil {
			return 0, err
		}
		ds, err := c.Status(ctx)
		if err != nil {
			return 0, fmt.Errorf("safekeeper: donor %s: %w", plan.Donor, err)
		}
		from := max(plan.FetchFrom, ds.StartLSN)
		if err := n.st.Init(from, ds.SystemID, ds.Timeline); err != nil {
			return 0, err
		}
		plan.FetchFrom = from
	}
	if w := n.st.WriteLSN(); w < plan.FetchTo {
		if err := n.fetchFrom(ctx, plan.Donor, w, plan.FetchTo); err != nil {
			return 0, fmt.Errorf("safekeeper: catch up from %s: %w", plan.Donor, err)
		}
	}
	flush := n.st.FlushLSN()
	if flush != req.Start {
		return 0, fmt.Errorf("safekeeper: after catch-up the flush LSN is %s, want %s", flush, req.Start)
	}
	n.mu.Lock()
	if err := n.acc.Applied(req.Term, plan, flush); err != nil {
		n.mu.Unlock()
		return 0, err
	}
	a := n.acc.State()
	n.mu.Unlock()
	hist := make([]walstore.TermStart, len(a.History))
	for i, e := range a.History {
		hist[i] = walstore.TermStart{Term: e.Term, Start: e.Start}
	}
	if err := n.st.UpdateControl(func(c *walstore.Control) {
		c.Accepted, c.TermHistory, c.ComputePostgres = true, hist, postgres
	}); err != nil {
		return 0, err
	}
	n.mu.Lock()
	n.follow = n.followTarget(n.st.Control())
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
	n.log.Info().Uint64("term", req.Term).Str("start_lsn", req.Start.String()).Str("history", a.History.String()).Msg("safekeeper: accepted term")
	return flush, nil
}

// fetchFrom copies WAL [from, to) from the safekeeper at addr.
//
// A peer that was down when this node last called it (all three
// safekeepers start together at `strata up`) leaves its connection failing
// fast with Unavailable until gRPC's reconnect backoff ends, even once the
// peer is back: an election whose voters catch up from it would fail. So
// an Unavailable peer is asked again, from where the copy got to, for up
// to fetchRetryFor.
func (n *Node) fetchFrom(ctx context.Context, addr string, from, to pg.LSN) error {
	c, err := n.peerClient(addr)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(fetchRetryFor)
	for {
		err = c.ReadWAL(ctx, from, to, server.BoundFlush, func(lsn pg.LSN, data []byte) error {
			return n.st.Write(lsn, data)
		})
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		if from = max(from, n.st.WriteLSN()); from >= to {
			err = nil
			break
		}
		n.log.Info().Err(err).Str("peer", addr).Msg("safekeeper: peer unavailable for a catch-up; asking again")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil {
		return err
	}
	_, err = n.st.Flush()
	return err
}

// fetchRetryFor bounds how long fetchFrom asks an Unavailable peer again.
const fetchRetryFor = 15 * time.Second

func (n *Node) peerClient(addr string) (*server.Client, error) {
	for _, p := range n.peers {
		if p.Addr == addr {
			return p, nil
		}
	}
	c, err := server.Dial(addr)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.peers = append(n.peers, c)
	n.mu.Unlock()
	return c, nil
}

// repairLoop rewrites blocks that failed verification with copies from
// peers (accepted only when they match the stored checksum).
func (n *Node) repairLoop(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, blk := range n.st.CorruptBlocks() {
			if err := n.repairBlock(ctx, blk); err != nil {
				n.log.Warn().Err(err).Str("block", blk.String()).Msg("safekeeper: repair from peers failed; will retry")
			} else {
				n.log.Info().Str("block", blk.String()).Msg("safekeeper: repaired WAL block from a peer")
			}
		}
	}
}

func (n *Node) repairBlock(ctx context.Context, blk pg.LSN) error {
	end := min(blk+walstore.BlockSize, n.st.FlushLSN())
	var errs []string
	for _, p := range n.peers {
		var buf []byte
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.ReadWAL(cctx, blk, end, server.BoundFlush, func(_ pg.LSN, d []byte) error {
			buf = append(buf, d...)
			return nil
		})
		cancel()
		if err == nil {
			err = n.st.Repair(blk, buf)
		}
		if err == nil {
			return nil
		}
		errs = append(errs, p.Addr+": "+err.Error())
	}
	return fmt.Errorf("no peer had a matching copy: %s", strings.Join(errs, "; "))
}

// storePingLimit bounds the question archiveLoop asks the object store
// before its last step at stop.
const storePingLimit = 3 * time.Second

func (n *Node) archiveLoop(ctx context.Context) {
	var archErrs repeatedErr
	t := time.NewTicker(n.cfg.Archive.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Stopping: the partial last segment goes to the store now,
			// so that a cluster stopped cleanly has all its WAL there.
			// The commit LSN may be a poll round (peerIdlePoll) behind
			// the WAL Postgres wrote last, its shutdown checkpoint
			// among it: the peers are asked once more first (they
			// answer until their own final step is done, see Run).
			fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pctx, pcancel := context.WithTimeout(fctx, 2*time.Second)
			n.pollPeers(pctx)
			pcancel()
			// A store that does not answer would have the step wait
			// out its bound: `strata down` in a store outage.
			qctx, qcancel := context.WithTimeout(fctx, storePingLimit)
			err := n.arch.Ping(qctx)
			qcancel()
			if err != nil {
				n.log.Warn().Err(err).Msg("safekeeper: the partial last segment not archived at stop: the object store does not answer; the local WAL holds it, and the next start archives it")
				return
			}
			if _, err := n.arch.Final(fctx, n.CommitLSN()); err != nil {
				n.log.Warn().Err(err).Msg("safekeeper: archive the partial last segment at stop")
			}
			return
		case <-t.C:
		}
		archived, err := n.arch.Step(ctx, n.CommitLSN())
		n.mu.Lock()
		n.archTrouble.Note(time.Now(), err)
		n.mu.Unlock()
		if err != nil {
			if archErrs.fresh(err) {
				n.log.Warn().Err(err).Msg("safekeeper: archive (the same error is logged once a minute)")
			}
			continue
		}
		n.m.archivedLSN.Set(lsnFloat(archived))
		n.m.partialLSN.Set(lsnFloat(n.arch.PartialLSN()))
		if f := n.st.FlushLSN(); f > archived {
			n.m.archiveLag.Set(float64(f - archived))
		} else {
			n.m.archiveLag.Set(0)
		}
		if n.cfg.Archive.KeepLocal {
			continue
		}
		n.expireConsumers()
		if b := n.removalBound(archived); b > 0 {
			if err := n.st.RemoveBefore(b); err != nil {
				n.log.Warn().Err(err).Msg("safekeeper: remove old WAL")
			}
		}
	}
}

// removalBound is the LSN below which local WAL may go (0: nothing). It
// must be archived, and:
//   - with consumers (a pageserver that ingests WAL), durable at every
//     consumer that reported, to this node or to a peer (a consumer
//     streams from one member; removed WAL that a consumer still needs,
//     one that lost its disk, is streamed from the archive);
//   - with none, only when Archive.Retain is set (a group whose pageserver
//     ingests no WAL: writeback mode), more than Retain bytes below the
//     flush LSN; a starting compute reads older WAL from the archive.
//     Unset, nothing goes until a consumer reports.
func (n *Node) removalBound(archived pg.LSN) pg.LSN {
	n.mu.Lock()
	low, ok := n.consumers.lowestDurable()
	n.mu.Unlock()
	if ok {
		return min(archived, low)
	}
	retain := pg.LSN(n.cfg.Archive.Retain)
	flush := n.st.FlushLSN()
	if retain == 0 || flush <= retain {
		return 0
	}
	return min(archived, flush-retain)
}

// ArchivedSegment implements server.Archive.
func (n *Node) ArchivedSegment(ctx context.Context, lsn pg.LSN) (pg.LSN, []byte, error) {
	if n.arch == nil {
		return 0, nil, fmt.Errorf("%w: %s was removed and this safekeeper archives no WAL", walstore.ErrNotHeld, lsn)
	}
	start, seg, name, err := n.arch.ReadSegment(ctx, lsn)
	if err != nil {
		return 0, nil, err
	}
	n.m.fromArchive.Add(float64(len(seg)))
	n.log.Info().Str("segment", name).Msg("safekeeper: streaming removed WAL from the archive")
	return start, seg, nil
}

var (
	_ server.Backend = (*Node)(nil)
	_ server.Archive = (*Node)(nil)
)

// ConsumerProgress returns the progress consumer last reported.
func (n *Node) ConsumerProgress(consumer string) (server.Feedback, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.consumers.get(consumer)
}
