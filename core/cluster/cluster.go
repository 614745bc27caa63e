package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/netport"
	"github.com/stratadb/strata/sdk/pg"
)

// ReplUser is the replication role the safekeepers stream WAL as.
const ReplUser = "strata_repl"

// ErrNotRunning is returned by Status when no cluster was started here.
var ErrNotRunning = errors.New("cluster: not running (start it with `strata up`)")

// State is what `strata up` started, kept in <data_dir>/cluster.json.
type State struct {
	DataDir     string `json:"data_dir"`
	ConfigPath  string `json:"config_path"`
	PostgresDir string `json:"postgres_dir"`
	Port        int    `json:"port"`
	Timeline    string `json:"timeline"`
	PageSource  string `json:"page_source,omitempty"`
	// FilesTimeline holds the non-relation files in redo mode.
	FilesTimeline string `json:"files_timeline,omitempty"`
	Pageserver    string `json:"pageserver"`
	Compute       string `json:"compute_metrics"` // the agent's /waits address
	Procs         []Proc `json:"procs"`
	Started       string `json:"started"`
}

// Cluster is the single-machine cluster that cfg describes.
type Cluster struct {
	cfg     *config.Config
	dataDir string
	strata  string // path of the strata binary that runs the safekeepers
	log     zerolog.Logger
}

// New returns the cluster of cfg. strataBin is the binary to run the
// safekeepers with (normally os.Executable()).
func New(cfg *config.Config, strataBin string, log zerolog.Logger) (*Cluster, error) {
	dir, err := filepath.Abs(cfg.Cluster.DataDir)
	if err != nil {
		return nil, err
	}
	return &Cluster{cfg: cfg, dataDir: dir, strata: strataBin, log: log}, nil
}

func (c *Cluster) statePath() string { return filepath.Join(c.dataDir, "cluster.json") }

// postgres describes the compute's Postgres: PGDATA is the agent's FUSE
// mount (the cluster only reads its URL and PID from it).
func (c *Cluster) postgres() *postgres.Server {
	return &postgres.Server{
		BinDir:  c.cfg.Compute.PGBinDir,
		DataDir: filepath.Join(c.dataDir, "compute", "pgdata"),
		OSUser:  c.cfg.Compute.OSUser,
		Port:    c.cfg.Compute.Port,
		Log:     c.log,
	}
}

// absDataDir is the cluster's folder as an absolute path, for messages.
func (c *Cluster) absDataDir() string {
	if abs, err := filepath.Abs(c.dataDir); err == nil {
		return abs
	}
	return c.dataDir
}

// readState returns the recorded state, or ErrNotRunning.
func (c *Cluster) readState() (*State, error) {
	b, err := os.ReadFile(c.statePath())
	if errors.Is(err, os.ErrNotExist) {
		// Name the folder: cluster.data_dir is relative to the working
		// directory, and a command run from another one looks elsewhere.
		return nil, fmt.Errorf("%w; no cluster state in %s", ErrNotRunning, c.absDataDir())
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", c.statePath(), err)
	}
	return &st, nil
}

func (c *Cluster) writeState(st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.statePath())
}

// secret returns the named secret under <data_dir>/secrets, creating a
// random one the first time. Secrets are never logged.
func (c *Cluster) secret(name string) (string, error) {
	dir := filepath.Join(c.dataDir, "secrets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if b, err := os.ReadFile(p); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	s := hex.EncodeToString(buf)
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		return "", err
	}
	return s, nil
}

// URL is the connection string of the cluster's Postgres.
func (c *Cluster) URL() (string, error) {
	pw, err := c.secret("postgres.password")
	if err != nil {
		return "", err
	}
	return c.postgres().URL(pw, "postgres"), nil
}

func (c *Cluster) safekeeperIDs() []string {
	ids := make([]string, c.cfg.Cluster.Safekeepers)
	for i := range ids {
		ids[i] = fmt.Sprintf("sk%d", i+1)
	}
	return ids
}

func (c *Cluster) safekeeperAddr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Cluster.SafekeeperPort+i))
}

// syncStandbyNames is the synchronous_standby_names value: ANY quorum of
// the safekeepers.
func (c *Cluster) syncStandbyNames() string {
	return fmt.Sprintf("ANY %d (%s)", c.cfg.Cluster.Quorum, strings.Join(c.safekeeperIDs(), ", "))
}

// Running reports whether every recorded process is alive.
func (c *Cluster) Running() (*State, bool) {
	st, err := c.readState()
	if err != nil {
		return nil, false
	}
	for _, p := range st.Procs {
		if !p.Alive() {
			return st, false
		}
	}
	return st, len(st.Procs) > 0
}

func (c *Cluster) redo() bool { return c.cfg.Storage.PageSource == config.PageSourceRedo }

// checkPageSource refuses to start a cluster in another page source than
// the one it was created with (kept in <data_dir>/page_source; a cluster
// from before that file is writeback): a writeback timeline has no WAL
// base to rebuild pages from, and a redo timeline's pages are not the
// compute's.
func (c *Cluster) checkPageSource() error {
	p := filepath.Join(c.dataDir, "page_source")
	b, err := os.ReadFile(p)
	var was string
	switch {
	case err == nil:
		was = strings.TrimSpace(string(b))
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat(filepath.Join(c.dataDir, "timeline")); err == nil {
			was = config.PageSourceWriteback
		} else {
			return os.WriteFile(p, []byte(c.cfg.Storage.PageSource+"\n"), 0o644)
		}
	default:
		return err
	}
	if was != c.cfg.Storage.PageSource {
		return fmt.Errorf("cluster: %s was created with storage.page_source %s and cannot switch to %s (use another cluster.data_dir)", c.dataDir, was, c.cfg.Storage.PageSource)
	}
	return nil
}

// timeline returns the cluster's pageserver timeline (in redo mode the
// redo timeline), kept in <data_dir>/timeline (a new random one the first
// time).
func (c *Cluster) timeline() (pg.TimelineID, error) { return c.namedTimeline("timeline") }

// namedTimeline returns the timeline ID kept in <data_dir>/name, creating
// a random one the first time.
func (c *Cluster) namedTimeline(name string) (pg.TimelineID, error) {
	p := filepath.Join(c.dataDir, name)
	if b, err := os.ReadFile(p); err == nil {
		return pg.ParseTimelineID(strings.TrimSpace(string(b)))
	}
	var id pg.TimelineID
	if _, err := rand.Read(id[:]); err != nil {
		return id, err
	}
	return id, os.WriteFile(p, []byte(id.String()+"\n"), 0o644)
}

func (c *Cluster) pageserverAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Cluster.PageserverGRPCPort()))
}

// metricsAddr returns the i-th /metrics address ("" when metrics are off):
// the safekeepers take 0..n-1, the pageserver n, the compute agent n+1.
func (c *Cluster) metricsAddr(i int) string {
	if c.cfg.Cluster.MetricsPort <= 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Cluster.MetricsPort+i))
}

// ComputeMetricsAddr is the compute agent's /metrics and /waits address
// ("" when cluster.metrics_port is 0).
func (c *Cluster) ComputeMetricsAddr() string { return c.metricsAddr(c.cfg.Cluster.Safekeepers + 1) }

// Up starts the cluster: the safekeepers, the pageserver, then the compute
// agent (which mounts PGDATA over the pageserver, runs initdb the first
// time and starts Postgres); it waits until Postgres accepts connections
// and a quorum of safekeepers streams from it, and returns the connection
// string. progress gets one line per step. A running cluster only returns
// its string; a partly running one is stopped and started again; one whose
// processes run without a state file is refused (strata down stops them).
// Ups and downs of one folder take turns (lock).
func (c *Cluster) Up(ctx context.Context, progress func(string)) (string, error) {
	return c.up(ctx, "", progress)
}

// Import is Up for a new cluster that starts from dir, a stopped
// PostgreSQL 15 data directory (a `strata restore` copy, or any cleanly
// stopped server's folder), instead of initdb. dir is only read; the new
// cluster gets a system identifier and a superuser password of its own.
// A cluster that holds data already refuses it (its compute says so).
func (c *Cluster) Import(ctx context.Context, dir string, progress func(string)) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if st, ok := c.Running(); ok {
		return "", fmt.Errorf("cluster: import: the cluster in %s is running (started %s): an import makes a new cluster: give a new cluster.data_dir", c.absDataDir(), st.Started)
	}
	ctl, err := agent.CheckImport(abs, nil)
	if err != nil {
		return "", err
	}
	progress(fmt.Sprintf("importing %s (system %d, checkpoint %s) instead of initdb", abs, ctl.SystemID, ctl.Checkpoint))
	return c.up(ctx, abs, progress)
}

func (c *Cluster) up(ctx context.Context, importDir string, progress func(string)) (string, error) {
	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return "", err
	}
	unlock, err := c.lock(ctx, progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	if st, ok := c.Running(); ok {
		progress("cluster already running (started " + st.Started + ")")
		return c.URL()
	}
	if st, err := c.readState(); err == nil {
		progress("restarting a partly running cluster")
		c.stopProcs(ctx, st)
	} else if err := c.strayError(); err != nil {
		return "", err // a second set of processes would find the ports taken
	}
	// The cluster is not running: a mount left at PGDATA is a dead
	// agent's, and such an agent, killed while it waited on its own mount,
	// holds its ports until the mount's connection is aborted.
	if err := fusefs.MountpointCleanup(c.postgres().DataDir); err != nil {
		progress("releasing a mount left at " + c.postgres().DataDir + ": " + err.Error())
	}
	if err := c.checkPorts(); err != nil {
		return "", err
	}
	for _, w := range c.ephemeralPorts() {
		progress(w)
	}
	pgPW, err := c.secret("postgres.password")
	if err != nil {
		return "", err
	}
	replPW, err := c.secret("replication.password")
	if err != nil {
		return "", err
	}
	if err := c.checkPageSource(); err != nil {
		return "", err
	}
	if line, err := c.checkGroupChange(); err != nil {
		return "", err
	} else if line != "" {
		progress(line)
	}
	// Saved before any member starts: from the first election on, the
	// acknowledged commits may be on this group's members only, and a
	// change back is checked as any other.
	if err := c.saveGroup(); err != nil {
		return "", err
	}
	_, err = os.Stat(filepath.Join(c.dataDir, "timeline"))
	if line, err := c.checkStore(ctx, errors.Is(err, os.ErrNotExist)); err != nil {
		return "", err
	} else if line != "" {
		progress(line)
	}
	tl, err := c.timeline()
	if err != nil {
		return "", err
	}
	var filesTL pg.TimelineID
	if c.redo() {
		if filesTL, err = c.namedTimeline("files-timeline"); err != nil {
			return "", err
		}
	}
	pgs := c.postgres()
	st := &State{
		DataDir:     c.dataDir,
		ConfigPath:  c.cfg.Path,
		PostgresDir: pgs.DataDir,
		Port:        pgs.Port,
		Timeline:    tl.String(),
		PageSource:  c.cfg.Storage.PageSource,
		Pageserver:  c.pageserverAddr(),
		Compute:     c.ComputeMetricsAddr(),
		Started:     time.Now().UTC().Format(time.RFC3339),
	}
	fail := func(err error) (string, error) {
		c.stopProcs(context.WithoutCancel(ctx), st)
		_ = os.Remove(c.statePath())
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return "", fmt.Errorf("cluster: up interrupted; the processes it had started are stopped, and the data stays (%w)", err)
		}
		return "", err
	}
	for i, id := range c.safekeeperIDs() {
		p, err := c.startSafekeeper(i, id, replPW)
		if err != nil {
			return fail(err)
		}
		st.Procs = append(st.Procs, p)
		progress(fmt.Sprintf("safekeeper %s on %s (pid %d, log %s)", id, c.safekeeperAddr(i), p.PID, p.Log))
	}
	if c.redo() {
		st.FilesTimeline = filesTL.String()
	}
	ps, err := c.startPageserver(ctx, tl, filesTL)
	if err != nil {
		return fail(err)
	}
	st.Procs = append(st.Procs, ps)
	progress(fmt.Sprintf("pageserver on %s (pid %d, log %s)", c.pageserverAddr(), ps.PID, ps.Log))
	if err := c.writeState(st); err != nil {
		return fail(err)
	}
	psCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := c.waitPageserver(psCtx, ps); err != nil {
		return fail(err)
	}
	cp, err := c.startCompute(tl, filesTL, pgPW, replPW, importDir)
	if err != nil {
		return fail(err)
	}
	st.Procs = append(st.Procs, cp)
	if err := c.writeState(st); err != nil {
		return fail(err)
	}
	progress(fmt.Sprintf("compute agent (pid %d, log %s): postgres on 127.0.0.1:%d, PGDATA %s on FUSE (timeline %s, synchronous_standby_names = '%s')",
		cp.PID, cp.Log, pgs.Port, pgs.DataDir, tl, c.syncStandbyNames()))
	if err := c.waitCompute(ctx, cp, progress); err != nil {
		return fail(err)
	}
	progress(fmt.Sprintf("waiting for %d of %d safekeepers to stream", c.cfg.Cluster.Quorum, c.cfg.Cluster.Safekeepers))
	qCtx, qcancel := context.WithTimeout(ctx, 10*time.Minute)
	defer qcancel()
	if err := c.waitQuorum(qCtx, pgs, pgPW, st); err != nil {
		return fail(err)
	}
	return pgs.URL(pgPW, "postgres"), nil
}

// pageserverFollowsSafekeepers reports whether this strata's pageserver
// takes --safekeepers (then it learns the commit LSN itself; otherwise the
// compute agent feeds it).
func (c *Cluster) pageserverFollowsSafekeepers() bool {
	out, err := exec.Command(c.strata, "pageserver", "--help").CombinedOutput()
	return err == nil && strings.Contains(string(out), "--safekeepers")
}

func (c *Cluster) safekeeperAddrs() []string {
	addrs := make([]string, c.cfg.Cluster.Safekeepers)
	for i := range addrs {
		addrs[i] = c.safekeeperAddr(i)
	}
	return addrs
}

func (c *Cluster) startPageserver(ctx context.Context, tl, filesTL pg.TimelineID) (Proc, error) {
	dir := filepath.Join(c.dataDir, "pageserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Proc{}, err
	}
	horizon, err := c.cfg.Storage.GCHorizonBytes()
	if err != nil {
		return Proc{}, fmt.Errorf("cluster: storage.gc_horizon: %w", err)
	}
	imageBytes, err := c.cfg.Storage.ImageLayerByteCount()
	if err != nil {
		return Proc{}, fmt.Errorf("cluster: storage.image_layer_bytes: %w", err)
	}
	args := []string{"pageserver",
		"--listen", c.pageserverAddr(),
		"--data-dir", dir,
		"--metrics-addr", c.metricsAddr(c.cfg.Cluster.Safekeepers),
		"--image-policy", c.cfg.Storage.ImagePolicy,
		"--pushdown-deltas", strconv.Itoa(c.cfg.Storage.PushdownDeltas),
		"--pushdown-bytes", strconv.Itoa(c.cfg.Storage.PushdownBytes),
		"--hot-burst", strconv.Itoa(c.cfg.Storage.HotBurst),
		"--pitr", c.cfg.Storage.PITR.String(),
		"--gc-horizon", strconv.FormatInt(horizon, 10),
		"--image-layer-bytes", strconv.FormatInt(imageBytes, 10),
		// A supervisor starts it again if it dies after running 10 s:
		// its durable state is on disk and in the object store. Page
		// writes it held that were not yet durable are lost; the compute
		// notices the new incarnation on its next answer, uses no read
		// from it and restarts Postgres, whose crash recovery writes
		// them again.
		"--restart-on-crash",
	}
	if c.pageserverFollowsSafekeepers() {
		args = append(args, "--safekeepers", strings.Join(c.safekeeperAddrs(), ","), "--timeline", tl.String())
		if c.redo() {
			args = append(args, "--files-timeline", filesTL.String())
		}
	} else if c.redo() {
		return Proc{}, fmt.Errorf("cluster: storage.page_source redo needs a pageserver that follows the safekeepers (%s pageserver has no --safekeepers)", c.strata)
	}
	if c.cfg.Path != "" {
		args = append([]string{"--config", c.cfg.Path}, args...)
	}
	return startDetached("pageserver", c.strata, args, filepath.Join(dir, "pageserver.log"), nil)
}

// waitPageserver waits until the pageserver answers.
func (c *Cluster) waitPageserver(ctx context.Context, p Proc) error {
	cl, err := client.Dial(c.pageserverAddr())
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.ListTimelines(qctx)
		cancel()
		if err == nil {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("cluster: the pageserver exited; its log %s ends with:\n%s", p.Log, tail(p.Log, 2048))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: pageserver on %s does not answer: %v", c.pageserverAddr(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) computeDir() string { return filepath.Join(c.dataDir, "compute") }

func (c *Cluster) readyFile() string { return filepath.Join(c.computeDir(), "ready") }

func (c *Cluster) startCompute(tl, filesTL pg.TimelineID, pgPW, replPW, importDir string) (Proc, error) {
	dir := c.computeDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Proc{}, err
	}
	_ = os.Remove(c.readyFile())
	args := []string{"compute",
		"--pageserver", c.pageserverAddr(),
		"--timeline", tl.String(),
		"--safekeepers", strings.Join(c.safekeeperAddrs(), ","),
		"--mountpoint", c.postgres().DataDir,
		"--scratch", filepath.Join(dir, "scratch"),
		"--port", strconv.Itoa(c.cfg.Compute.Port),
		"--compute-id", "compute-" + strconv.Itoa(os.Getpid()),
		"--repl-user", ReplUser,
		"--ready-file", c.readyFile(),
		// A supervisor starts the agent again if it dies (kill -9, a
		// crash) after it was ready; killing the supervisor kills it.
		"--restart-on-crash",
	}
	if a := c.ComputeMetricsAddr(); a != "" {
		args = append(args, "--metrics-addr", a)
	}
	if c.redo() {
		args = append(args, "--files-timeline", filesTL.String())
	}
	if !c.pageserverFollowsSafekeepers() {
		args = append(args, "--feed-commit")
	}
	if importDir != "" {
		args = append(args, "--import-from", importDir)
	}
	if c.cfg.Path != "" {
		args = append([]string{"--config", c.cfg.Path}, args...)
	}
	env := []string{config.EnvComputePassword + "=" + pgPW, config.EnvComputeReplPassword + "=" + replPW}
	return startDetached("compute", c.strata, args, filepath.Join(dir, "compute.log"), env)
}

// computeStall is how long strata up waits for a compute start whose
// progress does not move: the agent's own bound (agent.Config.StartTimeout,
// 10 min) and a minute for it to fail and say why.
var computeStall = 11 * time.Minute

// waitCompute waits until the agent reports Postgres ready (its ready
// file). Meanwhile it passes on how far the agent's start got (its /waits
// report): each new step, and while WAL is fetched or crash recovery
// replays it, a line every 10 s. A start that keeps moving is waited for
// however long it takes (crash recovery grows with max_wal_size); one that
// does not move for computeStall fails, as does one whose agent exits.
func (c *Cluster) waitCompute(ctx context.Context, p Proc, progress func(string)) error {
	w := newProgressWatch(progress)
	for {
		if _, err := os.Stat(c.readyFile()); err == nil {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("cluster: the compute agent exited; its log %s ends with:\n%s", p.Log, tail(p.Log, 4096))
		}
		w.see(c.computeProgress(ctx))
		if idle := w.idle(); idle >= computeStall {
			return fmt.Errorf("cluster: postgres not ready: the compute's start made no progress for %s (last: %s; see %s)", idle.Round(time.Second), w.last(), p.Log)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: postgres not ready: %w (see %s)", ctx.Err(), p.Log)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// progressWatch passes on the compute agent's reports of a start or stop
// (agent.Progress) as progress lines: a new step, or crash recovery's
// first segment, at once; the figures of one step every 10 s. It keeps
// when the report last moved.
type progressWatch struct {
	progress       func(string)
	step, line     string
	moved, printed time.Time
}

func newProgressWatch(progress func(string)) *progressWatch {
	return &progressWatch{progress: progress, moved: time.Now()}
}

// see takes a report (nil: none came).
func (w *progressWatch) see(p *agent.Progress) {
	if p == nil || p.String() == w.line {
		return
	}
	w.line, w.moved = p.String(), time.Now()
	key := p.Step
	if p.Replaying != "" {
		key += ", replaying"
	}
	if key != w.step || time.Since(w.printed) >= 10*time.Second {
		w.step, w.printed = key, time.Now()
		w.progress("compute: " + w.line)
	}
}

// idle is how long the report has not moved (since the watch began when
// none came).
func (w *progressWatch) idle() time.Duration { return time.Since(w.moved) }

// last is the last report, for an error.
func (w *progressWatch) last() string {
	if w.line == "" {
		return "no report from the agent"
	}
	return w.line
}

// stopCompute stops the compute agent (SIGTERM to its group: the agent
// shuts Postgres down, waits until every write is durable and unmounts),
// passing on its progress. The shutdown checkpoint writes every dirty page
// of shared_buffers through the mount, which takes as long as there are
// pages, so the agent is killed only once its report has not moved for
// ComputeStopTimeout (from the start, when it reports nothing).
func (c *Cluster) stopCompute(ctx context.Context, p Proc, progress func(string)) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(-p.PID, syscall.SIGTERM); err != nil {
		return nil
	}
	w := newProgressWatch(progress)
	for p.Alive() {
		w.see(c.computeProgress(ctx))
		if idle := w.idle(); idle >= ComputeStopTimeout {
			_ = syscall.Kill(-p.PID, syscall.SIGKILL)
			for i := 0; i < 100 && p.Alive(); i++ {
				time.Sleep(20 * time.Millisecond)
			}
			return fmt.Errorf("cluster: the compute (pid %d) made no progress in its stop for %s (last: %s); killed, the next start runs crash recovery", p.PID, idle.Round(time.Second), w.last())
		}
		time.Sleep(250 * time.Millisecond)
	}
	return nil
}

// computeProgress asks the agent how far its start or stop got (nil when
// it does not answer, metrics are off, or neither runs).
func (c *Cluster) computeProgress(ctx context.Context) *agent.Progress {
	addr := c.ComputeMetricsAddr()
	if addr == "" {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(qctx, http.MethodGet, "http://"+addr+"/waits", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var r agent.Report
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil {
		return nil
	}
	return r.Progress
}

// checkPorts fails early, naming the key to change, when a port is taken.
func (c *Cluster) checkPorts() error {
	return c.eachPort(func(key string, port int) error {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("cluster: port %d on 127.0.0.1 is in use (%s): stop what uses it or change %s", port, err, key)
		}
		return l.Close()
	})
}

// eachPort calls fn with every port the cluster's servers listen on and
// the key that sets it, until fn fails.
func (c *Cluster) eachPort(fn func(key string, port int) error) error {
	if err := fn("compute.port", c.cfg.Compute.Port); err != nil {
		return err
	}
	if err := fn("cluster.pageserver_port", c.cfg.Cluster.PageserverGRPCPort()); err != nil {
		return err
	}
	for i := range c.safekeeperIDs() {
		if err := fn("cluster.safekeeper_port", c.cfg.Cluster.SafekeeperPort+i); err != nil {
			return err
		}
	}
	for i := range c.cfg.Cluster.Safekeepers + 2 {
		if a := c.metricsAddr(i); a != "" {
			if err := fn("cluster.metrics_port", c.cfg.Cluster.MetricsPort+i); err != nil {
				return err
			}
		}
	}
	return nil
}

// ephemeralPorts says which of the cluster's ports lie in the kernel's
// ephemeral range, where an outgoing connection can take one while its
// server restarts (internal/netport): one line per key, for a warning.
func (c *Cluster) ephemeralPorts() []string {
	lo, hi := netport.EphemeralRange()
	var out []string
	seen := map[string]bool{}
	c.eachPort(func(key string, port int) error {
		if netport.Ephemeral(port) && !seen[key] {
			seen[key] = true
			out = append(out, fmt.Sprintf("warning: %s (%d) is in the kernel's ephemeral port range %d-%d: an outgoing connection can take the port while its server restarts, which then fails with \"address already in use\"; pick a port below %d (or reserve it in net.ipv4.ip_local_reserved_ports)", key, port, lo, hi, lo))
		}
		return nil
	})
	return out
}

func (c *Cluster) startSafekeeper(i int, id, replPW string) (Proc, error) {
	dir := filepath.Join(c.dataDir, "safekeepers", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Proc{}, err
	}
	// The replication password travels in the environment, not in argv
	// (which any user can read in /proc).
	env := []string{"STRATA_SAFEKEEPER_POSTGRES=" + fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", ReplUser, replPW, c.cfg.Compute.Port)}
	return startDetached("safekeeper "+id, c.strata, c.safekeeperArgs(i, id, dir), filepath.Join(dir, "safekeeper.log"), env)
}

// safekeeperArgs is the command line of safekeeper i (ID id, folder dir).
func (c *Cluster) safekeeperArgs(i int, id, dir string) []string {
	var peers []string
	for j := range c.safekeeperIDs() {
		if j != i {
			peers = append(peers, c.safekeeperAddr(j))
		}
	}
	args := []string{"safekeeper",
		"--id", id,
		"--data-dir", dir,
		"--listen", c.safekeeperAddr(i),
		"--peers", strings.Join(peers, ","),
		// Every safekeeper archives to the cluster's object store under
		// the same prefix: archive keys are content-addressed by segment,
		// and a segment's bytes are the same on every safekeeper.
		"--archive",
		// A supervisor starts it again if it dies after running 10 s.
		"--restart-on-crash",
	}
	if !c.cfg.Storage.IngestsWAL() {
		// The pageserver ingests no WAL, so no consumer ever says what
		// may go: keep cluster.safekeeper_wal_retain bytes, the archive
		// holds the rest (validated with the config).
		if n, err := c.cfg.Cluster.SafekeeperWALRetainBytes(); err == nil && n > 0 {
			args = append(args, "--archive-retain", strconv.FormatInt(n, 10))
		}
	}
	if a := c.metricsAddr(i); a != "" {
		args = append(args, "--metrics-addr", a)
	}
	if n := c.cfg.Cluster.SafekeeperGOMAXPROCS; n > 0 {
		args = append(args, "--gomaxprocs", strconv.Itoa(n))
	}
	if !c.cfg.Cluster.SafekeeperRawSyscalls {
		args = append(args, "--raw-syscalls=false")
	}
	if c.cfg.Path != "" {
		args = append([]string{"--config", c.cfg.Path}, args...)
	}
	return args
}

// waitQuorum waits until enough safekeepers stream from Postgres for a
// synchronous commit to return.
func (c *Cluster) waitQuorum(ctx context.Context, pg *postgres.Server, pgPW string, st *State) error {
	conn, err := pgx.Connect(ctx, pg.URL(pgPW, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('quorum', 'sync')").Scan(&n)
		if err == nil && n >= c.cfg.Cluster.Quorum {
			return nil
		}
		for _, p := range st.Procs {
			if !p.Alive() {
				return fmt.Errorf("cluster: %s exited; its log %s ends with:\n%s", p.Name, p.Log, tail(p.Log, 2048))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: only %d of the %d safekeepers needed are streaming from Postgres: %w (see the logs under %s/safekeepers)", n, c.cfg.Cluster.Quorum, ctx.Err(), c.dataDir)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// How long Down waits for a process after SIGTERM before it kills the
// process group (and, for the compute, unmounts the data directory): for
// the compute, whose shutdown checkpoint writes every dirty page through
// the pageserver, how long its stop may go without progress; the others
// stop at once.
const (
	ComputeStopTimeout = 5 * time.Minute
	ProcStopTimeout    = 30 * time.Second
)

// Down stops the compute agent (which stops Postgres with a fast shutdown,
// whose checkpoint needs the safekeepers, and unmounts), then the
// pageserver, then the safekeepers, and removes the state file. The data
// stays. Without a state file it stops the processes strayProcs finds.
func (c *Cluster) Down(ctx context.Context, progress func(string)) error {
	if _, err := os.Stat(c.dataDir); err == nil {
		unlock, err := c.lock(ctx, progress)
		if err != nil {
			return err
		}
		defer unlock()
	}
	st, err := c.readState()
	if errors.Is(err, ErrNotRunning) {
		strays, serr := strayProcs(c.dataDir)
		if serr != nil || len(strays) == 0 {
			progress("not running; no cluster state in " + c.absDataDir())
			return nil
		}
		// The state file went (deleted, or with the whole folder) while
		// the cluster ran: its processes still hold the ports and the
		// mount, and name the folder on their command lines.
		progress(fmt.Sprintf("no cluster state in %s, but %s of the cluster still run: stopping them", c.absDataDir(), procList(strays)))
		st = &State{Procs: strays}
	} else if err != nil {
		return err
	}
	err = c.stopProcsReporting(ctx, st, progress)
	if rmErr := os.Remove(c.statePath()); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = rmErr
	}
	if err == nil {
		progress("stopped")
	}
	return err
}

// lock makes strata up and down on one cluster folder take turns, waiting
// (and saying so once) while another holds it, until ctx ends: a second up
// started while the first one still starts processes would find no state
// file yet and start a second set. The kernel drops the lock with its
// holder; the servers do not inherit it (close-on-exec).
func (c *Cluster) lock(ctx context.Context, progress func(string)) (unlock func(), err error) {
	path := filepath.Join(c.dataDir, "cluster.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	for waiting := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("cluster: lock %s: %w", path, err)
		}
		if !waiting {
			progress("waiting for another strata up or down on " + c.absDataDir())
			waiting = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("cluster: waiting for another strata up or down on %s: %w", c.absDataDir(), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// strayError says which processes of the cluster run without its state
// file (strayProcs), or is nil when none do.
func (c *Cluster) strayError() error {
	strays, err := strayProcs(c.dataDir)
	if err != nil || len(strays) == 0 {
		return nil
	}
	return fmt.Errorf("cluster: no state file %s, but %s of the cluster still run: stop them with `strata down` (same configuration)", c.statePath(), procList(strays))
}

// procList names processes for a message: "5 processes (safekeeper sk1
// pid 10, ...)".
func procList(ps []Proc) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = fmt.Sprintf("%s pid %d", p.Name, p.PID)
	}
	return fmt.Sprintf("%d processes (%s)", len(ps), strings.Join(names, ", "))
}

// stopProcs stops the recorded processes in the reverse order of their
// start: compute, pageserver, then the safekeepers all at once.
func (c *Cluster) stopProcs(ctx context.Context, st *State) error {
	return c.stopProcsReporting(ctx, st, func(string) {})
}

// stopProcsReporting is stopProcs with a progress line for each decision
// an operator should know about.
func (c *Cluster) stopProcsReporting(ctx context.Context, st *State, progress func(string)) error {
	var errs []error
	for i := len(st.Procs) - 1; i >= 0; i-- {
		p := st.Procs[i]
		if p.Name == "compute" && p.Alive() {
			// Postgres' shutdown checkpoint becomes durable only through
			// the safekeeper quorum: without one the agent would wait for
			// minutes. Nothing acknowledged is lost by stopping at once
			// (acknowledged commits are on the quorum's WAL; the next
			// start runs crash recovery from it).
			if n := c.safekeepersAnswering(ctx); n < c.cfg.Cluster.Quorum {
				progress(fmt.Sprintf("only %d of %d safekeepers answer (%d needed): stopping the compute without a shutdown checkpoint; the next start runs crash recovery", n, c.cfg.Cluster.Safekeepers, c.cfg.Cluster.Quorum))
				if err := p.Stop(2 * time.Second); err != nil && p.Alive() {
					errs = append(errs, err)
				}
				if err := fusefs.MountpointCleanup(c.postgres().DataDir); err != nil {
					errs = append(errs, err)
				}
				continue
			}
		}
		if isSafekeeper(p) {
			// The safekeepers stop together: each one's last step (its
			// final archive upload, bounded) can take seconds while the
			// object store is out, and they do not wait on each other.
			j := i
			for j > 0 && isSafekeeper(st.Procs[j-1]) {
				j--
			}
			errs = append(errs, stopAll(st.Procs[j:i+1], ProcStopTimeout)...)
			i = j
			continue
		}
		if p.Name != "compute" {
			if err := p.Stop(ProcStopTimeout); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := c.stopCompute(ctx, p, progress); err != nil {
			errs = append(errs, err)
		}
		// An agent that had to be killed leaves its FUSE mount behind
		// (and, killed while it waited on that mount, cannot exit until
		// MountpointCleanup aborts the mount's connection).
		if err := fusefs.MountpointCleanup(c.postgres().DataDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isSafekeeper tells a safekeeper's process from the others.
func isSafekeeper(p Proc) bool { return strings.HasPrefix(p.Name, "safekeeper") }

// stopAll stops procs at once, each with timeout, and returns their errors.
func stopAll(procs []Proc, timeout time.Duration) []error {
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Stop(timeout)
		}()
	}
	wg.Wait()
	return errs
}

// safekeepersAnswering counts the safekeepers that answer a status request
// within two seconds.
func (c *Cluster) safekeepersAnswering(ctx context.Context) int {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n := 0
	for i := range c.safekeeperIDs() {
		cl, err := server.Dial(c.safekeeperAddr(i))
		if err != nil {
			continue
		}
		if _, err := cl.Status(qctx); err == nil {
			n++
		}
		cl.Close()
	}
	return n
}
