package safekeeper

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// skprocBinary builds core/safekeeper/internal/skproc once per test run.
func skprocBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "strata-skproc-")
		if err != nil {
			buildErr = err
			return
		}
		// Postgres (another OS user) runs it as restore_command.
		if err := os.Chmod(dir, 0o755); err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "skproc")
		out, err := exec.Command("go", "build", "-o", binPath, "./internal/skproc").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build skproc: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// procCluster is Postgres plus three safekeeper processes.
type procCluster struct {
	t       testing.TB
	srv     *pgtest.Server
	bin     string
	addrs   []string
	dirs    []string
	archive string
	mu      sync.Mutex
	cmds    []*exec.Cmd
	// args are extra flags for every safekeeper (the later of two equal
	// flags wins).
	args []string
}

func startProcCluster(t testing.TB, args ...string) *procCluster {
	c := &procCluster{t: t, bin: skprocBinary(t), archive: t.TempDir(), args: args}
	c.srv = testpg.Start(t, testpg.Options{Sync: "ANY 2 (sk1, sk2, sk3)"})
	for i := 0; i < 3; i++ {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t)))
		c.dirs = append(c.dirs, t.TempDir())
		c.cmds = append(c.cmds, nil)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pg_stat_replication: %s", c.srv.QueryString("postgres",
				"SELECT coalesce(string_agg(application_name || ' ' || state || ' ' || sync_state, ', '), 'none') FROM pg_stat_replication"))
		}
		for i := range c.cmds {
			c.kill(i, syscall.SIGTERM)
		}
		if t.Failed() {
			// What the safekeepers said, before the folders go.
			for i := range c.dirs {
				p := filepath.Join(c.dirs[i], "..", fmt.Sprintf("sk%d.log", i+1))
				if b, err := os.ReadFile(p); err == nil {
					t.Logf("last lines of %s:\n%s", p, tail(string(b), 30))
				}
			}
		}
	})
	for i := 0; i < 3; i++ {
		c.start(i)
	}
	return c
}

func (c *procCluster) start(i int) {
	c.t.Helper()
	var peers []string
	for j, a := range c.addrs {
		if j != i {
			peers = append(peers, a)
		}
	}
	cmd := exec.Command(c.bin, "--id", fmt.Sprintf("sk%d", i+1), "--data-dir", c.dirs[i], "--listen", c.addrs[i],
		"--postgres", testpg.ReplConnString(c.srv), "--peers", strings.Join(peers, ","),
		"--status-interval", "200ms", "--reconnect-delay", "200ms", "--control-sync-interval", "200ms",
		"--archive", "--archive-dir", c.archive, "--archive-keep-local", "--archive-partial-after", "1s")
	cmd.Args = append(cmd.Args, c.args...)
	logf, err := os.OpenFile(filepath.Join(c.dirs[i], "..", fmt.Sprintf("sk%d.log", i+1)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.cmds[i] = cmd
	c.mu.Unlock()
}

// kill signals exactly the process this cluster started for safekeeper i
// and waits for it.
func (c *procCluster) kill(i int, sig syscall.Signal) {
	c.mu.Lock()
	cmd := c.cmds[i]
	c.cmds[i] = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (c *procCluster) status(i int) (server.Status, error) {
	cl, err := server.Dial(c.addrs[i])
	if err != nil {
		return server.Status{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return cl.Status(ctx)
}

func (c *procCluster) waitFlush(i int, lsn pg.LSN) server.Status {
	c.t.Helper()
	var st server.Status
	testpg.WaitFor(c.t, 90*time.Second, fmt.Sprintf("sk%d flush >= %s", i+1, lsn), func() bool {
		var err error
		st, err = c.status(i)
		return err == nil && st.FlushLSN >= lsn
	})
	return st
}

// compareAll waits until every safekeeper holds Postgres' WAL end and checks
// its bytes against pg_wal.
func (c *procCluster) compareAll() {
	c.t.Helper()
	end := testpg.FlushLSN(c.t, c.srv)
	for i := range c.addrs {
		st := c.waitFlush(i, end)
		n := testpg.CompareWAL(c.t, c.srv, filepath.Join(c.dirs[i], "pg_wal"), st.StartLSN, st.FlushLSN)
		c.t.Logf("sk%d: %s..%s (%d MiB) equals pg_wal", i+1, st.StartLSN, st.FlushLSN, n>>20)
	}
}

// ledger commits one row per transaction, each with a unique payload, and
// records the payloads of acknowledged commits.
type ledger struct {
	mu     sync.Mutex
	acked  []string
	errs   []error
	cancel context.CancelFunc
	done   chan struct{}
}

func startLedger(t testing.TB, srv *pgtest.Server, clients int) *ledger {
	srv.Exec("postgres", "CREATE TABLE IF NOT EXISTS ledger (id bigserial PRIMARY KEY, payload text NOT NULL)")
	ctx, cancel := context.WithCancel(context.Background())
	l := &ledger{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	run := fmt.Sprintf("%08x", time.Now().UnixNano()&0xffffffff)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
			if err != nil {
				l.mu.Lock()
				l.errs = append(l.errs, err)
				l.mu.Unlock()
				return
			}
			defer conn.Close(context.Background())
			for i := 0; ctx.Err() == nil; i++ {
				p := fmt.Sprintf("ledger-%s-%02d-%08d.", run, c, i)
				if _, err := conn.Exec(ctx, "INSERT INTO ledger (payload) VALUES ($1)", p); err != nil {
					if ctx.Err() == nil {
						l.mu.Lock()
						l.errs = append(l.errs, err)
						l.mu.Unlock()
					}
					return
				}
				l.mu.Lock()
				l.acked = append(l.acked, p)
				l.mu.Unlock()
			}
		}(c)
	}
	go func() { wg.Wait(); close(l.done) }()
	t.Cleanup(l.stop)
	return l
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

func (l *ledger) stop() {
	l.cancel()
	<-l.done
}

var payloadRE = regexp.MustCompile(`ledger-[0-9a-f]{8}-\d{2}-\d{8}\.`)

// payloadsIn returns the ledger payloads present in WAL files of dir
// between from and to.
func payloadsIn(t *testing.T, dir string, from, to pg.LSN) map[string]bool {
	t.Helper()
	const seg = pg.WALSegmentSize
	var all []byte
	for p := from; p < to; {
		no := uint64(p) / seg
		end := min(to, pg.LSN((no+1)*seg))
		f, err := os.Open(filepath.Join(dir, "pg_wal", fmt.Sprintf("%08X%08X%08X", 1, uint32(no>>8), uint32(no&0xff))))
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, end-p)
		if _, err := f.ReadAt(b, int64(uint64(p)%seg)); err != nil {
			t.Fatal(err)
		}
		f.Close()
		// Drop the page headers so that a payload cut by a page boundary
		// reads whole: 40 bytes on a segment's first page, 24 on others.
		for off := 0; off < len(b); off += walstore.BlockSize {
			page := b[off:min(off+walstore.BlockSize, len(b))]
			hdr := 24
			if (uint64(p)+uint64(off))%seg == 0 {
				hdr = 40
			}
			if len(page) > hdr {
				all = append(all, page[hdr:]...)
			}
		}
		p = end
	}
	out := map[string]bool{}
	for _, m := range payloadRE.FindAll(all, -1) {
		out[string(m)] = true
	}
	return out
}

// storeRange opens the store of a stopped safekeeper and returns the WAL
// range it holds durably.
func storeRange(t *testing.T, dir string) (pg.LSN, pg.LSN) {
	t.Helper()
	st, err := walstore.Open(walstore.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.StartLSN(), st.FlushLSN()
}

func TestKillOneSafekeeperDuringPgbench(t *testing.T) {
	c := startProcCluster(t)
	waitSync(t, c.srv, 3)
	if out, err := c.srv.Pgbench("-i", "-s", "2", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	dur := 9
	if longTests() {
		dur = 30
	}
	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := c.srv.Pgbench("-c", "8", "-j", "2", "-T", fmt.Sprint(dur), "-P", "1", "postgres")
		res <- result{out, err}
	}()
	time.Sleep(3 * time.Second)
	commits := func() int {
		var n int
		fmt.Sscan(c.srv.QueryString("postgres", "SELECT count(*)::text FROM pgbench_history"), &n)
		return n
	}
	c.kill(1, syscall.SIGKILL)
	before := commits()
	t.Logf("killed sk2 (kill -9) after %d pgbench transactions", before)
	// pgbench keeps committing with two safekeepers.
	testpg.WaitFor(t, 20*time.Second, "commits with sk2 down", func() bool { return commits() > before+100 })
	time.Sleep(2 * time.Second)
	c.start(1)
	t.Log("restarted sk2")
	r := <-res
	if r.err != nil {
		t.Fatalf("pgbench failed: %v\n%s", r.err, r.out)
	}
	if !strings.Contains(r.out, "number of failed transactions: 0") {
		t.Fatalf("pgbench had failures:\n%s", r.out)
	}
	t.Logf("pgbench:\n%s", tail(r.out, 5))
	// A second with no commit is a stall, except while the clients were
	// still connecting (a loaded CI machine took 963 ms for its eight,
	// and pgbench's first second showed 0.0 tps).
	var connMS, at float64
	for _, line := range strings.Split(r.out, "\n") {
		fmt.Sscanf(line, "initial connection time = %f ms", &connMS)
	}
	for _, line := range strings.Split(r.out, "\n") {
		if _, err := fmt.Sscanf(line, "progress: %f s", &at); err != nil {
			continue
		}
		if strings.Contains(line, " 0.0 tps") && at*1000 > connMS+1000 {
			t.Errorf("pgbench stalled: %s", line)
		}
	}
	c.compareAll()
}

func TestKillTwoSafekeepersBlocksCommits(t *testing.T) {
	c := startProcCluster(t)
	waitSync(t, c.srv, 3)
	l := startLedger(t, c.srv, 4)
	testpg.WaitFor(t, 30*time.Second, "ledger commits", func() bool { return l.count() > 200 })
	c.kill(0, syscall.SIGKILL)
	c.kill(1, syscall.SIGKILL)
	t.Log("killed sk1 and sk2 (kill -9)")
	// In-flight commits may finish in a short moment; after that, nothing
	// is acknowledged with one safekeeper.
	time.Sleep(500 * time.Millisecond)
	blocked := l.count()
	time.Sleep(3 * time.Second)
	if n := l.count(); n != blocked {
		t.Fatalf("%d commits were acknowledged with only one safekeeper alive", n-blocked)
	}
	// With one safekeeper back, commits resume.
	c.start(0)
	testpg.WaitFor(t, 60*time.Second, "commits to resume after sk1 restarts", func() bool { return l.count() > blocked+200 })
	t.Logf("commits: %d before the kills, blocked at %d, resumed to %d", blocked, blocked, l.count())
	l.stop()
	if len(l.errs) > 0 {
		t.Fatalf("ledger errors: %v", l.errs)
	}
	// Every acknowledged commit is in the WAL of at least two safekeepers
	// (sk2 is still down: its files hold what it had at the kill).
	end := testpg.FlushLSN(t, c.srv)
	c.waitFlush(0, end)
	c.waitFlush(2, end)
	sets := make([]map[string]bool, 3)
	for i := range sets {
		var from, to pg.LSN
		if i == 1 {
			// Read sk2's durable range from its control file and checksums.
			from, to = storeRange(t, c.dirs[i])
		} else {
			st, err := c.status(i)
			if err != nil {
				t.Fatal(err)
			}
			from, to = st.StartLSN, st.FlushLSN
		}
		sets[i] = payloadsIn(t, c.dirs[i], from, to)
	}
	l.mu.Lock()
	acked := append([]string(nil), l.acked...)
	l.mu.Unlock()
	missing := 0
	for _, p := range acked {
		n := 0
		for _, s := range sets {
			if s[p] {
				n++
			}
		}
		if n < 2 {
			missing++
			if missing < 5 {
				t.Errorf("acknowledged payload %s is on %d safekeepers", p, n)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged commits are not on two safekeepers", missing, len(acked))
	}
	// And Postgres has every acknowledged row (it may have a few more: those
	// whose acknowledgement the stopped clients never received).
	if got := c.srv.QueryString("postgres", "SELECT count(*)::text FROM ledger WHERE payload = ANY($1)", acked); got != fmt.Sprint(len(acked)) {
		t.Fatalf("ledger table has %s of the %d acknowledged rows", got, len(acked))
	}
	t.Logf("all %d acknowledged commits are on >= 2 safekeepers", len(acked))
	c.start(1)
	c.compareAll()
}
