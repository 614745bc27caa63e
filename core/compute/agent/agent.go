// Package agent is the compute agent behind `strata compute`: it runs a
// stock PostgreSQL 15 whose data directory is the strata FUSE filesystem
// (core/compute/fusefs) over a pageserver timeline (core/compute/psbackend),
// with the cache tiers (plugins/cache) on the read path, and keeps it
// running.
//
// Every start of Postgres, the first one included, follows DESIGN.md 3a:
// the agent wins a safekeeper election with a term above every earlier one
// (E: the durable end of WAL), fences older computes on the pageserver
// (BeginTerm, which also drops a dead compute's versions above E), loads
// the tree from the pageserver, refills local pg_wal with the WAL from the
// stored checkpoint's REDO point R up to E from the safekeepers (or the
// archive), mounts PGDATA with W starting at E and starts Postgres, whose
// own crash recovery does the rest. A timeline without files is a new
// cluster: the agent runs initdb --no-sync on local scratch and copies its
// output into the mount first (initdb.go).
//
// While Postgres is not yet accepting connections, fsync only sends to the
// pageserver (fusefs.FS.SetSyncDurable(false)): crash recovery's
// end-of-recovery checkpoint fsyncs before the safekeepers can stream.
// Once it accepts connections, fsync waits for durability (invariant 2).
//
// When Postgres exits by itself (a crash, a PANIC on a failed fsync, kill
// -9), the agent kills what is left of it, unmounts, and starts again from
// storage the same way. restart_after_crash is off so that Postgres never
// runs crash recovery behind the agent's back.
//
// It is not the cluster orchestrator (core/cluster) and starts no
// safekeeper or pageserver.
package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/redobackend"
	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/sklink"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/core/safekeeper/election"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/plugins/cache/lfc"
	"github.com/stratadb/strata/plugins/cache/sharedbuffers"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrConfig marks an invalid agent configuration.
var ErrConfig = errors.New("agent: invalid config")

// ErrNotEmpty: the timeline is empty (a new cluster) but the safekeepers
// already hold WAL of some other cluster.
var ErrNotEmpty = errors.New("agent: safekeepers hold WAL but the timeline is empty")

// Config configures an Agent.
type Config struct {
	// Pageserver is the pageserver's gRPC address; Timeline the timeline
	// this compute writes (created when missing).
	Pageserver string
	Timeline   pg.TimelineID
	// Safekeepers are the gRPC addresses of the safekeeper group; Quorum
	// is the number synchronous_standby_names waits for (default: a
	// majority).
	Safekeepers []string
	Quorum      int
	// ComputeID names this compute in the election (default: hostname).
	ComputeID string
	// Mountpoint is PGDATA (the FUSE mount); Scratch a local folder for
	// pg_wal, the LFC file, the Unix socket and the Postgres log.
	Mountpoint string
	Scratch    string
	// Port is Postgres' TCP port on 127.0.0.1.
	Port int
	// OSUser runs Postgres (default postgres); PGBinDir holds its programs.
	OSUser   string
	PGBinDir string
	// Password is the superuser postgres' password, set by initdb (or,
	// for an imported folder, at its first start).
	Password string
	// ImportFrom, for a new cluster, is a stopped PostgreSQL 15 data
	// directory to start from instead of initdb (import.go). A cluster
	// that holds files already refuses it.
	ImportFrom string
	// ReplUser and ReplPassword: the role the safekeepers stream as; the
	// agent creates or updates it at every start (empty: not managed).
	ReplUser, ReplPassword string
	// FullPageWrites sets full_page_writes (off is safe on strata).
	FullPageWrites bool
	// Settings are extra postgresql.conf settings, written as given.
	Settings map[string]string
	// Cache is the cache strategy and the memory budget.
	Cache CacheConfig
	// PageSource is PageSourceWriteback (default) or PageSourceRedo
	// (storage.page_source). In redo mode Timeline is the redo timeline
	// (the pageserver rebuilds its pages from WAL) and FilesTimeline holds
	// the non-relation files; relation page writes stay in a local page
	// store of RedoStorePages pages (core/compute/redobackend).
	// PGWal says where pg_wal lives: PGWalAuto (default), PGWalTmpfs,
	// PGWalDisk or PGWalFUSE (pgwal.go).
	PGWal         string
	PageSource    string
	FilesTimeline pg.TimelineID
	// RedoStorePages bounds the local page store in redo mode (default
	// 16384 pages, 128 MiB, outside the memory budget).
	RedoStorePages int
	// ReadAhead is how many blocks the mount fetches in one batch ahead of
	// a sequential reader (fusefs.Options.ReadAhead; 0: off).
	ReadAhead int
	// Archive and ArchivePrefix locate archived WAL for pg_wal refills
	// older than the safekeepers hold (nil: safekeepers only).
	Archive       objectstore.Store
	ArchivePrefix string
	// FeedCommit makes the agent advance the pageserver's commit LSN from
	// the safekeepers' (for a pageserver that does not follow them).
	FeedCommit bool
	// StartTimeout bounds how long one start may go without progress
	// (default 10 min): a step begun, a WAL segment fetched, a segment of
	// crash recovery replayed, a read or write on the mount (progress.go).
	// A start that keeps moving runs as long as it needs.
	StartTimeout time.Duration
	// StopTimeout bounds how long Postgres' fast shutdown may go without
	// progress (default 2 min): a read or write on the mount (its shutdown
	// checkpoint writes every dirty page). Then it is killed, and the next
	// start runs crash recovery.
	StopTimeout time.Duration
	// Debug logs every FUSE request.
	Debug    bool
	Log      zerolog.Logger
	Registry *prometheus.Registry
}

func (c *Config) defaults() error {
	if c.Pageserver == "" || c.Timeline.IsZero() || len(c.Safekeepers) == 0 || c.Mountpoint == "" || c.Scratch == "" {
		return fmt.Errorf("%w: pageserver, timeline, safekeepers, mountpoint and scratch are required", ErrConfig)
	}
	if c.Port <= 0 {
		return fmt.Errorf("%w: port %d", ErrConfig, c.Port)
	}
	if c.Quorum == 0 {
		c.Quorum = len(c.Safekeepers)/2 + 1
	}
	switch c.PageSource {
	case "":
		c.PageSource = PageSourceWriteback
	case PageSourceWriteback:
	case PageSourceRedo:
		if c.FilesTimeline.IsZero() || c.FilesTimeline == c.Timeline {
			return fmt.Errorf("%w: page source redo needs a files timeline other than the redo timeline %s", ErrConfig, c.Timeline)
		}
		if c.FeedCommit {
			return fmt.Errorf("%w: page source redo needs a pageserver that follows the safekeepers (WAL ingest), not --feed-commit", ErrConfig)
		}
		if v, ok := c.Settings["wal_log_hints"]; ok && !settingOn(v) {
			return fmt.Errorf("%w: page source redo needs wal_log_hints = on (VACUUM's all-visible marks must move the heap page's LSN, see docs/redo.md), compute.settings has %s", ErrConfig, v)
		}
		if c.RedoStorePages < 0 {
			return fmt.Errorf("%w: redo store pages %d", ErrConfig, c.RedoStorePages)
		}
		if c.RedoStorePages == 0 {
			c.RedoStorePages = 16384
		}
	default:
		return fmt.Errorf("%w: page source %q: want %s or %s", ErrConfig, c.PageSource, PageSourceWriteback, PageSourceRedo)
	}
	if c.Quorum < 1 || c.Quorum > len(c.Safekeepers) {
		return fmt.Errorf("%w: quorum %d of %d safekeepers", ErrConfig, c.Quorum, len(c.Safekeepers))
	}
	if c.ComputeID == "" {
		h, _ := os.Hostname()
		c.ComputeID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if c.OSUser == "" {
		c.OSUser = "postgres"
	}
	if c.PGBinDir == "" {
		c.PGBinDir = postgres.DefaultBinDir
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 10 * time.Minute
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 2 * time.Minute
	}
	if c.Cache.Strategy == "" {
		c.Cache.Strategy = StrategySharedBuffers
	}
	if c.Cache.MemoryBudget == 0 {
		c.Cache.MemoryBudget = 512 << 20
	}
	if c.Cache.SharedBuffers == (sharedbuffers.Config{}) {
		c.Cache.SharedBuffers = sharedbuffers.DefaultConfig()
	}
	if c.Cache.LFC == (lfc.Config{}) {
		c.Cache.LFC = lfc.DefaultConfig()
	}
	if c.Cache.PrewarmInterval <= 0 {
		c.Cache.PrewarmInterval = 5 * time.Minute
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	var err error
	if c.Mountpoint, err = filepath.Abs(c.Mountpoint); err != nil {
		return err
	}
	if c.Scratch, err = filepath.Abs(c.Scratch); err != nil {
		return err
	}
	return nil
}

// Page sources (storage.page_source).
const (
	PageSourceWriteback = "writeback"
	PageSourceRedo      = "redo"
)

// settingOn reports whether a postgresql.conf boolean value is true.
func settingOn(v string) bool {
	switch strings.ToLower(strings.Trim(strings.TrimSpace(v), "'\"")) {
	case "on", "true", "yes", "1", "t", "y":
		return true
	}
	return false
}

// filesTimeline is the timeline of the non-relation files (and of every
// page in writeback mode).
func (c *Config) filesTimeline() pg.TimelineID {
	if c.PageSource == PageSourceRedo {
		return c.FilesTimeline
	}
	return c.Timeline
}

// Agent runs one compute. Its methods are safe for concurrent use; Run is
// called once.
type Agent struct {
	cfg    Config
	log    zerolog.Logger
	reg    *prometheus.Registry
	ps     *client.Client
	pgs    *postgres.Server
	wal    walPlace // where pg_wal lives
	sizing sharedbuffers.Sizing
	waits  *cache.Waits // the LFC's waits (lock, read, write)
	adv    *advisorHost // compute.cache.advisor (nil: none)
	// guarded: the databases the redo index guard was seen to (redo mode)
	guarded redoGuarded
	// guardKick: the OIDs of database folders Postgres made (redo mode),
	// for watchRedoGuard
	guardKick chan uint32
	uid       int
	gid       int
	born      time.Time

	mu        sync.Mutex
	state     string
	sp        progressTracker // the progress of the start or stop under way
	fs        *fusefs.FS
	be        *psbackend.Backend   // every page and file; in redo mode the files only
	rb        *redobackend.Backend // redo mode: the relation pages
	rbMetrics *redobackend.Metrics
	lfc       *lfc.Cache
	proc      *os.Process
	done      chan struct{} // closed when the postmaster has exited
	exitErr   error         // why it exited, once done is closed
	term      uint64
	e         pg.LSN
	accept    election.AcceptRequest // the term's Accept, for safekeepers that join late
	syncIDs   []string               // synchronous_standby_names
	restarts  int
	coldStart time.Duration
	pw        *prewarmer
}

// New checks cfg, dials the pageserver and returns an agent ready to Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	sizing, err := cfg.Cache.Plan()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if cfg.Cache.Advisor != nil && cfg.Cache.Strategy != StrategyLFC {
		return nil, fmt.Errorf("%w: compute.cache.advisor sizes the LFC: it needs compute.cache.strategy lfc, not %q", ErrConfig, cfg.Cache.Strategy)
	}
	if cfg.Cache.Strategy == StrategyLFC {
		lc := cfg.Cache.LFC
		lc.SizeBytes = sizing.LFCBytes
		if lc.Tier == lfc.TierDisk && lc.Path == "" {
			lc.Path = "set-by-agent"
		}
		if err := lc.Validate(); err != nil {
			return nil, fmt.Errorf("%w: compute.cache.%v", ErrConfig, err)
		}
	}
	u, err := user.Lookup(cfg.OSUser)
	if err != nil {
		return nil, fmt.Errorf("agent: the OS user %q that runs Postgres: %w", cfg.OSUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	ps, err := client.Dial(cfg.Pageserver)
	if err != nil {
		return nil, err
	}
	waits, err := cache.NewWaits(cache.WaitLFCLock, cache.WaitLFCRead, cache.WaitLFCWrite)
	if err != nil {
		ps.Close()
		return nil, err
	}
	a := &Agent{
		cfg: cfg, log: cfg.Log, reg: cfg.Registry, ps: ps, sizing: sizing, waits: waits,
		uid: uid, gid: gid, born: time.Now(), state: "new", guardKick: make(chan uint32, 16),
		pgs: &postgres.Server{
			BinDir:    cfg.PGBinDir,
			DataDir:   cfg.Mountpoint,
			OSUser:    cfg.OSUser,
			Port:      cfg.Port,
			SocketDir: filepath.Join(cfg.Scratch, "sock"),
			LogPath:   filepath.Join(cfg.Scratch, "postgres.log"),
			NoSync:    true,
			Log:       cfg.Log,
		},
	}
	if a.wal, err = cfg.placeWAL(); err != nil {
		ps.Close()
		return nil, err
	}
	if a.wal.link {
		a.pgs.WALDir = a.wal.dir
	}
	if cfg.PageSource == PageSourceRedo {
		a.rbMetrics = redobackend.NewMetrics(a.reg)
	}
	a.pw = newPrewarmer(a)
	collectors := []prometheus.Collector{waits.Collector(), fsCollector{a}, agentCollector{a}, a.pw.pages}
	if cfg.Cache.Strategy == StrategyLFC {
		// The LFC of the current start (a new one at each start).
		collectors = append(collectors, lfc.Collector(func() *lfc.Cache {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.lfc
		}))
	}
	if cfg.Cache.Advisor != nil {
		a.adv = newAdvisorHost(*cfg.Cache.Advisor, cfg.Log)
		collectors = append(collectors, a.adv.calls)
	}
	for _, c := range collectors {
		if err := a.reg.Register(c); err != nil {
			ps.Close()
			return nil, err
		}
	}
	return a, nil
}

// Sizing returns the memory plan (shared_buffers, LFC size, huge pages).
func (a *Agent) Sizing() sharedbuffers.Sizing { return a.sizing }

// URL is the connection string of Postgres as superuser postgres.
func (a *Agent) URL() string { return a.pgs.URL(a.cfg.Password, "postgres") }

// LogFile is Postgres' log.
func (a *Agent) LogFile() string { return a.pgs.LogFile() }

func (a *Agent) setState(s string) {
	a.mu.Lock()
	a.state = s
	a.mu.Unlock()
	a.sp.update(func(p *Progress) { p.Step = s })
	a.log.Info().Str("state", s).Msg("compute")
}

func (a *Agent) currentFS() *fusefs.FS {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fs
}

// FreshReport is Report with the pageserver's durable LSN asked for now
// (at most a second), for the readers that show it: `strata status`,
// `strata compute waits` and the periodic waits log line. When the
// pageserver does not answer, Durable is the last one seen.
func (a *Agent) FreshReport(ctx context.Context) Report {
	a.mu.Lock()
	be := a.be
	a.mu.Unlock()
	if be != nil {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := be.RefreshDurable(ctx); err != nil && ctx.Err() == nil {
			a.log.Debug().Err(err).Msg("refresh the durable LSN for a report")
		}
		cancel()
	}
	return a.Report()
}

// Report returns the agent's state and wait accounting; Durable is the
// last durable LSN the compute saw (FreshReport asks for it).
func (a *Agent) Report() Report {
	a.mu.Lock()
	r := Report{State: a.state, Term: a.term, DurableEnd: a.e, Restarts: a.restarts,
		ColdStart: a.coldStart.Round(time.Millisecond).String(), Strategy: a.cfg.Cache.Strategy,
		Uptime: time.Since(a.born).Round(time.Second).String()}
	f, be, rb, l := a.fs, a.be, a.rb, a.lfc
	a.mu.Unlock()
	r.PageSource = a.cfg.PageSource
	r.Progress = a.sp.report()
	if l != nil {
		st := l.Stats()
		r.LFC = &LFCReport{CapacityBytes: st.CapacityBytes, UsedBytes: st.UsedBytes, BudgetBytes: a.sizing.LFCBytes}
		if a.adv != nil {
			r.LFC.Advisor = a.adv.status()
		}
	}
	switch {
	case a.cfg.Cache.Strategy == StrategyLFC:
		r.Prewarm = a.pw.report()
	case a.cfg.Cache.Prewarm:
		r.Prewarm = &PrewarmReport{State: "autoprewarm"}
	}
	if rb != nil {
		st := rb.Stats()
		r.RedoStore = &st
	}
	if f != nil {
		r.W = f.WAL().Current()
		r.CacheHits, r.CacheMisses = f.Waits().CacheHits()
		ra := &r.ReadAhead
		ra.Fetched, ra.Used, ra.Dropped, ra.Batches = f.Waits().ReadAhead()
		lk := &r.WALLookups
		lk.Walked, lk.Unchanged = f.WAL().FollowStats()
		r.Waits = fsWaits(f.Waits())
	} else {
		r.Waits = fsWaits(&fusefs.Waits{})
	}
	if be != nil {
		r.Durable = be.Durable()
	}
	r.Waits = append(r.Waits, cacheWaits(a.waits)...)
	return r
}

// Run starts Postgres (see the package doc), calls ready with the
// connection string once it accepts connections, and keeps it running:
// after every exit of Postgres it starts it again from storage. When ctx
// ends it stops Postgres (fast shutdown), waits until every write is
// durable, unmounts and returns. A failure of the first start is returned;
// later ones are retried.
func (a *Agent) Run(ctx context.Context, ready func(url string)) error {
	defer a.ps.Close()
	if a.cfg.FeedCommit {
		// The feed outlives ctx: the shutdown checkpoint after ctx ends
		// waits for durability too.
		fctx, fcancel := context.WithCancel(context.WithoutCancel(ctx))
		defer fcancel()
		go a.feedCommit(fctx)
	}
	go a.logWaits(ctx, time.Minute)
	if a.adv != nil {
		defer a.adv.close()
	}
	first := true
	delay := time.Second
	for {
		if err := a.start(ctx); err != nil {
			a.teardown(false)
			if first || ctx.Err() != nil {
				return err
			}
			a.log.Error().Err(err).Dur("retry_in", delay).Msg("compute start failed")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, 30*time.Second)
			continue
		}
		delay = time.Second
		if first && ready != nil {
			ready(a.URL())
		}
		first = false
		a.mu.Lock()
		done := a.done
		a.mu.Unlock()
		jctx, jcancel := context.WithCancel(ctx)
		joined := make(chan struct{})
		go func() { defer close(joined); a.joinLate(jctx) }()
		go a.stopOnLost(jctx)
		if a.cfg.PageSource == PageSourceRedo {
			go a.watchRedoGuard(jctx)
		}
		warmed := make(chan struct{})
		go func() { defer close(warmed); a.pw.run(jctx, a.currentFS()) }()
		if a.adv != nil {
			a.mu.Lock()
			l := a.lfc
			a.mu.Unlock()
			if l != nil {
				go a.adv.run(jctx, l, a.sizing.LFCBytes, a.waits)
			}
		}
		select {
		case <-ctx.Done():
			jcancel()
			<-joined
			// A prewarm read can wait on a pageserver that does not answer;
			// the stop does not wait for it long (the stop's save then
			// keeps the list that was loading).
			waitAWhile(warmed, 5*time.Second)
			err := a.stop()
			if err == nil {
				if rerr := a.wal.release(); rerr != nil {
					a.log.Warn().Err(rerr).Str("folder", a.wal.own).Msg("removing the tmpfs pg_wal folder")
				}
			}
			return err
		case <-done:
			jcancel()
			<-joined
			waitAWhile(warmed, 5*time.Second)
			a.log.Error().Err(a.exitError()).Str("log", a.LogFile()).Str("log_tail", a.pgs.Tail(1024)).Msg("postgres exited; restarting it from storage")
			a.teardown(false)
			a.mu.Lock()
			a.restarts++
			a.mu.Unlock()
		}
	}
}

// waitAWhile waits until ch is closed or d has passed.
func waitAWhile(ch <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// stopOnLost stops Postgres at once (immediate shutdown, no checkpoint)
// when the pageserver restarted and lost page writes of this start's
// Backend that were not yet durable: its reads fail from then on
// (psbackend.ErrLost), and the run loop starts Postgres again from
// storage, whose crash recovery writes the lost pages again from the
// safekeepers' WAL.
func (a *Agent) stopOnLost(ctx context.Context) {
	a.mu.Lock()
	be, p := a.be, a.proc
	a.mu.Unlock()
	if be == nil || p == nil {
		return
	}
	select {
	case <-ctx.Done():
	case <-be.LostNotify():
		a.log.Error().Err(be.Lost()).Msg("the pageserver lost page writes that were not yet durable: stopping postgres (immediate) to restart it from storage")
		_ = p.Signal(syscall.SIGQUIT)
	}
}

// start runs one start of Postgres from storage.
func (a *Agent) start(ctx context.Context) (err error) {
	t0 := time.Now()
	a.sp.begin()
	defer a.sp.end()
	ctx, stall := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	a.mu.Lock()
	bound := a.cfg.StartTimeout
	a.mu.Unlock()
	go func() { defer close(watched); a.watchProgress(ctx, stall, bound) }()
	defer func() {
		stall(nil)
		<-watched
	}()
	defer func() {
		// A start cancelled for want of progress says so, with what it
		// was doing, rather than only "context canceled".
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrNoProgress) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}()
	tl := a.cfg.filesTimeline()
	redo := a.cfg.PageSource == PageSourceRedo
	timelines := []pg.TimelineID{a.cfg.Timeline}
	if redo {
		timelines = append(timelines, a.cfg.FilesTimeline)
	}
	a.setState("electing")
	for _, id := range timelines {
		if err := a.ensureTimeline(ctx, id); err != nil {
			return err
		}
	}
	term, ids, el, err := a.elect(ctx)
	if err != nil {
		return err
	}
	e := el.End
	for _, id := range timelines {
		// In redo mode the redo timeline takes this compute's writes only
		// when it imports initdb's output: fence it all the same.
		dropped, ack, err := a.ps.BeginTerm(ctx, id, term, e)
		if err != nil {
			return fmt.Errorf("agent: pageserver BeginTerm(%d, %s) on timeline %s: %w", term, e, id, err)
		}
		a.log.Info().Uint64("term", term).Stringer("timeline", id).Str("durable_end", e.String()).Int("dropped", dropped).Str("pageserver_durable", ack.Durable.String()).Msg("term begun")
	}
	a.mu.Lock()
	a.term, a.e, a.accept, a.syncIDs = term, e, el.Accept, ids
	a.mu.Unlock()

	a.setState("loading")
	be, err := psbackend.Open(ctx, a.ps, tl, psbackend.Options{Log: a.log})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.be = be
	a.mu.Unlock()
	files, err := be.List(ctx)
	if err != nil {
		return err
	}
	var fsBackend fusefs.Backend = be
	var rb *redobackend.Backend
	if redo {
		// Unbounded until a new cluster's initdb output is imported.
		rb, err = redobackend.Open(ctx, redobackend.Options{Pages: redobackend.ClientPages(a.ps, a.cfg.Timeline), Files: be,
			Log: a.log, Metrics: a.rbMetrics})
		if err != nil {
			return err
		}
		fsBackend = rb
		a.mu.Lock()
		a.rb = rb
		a.mu.Unlock()
	}
	rels, err := fsBackend.ListRels(ctx)
	if err != nil {
		return err
	}
	fresh := len(files) == 0 && len(rels) == 0
	if rb != nil && !fresh {
		rb.SetMaxPages(a.cfg.RedoStorePages)
	}
	walDir := a.wal.dir
	walStart, importing, importID := e, false, uint64(0)
	if err := a.prepareScratch(); err != nil {
		return err
	}
	if err := a.wal.prepare(a.cfg.Mountpoint, a.uid, a.gid); err != nil {
		return err
	}
	src := WALSource{Safekeepers: a.cfg.Safekeepers, Archive: a.cfg.Archive, Prefix: a.cfg.ArchivePrefix}
	if fresh {
		if e > 0 {
			return fmt.Errorf("%w: the safekeepers agree on WAL up to %s, but timeline %s has no files: they belong to another cluster (start from empty safekeepers, or use the timeline they were written for), or the pageserver lost its folder before it uploaded the files (its local folder is state, not a cache: docs/operator.md)", ErrNotEmpty, e, tl)
		}
		if a.cfg.Password == "" {
			return fmt.Errorf("%w: a new cluster needs the superuser password for initdb", ErrConfig)
		}
		// initdb creates pg_wal and pg_wal/archive_status itself (mkdir,
		// failing on EEXIST; or, with -X, the folder it links to): start
		// from nothing.
		if err := os.RemoveAll(walDir); err != nil {
			return err
		}
		if dir := a.cfg.ImportFrom; dir != "" {
			a.setState("checking " + dir)
			ctl, err := CheckImport(dir, slices.Collect(maps.Keys(a.settings(ids))))
			if err != nil {
				return err
			}
			importID = importSystemID(ctl.SystemID, a.cfg.Timeline)
			n, err := importWAL(dir, walDir, ctl, importID, a.uid, a.gid)
			if err != nil {
				return fmt.Errorf("agent: import: copying the WAL of %s: %w", dir, err)
			}
			a.log.Info().Str("from", dir).Stringer("checkpoint", ctl.Checkpoint).Uint32("pg_timeline", uint32(ctl.Timeline)).Int("wal_files", n).
				Uint64("system_id", ctl.SystemID).Uint64("new_system_id", importID).Msg("importing a data directory instead of initdb")
			// The mount's W starts at the folder's last checkpoint: the
			// copy's writes wait for the safekeepers to hold that WAL.
			walStart, importing = ctl.Checkpoint, true
		}
	} else {
		buf := make([]byte, 8192)
		n, err := be.ReadFile(ctx, ControlFile, 0, buf)
		if err != nil {
			return fmt.Errorf("agent: timeline %s has files but reading %s failed (an initdb that never finished? start on a new timeline): %w", tl, ControlFile, err)
		}
		ctl, err := ParseControl(buf[:n])
		if err != nil {
			return err
		}
		if err := a.checkImported(ctl); err != nil {
			return err
		}
		if e == 0 {
			return fmt.Errorf("agent: timeline %s holds a cluster (pg_control names checkpoint %s) but the safekeepers hold none of its WAL (their folders are new, or were pointed at another group?); Postgres cannot start without the WAL of its last checkpoint: start the safekeepers on the folders that hold it", tl, ctl.Checkpoint)
		}
		if e <= ctl.Checkpoint {
			return fmt.Errorf("agent: stored pg_control names checkpoint %s, past the durable end of WAL %s: storage is ahead of the safekeepers", ctl.Checkpoint, e)
		}
		a.setState("fetching WAL")
		src.SystemID = ctl.SystemID
		a.sp.update(func(p *Progress) { p.ReplayFrom, p.ReplayEnd = ctl.Redo, e })
		src.Progress = func(done, total int) {
			a.sp.update(func(p *Progress) { p.FetchedSegments, p.FetchSegments = done, total })
		}
		tf := time.Now()
		n2, err := FillWAL(ctx, src, walDir, ctl.Timeline, ctl.Redo, e, a.uid, a.gid)
		if err != nil {
			return err
		}
		a.log.Info().Str("redo", ctl.Redo.String()).Str("checkpoint", ctl.Checkpoint.String()).Str("end", e.String()).Int("segments", n2).Dur("took", time.Since(tf)).Msg("pg_wal filled from the safekeepers")
		if err := a.recoverPastCleanShutdown(ctx, be, buf[:n], ctl, walDir, e); err != nil {
			return err
		}
	}

	l, err := newLFC(a.cfg.Cache, a.sizing, a.cfg.Scratch, a.waits, a.log)
	if err != nil {
		return err
	}
	var fc fusefs.Cache
	if l != nil {
		fc = tier{c: l, log: a.log}
	}
	a.mu.Lock()
	a.lfc = l
	a.mu.Unlock()

	a.setState("mounting")
	if err := fusefs.MountpointCleanup(a.cfg.Mountpoint); err != nil {
		a.log.Warn().Err(err).Msg("releasing a mount left at the mountpoint")
	}
	// The postgres OS user must reach the mountpoint.
	if err := os.MkdirAll(filepath.Dir(a.cfg.Mountpoint), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(a.cfg.Mountpoint, 0o700); err != nil {
		return err
	}
	var onDB func(uint32)
	if a.cfg.PageSource == PageSourceRedo {
		onDB = a.onDatabaseDir
	}
	f, err := fusefs.Mount(ctx, a.cfg.Mountpoint, fusefs.Options{
		Backend: fsBackend, Cache: fc, WALScratch: walDir, WALLink: a.wal.link, UID: uint32(a.uid), GID: uint32(a.gid),
		WALStart: walStart, SendOnlySync: true, SendOnlyPath: safekeeperSlot, ReadAhead: a.cfg.ReadAhead,
		OnDatabaseDir: onDB, Debug: a.cfg.Debug, Log: a.log,
	})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.fs = f
	a.mu.Unlock()
	if rb != nil {
		rb.SetWALPosition(f.WAL().Current)
	}

	if fresh {
		out, done := a.cfg.ImportFrom, func() {}
		if importing {
			a.setState("importing " + out)
			if err := a.importData(ctx, out, importID); err != nil {
				return err
			}
		} else {
			a.setState("initdb")
			if out, done, err = a.initdb(ctx); err != nil {
				return err
			}
		}
		if rb != nil {
			if err := a.importBase(ctx, out); err != nil {
				done()
				return err
			}
			rb.SetMaxPages(a.cfg.RedoStorePages)
		}
		done()
	}
	if err := a.pgs.Configure(a.settings(ids)); err != nil {
		return err
	}
	a.setState("recovering")
	if err := a.launch(); err != nil {
		return err
	}
	if err := a.waitReady(ctx); err != nil {
		return err
	}
	if pid := a.PostmasterPID(); pid != 0 {
		if err := noteShm(a.cfg.Scratch, pid); err != nil {
			a.log.Warn().Err(err).Msg("cannot note the postmaster's shared memory: if it is killed, the next start cannot remove it")
		}
	}
	if importing {
		// The imported folder's superuser password is the old cluster's:
		// the new cluster's connection string carries its own. Before the
		// replication role: the safekeepers cannot stream until that has
		// the new cluster's password, so nothing of the import is durable
		// (and an agent killed here imports again) until this is done.
		if err := a.setSuperuserPassword(ctx); err != nil {
			return err
		}
	}
	if err := a.ensureReplUser(ctx); err != nil {
		return err
	}
	if a.cfg.PageSource == PageSourceRedo {
		a.ensureRedoGuard(ctx, false)
	}
	// Once a quorum of safekeepers streams, fsync waits for durability
	// (invariant 2). Not before: the safekeepers' first connection creates
	// their replication slots, and Postgres fsyncs a slot's state file
	// before the walsender streams anything.
	a.setState("waiting for the safekeepers")
	// A safekeeper that missed the election may be needed for the quorum
	// already (an elected one went down since): bring it in meanwhile.
	jctx, jcancel := context.WithCancel(ctx)
	joined := make(chan struct{})
	go func() { defer close(joined); a.joinLate(jctx) }()
	err = a.waitStreaming(ctx)
	jcancel()
	<-joined
	if err != nil {
		return err
	}
	f.SetSyncDurable(true)
	took := time.Since(t0)
	a.mu.Lock()
	a.coldStart = took
	a.mu.Unlock()
	a.setState("running")
	a.log.Info().Dur("start", took).Bool("initdb", fresh && !importing).Bool("imported", importing).Int("port", a.cfg.Port).Msg("postgres accepts connections")
	return nil
}

func (a *Agent) prepareScratch() error {
	for _, d := range []string{a.cfg.Scratch, filepath.Join(a.cfg.Scratch, "sock")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.Chown(d, a.uid, a.gid); err != nil {
			return err
		}
	}
	return nil
}

// ensureTimeline creates timeline id when the pageserver does not have it.
func (a *Agent) ensureTimeline(ctx context.Context, id pg.TimelineID) error {
	tls, err := a.ps.ListTimelines(ctx)
	if err != nil {
		return fmt.Errorf("agent: pageserver %s: %w", a.cfg.Pageserver, err)
	}
	for _, t := range tls {
		if t.ID == id {
			return nil
		}
	}
	if _, err := a.ps.CreateTimeline(ctx, id); err != nil {
		return fmt.Errorf("agent: create timeline %s: %w", id, err)
	}
	a.log.Info().Str("timeline", id.String()).Msg("timeline created")
	return nil
}

// importBase imports initdb's output, the folder dir (initdb's local
// staging folder, or the mount), into the redo timeline at its shutdown
// checkpoint: initdb writes relation pages without WAL, so they are the
// base that WAL ingest builds on. The writes are gated like any compute
// write; the pageserver starts WAL ingest from the checkpoint once it sees
// them.
func (a *Agent) importBase(ctx context.Context, dir string) error {
	a.setState("importing initdb's output")
	t0 := time.Now()
	b, err := os.ReadFile(filepath.Join(dir, ControlFile))
	if err != nil {
		return fmt.Errorf("agent: initdb's pg_control: %w", err)
	}
	ctl, err := ParseControl(b)
	if err != nil {
		return err
	}
	if err := pageserver.ImportDataDir(ctx, a.ps.ImportTarget(a.cfg.Timeline), dir, ctl.Checkpoint); err != nil {
		return fmt.Errorf("agent: importing initdb's output into the redo timeline %s: %w", a.cfg.Timeline, err)
	}
	a.log.Info().Stringer("timeline", a.cfg.Timeline).Stringer("checkpoint", ctl.Checkpoint).Dur("took", time.Since(t0)).Msg("initdb's output imported as the redo timeline's base")
	return nil
}

// recoverPastCleanShutdown makes Postgres replay the WAL that follows a
// clean shutdown checkpoint. A stored pg_control that says Postgres shut
// down cleanly while the safekeepers hold WAL records after that
// checkpoint is older than the WAL: the pageserver lost the newer one (it
// restarted before the running server's pg_control became durable, or it
// started on an empty folder from an object store that lacked it).
// Postgres would start without replaying anything and write over that
// WAL, acknowledged commits included; with the state of a running server
// it runs crash recovery from the checkpoint to E instead, which is what
// the stored pages need (they may be newer than the checkpoint, as after
// any crash). The rewritten pg_control is stored at W = E.
func (a *Agent) recoverPastCleanShutdown(ctx context.Context, be fusefs.Backend, control []byte, ctl Control, walDir string, e pg.LSN) error {
	if ctl.State != dbShutdowned {
		return nil
	}
	after, err := RecordsAfter(walDir, ctl.Checkpoint, e)
	if err != nil {
		// Postgres reads the same WAL and says what it finds.
		a.log.Warn().Err(err).Msg("not checked for WAL past the clean shutdown checkpoint")
		return nil
	}
	if !after {
		return nil
	}
	b, err := ForceCrashRecovery(control)
	if err != nil {
		return err
	}
	if err := be.WriteFile(ctx, ControlFile, 0, b, e); err != nil {
		return fmt.Errorf("agent: storing pg_control for crash recovery: %w", err)
	}
	a.log.Warn().Stringer("checkpoint", ctl.Checkpoint).Stringer("end", e).
		Msg("stored pg_control says Postgres shut down cleanly, but the safekeepers hold WAL after that checkpoint: the stored files are older than the WAL; Postgres runs crash recovery to the end of it")
	return nil
}

// electGrace is how long elect waits for the safekeepers beyond a quorum.
const electGrace = 3 * time.Second

// elect wins a safekeeper election with a term above every one seen and
// returns it, the IDs of the safekeepers that answered (their
// application_name) and the outcome (E, the term's Accept message).
func (a *Agent) elect(ctx context.Context) (uint64, []string, safekeeper.Elected, error) {
	var top uint64
	var ids []string
	// Safekeepers that were just started may not answer yet: wait for a
	// quorum (bounded by the start's deadline), and for the others a little
	// longer. A safekeeper missing from the election is also missing from
	// synchronous_standby_names until the next start, so the cluster would
	// survive no further safekeeper failure even once it is back.
	var quorumAt time.Time
	for {
		top, ids = 0, ids[:0]
		var errs []error
		for _, addr := range a.cfg.Safekeepers {
			st, err := safekeeperStatus(ctx, addr)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", addr, err))
				continue
			}
			top = max(top, st.Term)
			ids = append(ids, st.ID)
		}
		if len(ids) >= a.cfg.Quorum && quorumAt.IsZero() {
			quorumAt = time.Now()
		}
		if len(ids) >= a.cfg.Quorum && (len(errs) == 0 || time.Since(quorumAt) >= electGrace) {
			if len(errs) > 0 {
				a.log.Warn().Err(errors.Join(errs...)).Dur("waited", time.Since(quorumAt)).
					Msg("electing without every safekeeper: the missing ones join the term and count for synchronous commit once they answer")
			}
			break
		}
		select {
		case <-ctx.Done():
			return 0, nil, safekeeper.Elected{}, fmt.Errorf("agent: only %d of %d safekeepers answer, %d needed: %w", len(ids), len(a.cfg.Safekeepers), a.cfg.Quorum, errors.Join(errs...))
		case <-time.After(200 * time.Millisecond):
		}
	}
	postgresAddr := "127.0.0.1:" + strconv.Itoa(a.cfg.Port)
	for try := 0; ; try++ {
		term := top + 1
		el, err := safekeeper.ElectWith(ctx, term, a.cfg.ComputeID, postgresAddr, a.cfg.Safekeepers,
			safekeeper.ElectOptions{Trim: a.trimToRecord})
		if err == nil {
			a.log.Info().Uint64("term", term).Str("durable_end", el.End.String()).Strs("safekeepers", ids).Msg("elected")
			return term, ids, el, nil
		}
		if errors.Is(err, safekeeper.ErrNoQuorum) && try < 5 {
			// Safekeepers that were just started may fail a vote or an
			// accept (a catch-up from a peer not reachable yet): a new
			// term in a moment.
			a.log.Warn().Err(err).Uint64("term", term).Msg("election failed; trying again with a higher term")
			select {
			case <-ctx.Done():
				return 0, nil, safekeeper.Elected{}, fmt.Errorf("agent: election for term %d: %w", term, err)
			case <-time.After(time.Second):
			}
			top = term
			continue
		}
		if !errors.Is(err, safekeeper.ErrFenced) || try >= 5 {
			return 0, nil, safekeeper.Elected{}, fmt.Errorf("agent: election for term %d: %w", term, err)
		}
		top = term // someone else took it: go higher
	}
}

// trimToRecord returns the end of the last complete WAL record at or below
// the donor's flush end: a killed Postgres can leave a record cut on the
// safekeepers, the next Postgres' recovery ends before it and writes on
// from there, so the new term starts there and no safekeeper keeps the cut
// tail (see election.Proposer.Trim).
func (a *Agent) trimToRecord(ctx context.Context, donor string, end, floor pg.LSN) (pg.LSN, error) {
	c, err := server.Dial(donor)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	read := func(ctx context.Context, from, to pg.LSN) ([]byte, error) {
		var out []byte
		err := c.ReadWAL(ctx, from, to, server.BoundFlush, func(_ pg.LSN, d []byte) error {
			out = append(out, d...)
			return nil
		})
		return out, err
	}
	w, err := walpos.RecordEndAtOrBelow(ctx, read, end, floor, pg.WALSegmentSize)
	if err != nil {
		if ctx.Err() != nil {
			return 0, err
		}
		// The donor no longer holds the page before its end (WAL removed
		// up to a segment boundary), or the end follows the zero padding
		// of a pg_switch_wal (its record ends there): keep the end as it
		// is, as before.
		a.log.Warn().Err(err).Str("donor", donor).Str("donor_end", end.String()).Msg("no record end found on the page below the donor's end (its WAL before it removed, or pg_switch_wal's padding); starting the term at that end")
		return end, nil
	}
	if w != end {
		a.log.Info().Str("donor_end", end.String()).Str("record_end", w.String()).Msg("the donor's WAL ends inside a record: the new term starts at the record end before it")
	}
	return w, nil
}

func safekeeperStatus(ctx context.Context, addr string) (server.Status, error) {
	c, err := server.Dial(addr)
	if err != nil {
		return server.Status{}, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// settings are strata's postgresql.conf settings (strata.conf).
func (a *Agent) settings(ids []string) map[string]string {
	s := map[string]string{
		"wal_level":                 "replica",
		"max_wal_senders":           "16",
		"max_replication_slots":     "16",
		"wal_sender_timeout":        "'30s'",
		"synchronous_commit":        "on",
		"synchronous_standby_names": fmt.Sprintf("'ANY %d (%s)'", a.cfg.Quorum, strings.Join(ids, ", ")),
		"full_page_writes":          onOff(a.cfg.FullPageWrites),
		// Crash recovery only under the agent, which first makes pg_wal
		// and the stored files agree on E (and relaxes fsync).
		"restart_after_crash": "off",
		// New segments need not be zero-filled through FUSE.
		"wal_init_zero": "off",
		// Group commit. pg_wal is local scratch without a disk flush, so a
		// commit's WAL flush returns at once and, under load, nearly every
		// commit became a send of its own to each safekeeper, and a flush
		// and a status reply there. Waiting up to 200 us for the commits of
		// other running transactions (commit_siblings: at least 5 more
		// active) lets one send carry several. One client waits no longer.
		// TPROC-C at 16 VUs on two cores: +10-25% New-Orders and less CPU
		// per New-Order in Postgres and the safekeepers
		// (docs/benchmarks.md). compute.settings may replace it (0: off).
		"commit_delay": "200",
		// No prefetch hints: Postgres prefetches with posix_fadvise, which
		// on the mount's direct-I/O files makes the kernel read the block
		// into its page cache through FUSE, where no read of Postgres ever
		// looks: every prefetched block was fetched twice. The agent's
		// read-ahead serves sequential and ordered sparse readers
		// (ANALYZE's sample) instead. ANALYZE of a 640 MB table not in
		// cache: 9.8 s with the defaults (10, 1), 5.0 s with 0
		// (docs/benchmarks.md). compute.settings may replace them.
		"effective_io_concurrency":   "0",
		"maintenance_io_concurrency": "0",
	}
	for k, v := range a.sizing.Settings() {
		s[k] = v
	}
	if a.cfg.Cache.Prewarm && a.cfg.Cache.Strategy == StrategySharedBuffers {
		// shared_buffers are warmed by Postgres' own autoprewarm: it dumps
		// the buffers' block list to autoprewarm.blocks in the data
		// directory (stored like every file there) and loads it after a
		// start. Settings of the config come after and may replace these.
		s["shared_preload_libraries"] = "'pg_prewarm'"
		s["pg_prewarm.autoprewarm"] = "on"
		s["pg_prewarm.autoprewarm_interval"] = fmt.Sprintf("'%ds'", max(1, int(a.cfg.Cache.PrewarmInterval/time.Second)))
	}
	for k, v := range a.cfg.Settings {
		s[k] = v
	}
	if a.cfg.PageSource == PageSourceRedo {
		// Checked in Config.defaults: redo needs it (docs/redo.md).
		s["wal_log_hints"] = "on"
	}
	// The agent finds a dead postmaster's backends by this tag in their
	// process titles (orphans.go).
	s["cluster_name"] = "'" + clusterTag(a.cfg.Mountpoint) + "'"
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// launch starts the postmaster as a child in its own process group. It
// gets SIGKILL if the agent dies (Pdeathsig), so that no Postgres outlives
// the filesystem it runs on.
func (a *Agent) launch() error {
	logf, err := os.OpenFile(a.pgs.LogFile(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd, err := a.pgs.Command(context.Background(), "postgres", "-D", a.cfg.Mountpoint)
	if err != nil {
		logf.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	exe, err := filepath.EvalSymlinks(cmd.Path)
	if err != nil {
		exe = cmd.Path
	}
	tag := clusterTag(a.cfg.Mountpoint)
	// The Postgres of an agent that died (see orphans.go): SIGKILL is
	// asynchronous, and a new postmaster refuses to start while the old one
	// holds the socket lock, so wait until they are gone.
	if n := reapOrphans(exe, tag, a.cfg.Mountpoint); n > 0 {
		a.log.Warn().Int("processes", n).Msg("killing Postgres processes left by an earlier agent")
		for i := 0; i < 300 && reapOrphans(exe, tag, a.cfg.Mountpoint) > 0; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, lock := range []string{
		filepath.Join(a.cfg.Mountpoint, "postmaster.pid"),
		filepath.Join(a.cfg.Scratch, "sock", fmt.Sprintf(".s.PGSQL.%d.lock", a.cfg.Port)),
	} {
		if err := waitLockHolder(lock, 30*time.Second); err != nil {
			return err
		}
	}
	a.releaseShm()
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		// Pdeathsig follows the thread that forked: keep it alive (and
		// this goroutine on it) for as long as the postmaster runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logf.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		if err == nil {
			err = errors.New("postmaster exited with status 0")
		}
		// Backends orphaned by a postmaster that was killed (see orphans.go).
		if n := reapOrphans(exe, tag, a.cfg.Mountpoint); n > 0 {
			a.log.Warn().Int("processes", n).Msg("killed backends the postmaster left behind")
		}
		a.releaseShm()
		a.mu.Lock()
		a.exitErr = err
		a.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("agent: start postgres: %w", err)
	}
	a.mu.Lock()
	a.proc, a.done, a.exitErr = cmd.Process, done, nil
	a.mu.Unlock()
	a.log.Info().Int("pid", cmd.Process.Pid).Str("log", a.pgs.LogFile()).Msg("postgres started")
	return nil
}

// releaseShm removes the shared memory a killed postmaster left (shm.go).
// A postmaster that exited cleanly removed its own: nothing is left to do.
func (a *Agent) releaseShm() {
	removed, busy, err := releaseShm(a.cfg.Scratch)
	switch {
	case err != nil:
		a.log.Warn().Err(err).Msg("removing the shared memory of a postmaster that was killed")
	case len(removed) > 0:
		a.log.Info().Strs("removed", removed).Msg("removed the shared memory of a postmaster that was killed")
	case busy:
		a.log.Debug().Msg("the shared memory of the last postmaster is still attached; removed before the next start")
	}
}

func (a *Agent) exitError() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exitErr
}

// PostmasterPID returns the running postmaster's PID, or 0.
func (a *Agent) PostmasterPID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc == nil {
		return 0
	}
	return a.proc.Pid
}

// socketConn is a libpq keyword/value string for the Unix socket (trust).
func (a *Agent) socketConn() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", filepath.Join(a.cfg.Scratch, "sock"), a.cfg.Port)
}

// waitReady waits until Postgres accepts a connection (crash recovery
// included), or fails when it exits.
func (a *Agent) waitReady(ctx context.Context) error {
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	for {
		c, err := pgx.Connect(ctx, a.socketConn())
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent: postgres does not accept connections: %v\n%s", err, a.pgs.Tail(2048))
		case <-done:
			return fmt.Errorf("agent: postgres exited during start (%v):\n%s", a.exitError(), a.pgs.Tail(4096))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ensureReplUser creates or updates the safekeepers' replication role,
// committing locally (no safekeeper may stream yet).
func (a *Agent) ensureReplUser(ctx context.Context) error {
	if a.cfg.ReplUser == "" {
		return nil
	}
	return a.localExec(ctx, func(conn *pgx.Conn) error {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", a.cfg.ReplUser).Scan(&exists); err != nil {
			return err
		}
		verb := "CREATE"
		if exists {
			verb = "ALTER"
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("%s ROLE %s LOGIN REPLICATION PASSWORD %s", verb,
			pgx.Identifier{a.cfg.ReplUser}.Sanitize(), quoteLiteral(a.cfg.ReplPassword)))
		return err
	})
}

// localExec runs fn on a connection over the Unix socket whose commits
// are local (synchronous_commit = local): before a quorum of safekeepers
// streams, a commit that waited for them would wait for ever.
func (a *Agent) localExec(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, a.socketConn())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		return err
	}
	return fn(conn)
}

// waitStreaming waits until a quorum of safekeepers streams from Postgres
// and counts for synchronous commit. A walsender that Postgres does not
// count does not do: a safekeeper that missed this start's election may
// stream as a follower of the previous term until it joins this one.
func (a *Agent) waitStreaming(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, a.socketConn())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	for {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')").Scan(&n)
		if err == nil && n >= a.cfg.Quorum {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent: %d of the %d safekeepers needed stream from Postgres (last error %v): %w", n, a.cfg.Quorum, err, ctx.Err())
		case <-done:
			return fmt.Errorf("agent: postgres exited before the safekeepers streamed (%v):\n%s", a.exitError(), a.pgs.Tail(4096))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// killGroup kills the postmaster and waits until it is reaped; the
// goroutine that reaps it kills the backends it left (orphans.go).
func (a *Agent) killGroup() {
	a.mu.Lock()
	p, done := a.proc, a.done
	a.mu.Unlock()
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		a.log.Error().Int("pid", p.Pid).Msg("postmaster not reaped after SIGKILL")
	}
}

// teardown kills Postgres if it runs, sends what the backend buffered,
// unmounts and drops the LFC. With clean, it also waits (bounded) until
// every write is durable.
func (a *Agent) teardown(clean bool) error {
	a.killGroup()
	a.mu.Lock()
	f, be, l := a.fs, a.be, a.lfc
	a.fs, a.be, a.rb, a.lfc, a.proc = nil, nil, nil, nil, nil
	a.mu.Unlock()
	var errs []error
	if be != nil {
		if clean && f != nil {
			// Sync detaches from its context (FUSE interrupts must not cut
			// it), so bound the wait here: without a safekeeper quorum
			// nothing becomes durable.
			synced := make(chan error, 1)
			w := f.WAL().Current()
			go func() { synced <- be.Sync(context.Background(), w) }()
			select {
			case err := <-synced:
				if err != nil {
					errs = append(errs, fmt.Errorf("agent: final sync: %w", err))
				}
			case <-time.After(time.Minute):
				errs = append(errs, fmt.Errorf("agent: writes up to %s not durable after a minute (is a quorum of safekeepers up?)", w))
			}
		}
		if err := be.Close(); err != nil && clean {
			errs = append(errs, err)
		}
	}
	if f != nil {
		if err := f.Unmount(); err != nil {
			errs = append(errs, err)
		}
	} else if err := fusefs.MountpointCleanup(a.cfg.Mountpoint); err != nil {
		errs = append(errs, err)
	}
	if l != nil {
		_ = l.Close()
	}
	return errors.Join(errs...)
}

// stop shuts Postgres down (fast: its shutdown checkpoint needs the
// safekeepers, which must still run), makes every write durable and
// unmounts.
func (a *Agent) stop() error {
	a.sp.begin()
	defer a.sp.end()
	a.setState("stopping")
	a.mu.Lock()
	p, done, f := a.proc, a.done, a.fs
	a.mu.Unlock()
	if f != nil {
		// W is the end of the WAL Postgres wrote, not of what it flushed.
		// WAL can be written past the flush point when the shutdown
		// starts (wal_log_hints in redo mode; in either mode, a record
		// that the WAL writer wrote without flushing, such as the
		// full_page_writes change of a reload just before, or WAL that
		// full WAL buffers pushed out for a transaction the shutdown
		// aborts), and once the shutdown has stopped the WAL writer
		// nothing flushes it before the shutdown checkpoint's fsyncs: a
		// durable fsync would wait for WAL the safekeepers never get
		// (seen in redo mode, and in writeback mode on a bench restart
		// right after a reload: the checkpointer stuck in fsync, the
		// walsenders idle at the flush point, the pageserver's commit LSN
		// 224 bytes short of W, `strata down` killed after 5 minutes). So
		// fsync only sends from here on, as before the safekeepers stream;
		// the pageserver's gate still makes nothing durable before its
		// WAL, and teardown waits (bounded) until everything is durable
		// once Postgres has flushed and streamed its shutdown checkpoint.
		f.SetSyncDurable(false)
	}
	var errs []error
	if p != nil {
		ctx, stall := context.WithCancelCause(context.Background())
		watched := make(chan struct{})
		go func() { defer close(watched); a.watchProgress(ctx, stall, a.cfg.StopTimeout) }()
		_ = p.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-done:
			a.log.Info().Msg("postgres stopped")
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("agent: postgres did not stop (%w); killed, the next start runs crash recovery", context.Cause(ctx)))
		}
		stall(nil)
		<-watched
	}
	// The LFC's pages, for the next start: after the shutdown checkpoint,
	// which wrote the pages that only shared_buffers held into the LFC,
	// and before teardown drops the LFC.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	a.pw.save(sctx)
	scancel()
	if err := a.teardown(true); err != nil {
		errs = append(errs, err)
	}
	a.setState("stopped")
	return errors.Join(errs...)
}

// feedCommit advances the pageserver's commit LSN to the safekeepers'
// commit LSN of this agent's term (sklink.Quorum of their statuses), for a
// pageserver that does not follow the safekeepers itself.
func (a *Agent) feedCommit(ctx context.Context) {
	clients := make([]*server.Client, 0, len(a.cfg.Safekeepers))
	for _, addr := range a.cfg.Safekeepers {
		c, err := server.Dial(addr)
		if err != nil {
			a.log.Error().Err(err).Str("safekeeper", addr).Msg("commit feed")
			continue
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var fed pg.LSN
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		term := a.term
		a.mu.Unlock()
		if term == 0 {
			continue
		}
		peers := make([]sklink.Peer, 0, len(clients))
		for _, c := range clients {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.Status(cctx)
			cancel()
			if err == nil && st.Term == term && st.Accepted {
				peers = append(peers, sklink.Peer{Addr: c.Addr, Up: true, Term: st.Term, Accepted: true, Flush: st.FlushLSN, Commit: st.CommitLSN})
			}
		}
		// WAL a majority flushed in this term is committed; a safekeeper's
		// own commit LSN trails that by its peer polls.
		commit := sklink.Quorum(peers, len(a.cfg.Safekeepers))
		if commit > fed {
			if err := a.ps.AdvanceCommitLSN(ctx, a.cfg.Timeline, commit); err != nil {
				if ctx.Err() == nil {
					a.log.Warn().Err(err).Msg("advance the pageserver's commit LSN")
				}
				continue
			}
			fed = commit
		}
	}
}

// every calls fn every d until ctx ends (the agent's periodic jobs: the
// wait log, the LFC page list, the redo index guard).
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// logWaits logs the wait report every period while Postgres runs.
func (a *Agent) logWaits(ctx context.Context, period time.Duration) {
	every(ctx, period, func() {
		r := a.FreshReport(ctx)
		if r.State != "running" {
			return
		}
		ev := a.log.Info().Str("w", r.W.String()).Str("durable", r.Durable.String()).Uint64("cache_hits", r.CacheHits).Uint64("cache_misses", r.CacheMisses)
		for _, w := range r.Waits {
			if w.Count > 0 {
				ev = ev.Dict(w.Name, zerolog.Dict().Int64("count", w.Count).Dur("total", w.Total))
			}
		}
		ev.Msg("waits")
	})
}

// agentCollector exports the agent's own gauges.
type agentCollector struct{ a *Agent }

var (
	descRestarts = prometheus.NewDesc("strata_compute_postgres_restarts_total", "Restarts of Postgres by the agent after it exited.", nil, nil)
	descTerm     = prometheus.NewDesc("strata_compute_term", "The compute's current safekeeper election term.", nil, nil)
	descW        = prometheus.NewDesc("strata_compute_wal_position", "W: the end of the last complete WAL record Postgres wrote (as a number).", nil, nil)
	descStart    = prometheus.NewDesc("strata_compute_start_seconds", "Time of the last start, from the election to Postgres accepting connections.", nil, nil)
)

func (c agentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRestarts
	ch <- descTerm
	ch <- descW
	ch <- descStart
}

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.a.Report()
	c.a.mu.Lock()
	start := c.a.coldStart
	c.a.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(r.Restarts))
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(r.Term))
	ch <- prometheus.MustNewConstMetric(descW, prometheus.GaugeValue, float64(r.W))
	ch <- prometheus.MustNewConstMetric(descStart, prometheus.GaugeValue, start.Seconds())
}
