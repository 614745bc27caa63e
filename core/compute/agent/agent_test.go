package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/internal/pgshm"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/pstest"
	"github.com/stratadb/strata/plugins/cache/lfc"
	"github.com/stratadb/strata/plugins/cache/sharedbuffers"
	"github.com/stratadb/strata/sdk/pg"
)

// rig is everything a compute needs, in this process: a pageserver and
// three safekeepers on loopback ports.
type rig struct {
	t       *testing.T
	dir     string
	psAddr  string
	skAddrs []string
	port    int
	replPW  string
	stopAll func()
	// restartPS stops the pageserver and starts it again on the same data
	// and address: a new incarnation.
	restartPS func()
}

func skipUnlessRig(t *testing.T) {
	t.Helper()
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("the FUSE mount needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
}

func startRig(t *testing.T) *rig {
	t.Helper()
	skipUnlessRig(t)
	dir, err := os.MkdirTemp("", "strata-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	r := &rig{t: t, dir: dir, port: pgtest.FreePort(t), replPW: "replpw"}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)

	cfg := pageserver.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "pageserver")
	var psMu sync.Mutex
	var stopServer func()
	servePS := func(addr string) {
		a, stop := pstest.Serve(t, cfg, pageserver.Deps{Log: log}, addr)
		psMu.Lock()
		r.psAddr, stopServer = a, stop
		psMu.Unlock()
	}
	servePS("127.0.0.1:0")
	stopPS := func() {
		psMu.Lock()
		defer psMu.Unlock()
		stopServer()
	}
	r.restartPS = func() {
		stopPS()
		servePS(r.psAddr)
	}

	for i := 0; i < 3; i++ {
		r.skAddrs = append(r.skAddrs, pgtest.FreeAddr(t))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, addr := range r.skAddrs {
		c := safekeeper.DefaultConfig()
		c.ID = fmt.Sprintf("sk%d", i+1)
		c.DataDir = filepath.Join(dir, c.ID)
		c.ListenAddr = addr
		c.ReconnectDelay = 100 * time.Millisecond
		c.Postgres = fmt.Sprintf("postgres://strata_repl:%s@127.0.0.1:%d/postgres?sslmode=disable", r.replPW, r.port)
		for j, p := range r.skAddrs {
			if j != i {
				c.Peers = append(c.Peers, p)
			}
		}
		n, err := safekeeper.New(c, safekeeper.Deps{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Listen(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); n.Run(ctx) }()
	}
	r.stopAll = func() {
		cancel()
		wg.Wait()
		stopPS()
		if t.Failed() && os.Getenv("STRATA_KEEP_FAILED") != "" {
			t.Logf("kept the test folder %s (STRATA_KEEP_FAILED)", dir)
			return
		}
		os.RemoveAll(dir)
	}
	t.Cleanup(r.stopAll)
	return r
}

// agentConfig is a compute on the rig with its own mountpoint and scratch
// folder under name.
func (r *rig) agentConfig(name, strategy string) Config {
	return Config{
		Pageserver: r.psAddr, Timeline: pg.TimelineID{0xA6, 0xE7}, Safekeepers: r.skAddrs,
		ComputeID: name, Mountpoint: filepath.Join(r.dir, name, "pgdata"), Scratch: filepath.Join(r.dir, name, "scratch"),
		Port: r.port, Password: "pw", ReplUser: "strata_repl", ReplPassword: r.replPW,
		Cache:      CacheConfig{Strategy: strategy, MemoryBudget: 128 << 20, LFC: lfc.DefaultConfig(), SharedBuffers: sharedbuffers.DefaultConfig()},
		FeedCommit: true, StartTimeout: 3 * time.Minute,
		Settings: map[string]string{"checkpoint_timeout": "'30s'"},
		Log:      zerolog.New(zerolog.NewTestWriter(r.t)).Level(zerolog.InfoLevel).With().Str("agent", name).Logger(),
	}
}

// running is an agent whose Run goroutine is going.
type running struct {
	a      *Agent
	cancel context.CancelFunc
	done   chan error
	url    string
}

func runAgent(t *testing.T, cfg Config) *running {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	r := &running{a: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx, func(u string) { ready <- u }) }()
	t.Cleanup(func() {
		r.stop(t)
		fusefs.MountpointCleanup(cfg.Mountpoint)
	})
	select {
	case r.url = <-ready:
	case err := <-r.done:
		r.done <- err
		t.Fatalf("agent %s: %v", cfg.ComputeID, err)
	case <-time.After(4 * time.Minute):
		t.Fatalf("agent %s not ready", cfg.ComputeID)
	}
	return r
}

func (r *running) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("agent stop: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Error("agent did not stop")
	}
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v string
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func exec(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func amcheck(t *testing.T, cfg Config) {
	t.Helper()
	cmd, err := pgtest.Command("pg_amcheck", "-h", filepath.Join(cfg.Scratch, "sock"), "-p", strconv.Itoa(cfg.Port), "-U", "postgres",
		"--all", "--install-missing", "--heapallindexed", "--rootdescend")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	// Exit status 0 means no corruption; anything printed besides the
	// notices of --install-missing is a finding too.
	var findings []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" && !strings.HasPrefix(l, "NOTICE:") {
			findings = append(findings, l)
		}
	}
	if err != nil || len(findings) > 0 {
		t.Fatalf("pg_amcheck: %v\n%s", err, out)
	}
}

// TestAgentLifecycle: a new cluster (initdb into the mount), idle
// checkpoints that must not hang (exact W), a kill -9 of the postmaster
// that the agent repairs by a restart from storage, a clean stop, and a
// second compute on new, empty folders (the first machine gone) that serves
// the same data: its cold start is logged.
func TestAgentLifecycle(t *testing.T) {
	r := startRig(t)
	cfg1 := r.agentConfig("c1", StrategyLFC)
	c1 := runAgent(t, cfg1)
	rep := c1.a.Report()
	t.Logf("first start (initdb included): %s", rep.ColdStart)
	exec(t, c1.url, "CREATE TABLE ledger (id int PRIMARY KEY, v text)")
	exec(t, c1.url, "INSERT INTO ledger SELECT g, 'v' || g FROM generate_series(1, 1000) g")
	// Two checkpoints on an idle Postgres: each fsync waits for the
	// safekeepers' commit LSN to reach W, which must stop at the real end
	// of WAL (not at the end of the zero-padded WAL page).
	for i := 0; i < 2; i++ {
		t0 := time.Now()
		exec(t, c1.url, "CHECKPOINT")
		if d := time.Since(t0); d > 30*time.Second {
			t.Fatalf("idle CHECKPOINT %d took %s", i, d)
		}
		t.Logf("idle CHECKPOINT %d: %s", i, time.Since(t0))
		time.Sleep(300 * time.Millisecond)
	}
	if rep := c1.a.Report(); rep.W == 0 || rep.Durable == 0 {
		t.Fatalf("after checkpoints: W %s, durable %s", rep.W, rep.Durable)
	}

	// kill -9 of the postmaster: the agent restarts Postgres from storage.
	pid := c1.a.PostmasterPID()
	shm := sharedMemoryOf(t, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		rep := c1.a.Report()
		if rep.Restarts == 1 && rep.State == "running" && c1.a.PostmasterPID() != pid {
			t.Logf("restart after kill -9: %s (term %d, E %s)", rep.ColdStart, rep.Term, rep.DurableEnd)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restarted: %+v", rep)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := query(t, c1.url, "SELECT count(*)::text FROM ledger"); n != "1000" {
		t.Fatalf("after the crash: %s rows", n)
	}
	// The new postmaster found the killed one's shared memory by PGDATA's
	// inode and removed it, dynamic segments included.
	for _, left := range shm.left() {
		t.Errorf("the killed postmaster's %s is still there", left)
	}
	exec(t, c1.url, "INSERT INTO ledger SELECT g, 'w' || g FROM generate_series(1001, 1500) g")
	amcheck(t, cfg1)
	c1.stop(t)
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), cfg1.Mountpoint) {
		t.Fatal("still mounted after stop")
	}

	// A second compute on new, empty folders: storage alone.
	cfg2 := r.agentConfig("c2", StrategySharedBuffers)
	c2 := runAgent(t, cfg2)
	rep2 := c2.a.Report()
	t.Logf("cold start on an empty folder: %s (term %d, E %s)", rep2.ColdStart, rep2.Term, rep2.DurableEnd)
	if n := query(t, c2.url, "SELECT count(*)::text || ' ' || sum(id)::text FROM ledger"); n != "1500 1125750" {
		t.Fatalf("second compute: %s", n)
	}
	amcheck(t, cfg2)
	if got := query(t, c2.url, "SHOW shared_buffers"); got != "96MB" {
		t.Errorf("shared-buffers strategy: shared_buffers = %s, want 96MB (75%% of 128 MiB)", got)
	}
}

// TestRestartOnLostPageWrites: the pageserver restarts while the compute
// holds a page write that is not yet durable there. The Backend notices the
// new incarnation on its next answer and uses no read from it, and the
// agent restarts Postgres at once from storage (not at its next fsync);
// the committed data is all there and pg_amcheck finds nothing.
func TestRestartOnLostPageWrites(t *testing.T) {
	r := startRig(t)
	cfg := r.agentConfig("c1", StrategyLFC)
	c := runAgent(t, cfg)
	exec(t, c.url, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(t, c.url, "INSERT INTO t SELECT generate_series(1, 1000)")
	exec(t, c.url, "CHECKPOINT")

	// A page write at a WAL position the commit LSN will not reach: the
	// pageserver holds it pending. Its relation is one Postgres does not
	// know.
	ctx := context.Background()
	c.a.mu.Lock()
	be := c.a.be
	c.a.mu.Unlock()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 4000000000}
	w := pg.LSN(1) << 40
	if err := be.CreateRel(ctx, rel, w); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, pg.BlockSize)
	page[100] = 7
	if err := be.WritePage(ctx, rel.Page(0), page, w); err != nil {
		t.Fatal(err)
	}
	if err := be.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if err := be.Lost(); err != nil {
		t.Fatalf("lost before the restart: %v", err)
	}

	before := c.a.Report().Restarts
	r.restartPS()
	t0 := time.Now()
	// The first answer of the new pageserver to this Backend (a read
	// here) shows the loss: the read fails instead of returning what the
	// new pageserver has.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := be.ReadPage(ctx, rel.Page(0), 0, page)
		if errors.Is(err, psbackend.ErrLost) || errors.Is(err, psbackend.ErrClosed) {
			break
		}
		if err == nil {
			t.Fatalf("read after the pageserver restart returned a page (byte %d), want ErrLost", page[100])
		}
		if time.Now().After(deadline) {
			t.Fatalf("read after the pageserver restart: %v, want ErrLost", err)
		}
	}
	// Well before the next checkpoint (checkpoint_timeout is 30 s on the
	// rig), whose fsync would fail and make Postgres PANIC anyway.
	for deadline := time.Now().Add(10 * time.Second); c.a.Report().Restarts == before; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Postgres not restarted 10 s after the pageserver lost a page write (state %s)", c.a.Report().State)
		}
	}
	var n string
	for deadline := time.Now().Add(3 * time.Minute); n != "1000"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("rows after the restart: %q", n)
		}
		n = tryQuery(c.url, "SELECT count(*) FROM t")
	}
	t.Logf("Postgres restarted and serving %s after the pageserver restart", time.Since(t0).Round(time.Millisecond))
	exec(t, c.url, "INSERT INTO t VALUES (1001)")
	amcheck(t, cfg)
}

// tryQuery returns the first column of sql's first row, or "" on any error.
func tryQuery(url, sql string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return ""
	}
	defer conn.Close(context.Background())
	var v string
	if conn.QueryRow(ctx, sql).Scan(&v) != nil {
		return ""
	}
	return v
}

// TestNewClusterWALOnFUSE: with compute.pg_wal fuse, initdb runs on the
// mount (not on local scratch and copied: see Agent.initdb), and the new
// cluster's pg_control and catalog are durable: a clean stop and a second
// compute on new, empty folders find the table and its rows.
func TestNewClusterWALOnFUSE(t *testing.T) {
	r := startRig(t)
	cfg1 := r.agentConfig("c1", StrategySharedBuffers)
	cfg1.PGWal = PGWalFUSE
	c1 := runAgent(t, cfg1)
	if fi, err := os.Lstat(filepath.Join(cfg1.Mountpoint, "pg_wal")); err != nil || !fi.IsDir() {
		t.Fatalf("pg_wal on the mount: %v, %v (want a folder, not a link)", fi, err)
	}
	exec(t, c1.url, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(t, c1.url, "INSERT INTO t SELECT generate_series(1, 500)")
	c1.stop(t)

	cfg2 := r.agentConfig("c2", StrategySharedBuffers)
	cfg2.PGWal = PGWalFUSE
	c2 := runAgent(t, cfg2)
	if n := query(t, c2.url, "SELECT count(*)::text || ' ' || sum(id)::text FROM t"); n != "500 125250" {
		t.Fatalf("second compute: %s", n)
	}
	amcheck(t, cfg2)
}

// postmasterShm is the shared memory a postmaster holds: its System V
// segment and the dynamic shared memory files it maps.
type postmasterShm struct {
	seg   pgshm.Segment
	files []string
}

// sharedMemoryOf finds pid's System V segment (pgshm.Of) and its mapped
// /dev/shm/PostgreSQL.* files from /proc/pid/maps.
func sharedMemoryOf(t *testing.T, pid int) postmasterShm {
	t.Helper()
	seg, err := pgshm.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	s := postmasterShm{seg: seg}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.Index(line, "/dev/shm/PostgreSQL."); i >= 0 && !seen[line[i:]] {
			seen[line[i:]] = true
			s.files = append(s.files, line[i:])
		}
	}
	if len(s.files) == 0 {
		t.Fatalf("postmaster %d maps no dynamic shared memory", pid)
	}
	return s
}

// left names what of s still exists.
func (s postmasterShm) left() []string {
	var out []string
	if ok, err := s.seg.Exists(); ok || err != nil {
		out = append(out, fmt.Sprintf("System V segment %d (%v)", s.seg.ShmID, err))
	}
	for _, f := range s.files {
		if _, err := os.Stat(f); err == nil {
			out = append(out, f)
		}
	}
	return out
}
