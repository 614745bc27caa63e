package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/testbin"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
)

// consecutiveFree finds n consecutive free ports below the kernel's
// ephemeral range, claimed until the test ends (pgtest.FreePorts).
func consecutiveFree(t *testing.T, n int) int {
	t.Helper()
	return pgtest.FreePorts(t, n)
}

// freePorts finds n free ports below the ephemeral range.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		ports = append(ports, consecutiveFree(t, 1))
	}
	return ports
}

func itoa(i int) string { return strconv.Itoa(i) }

// sleeperEnv makes the test binary, run again by a test, sleep instead of
// testing: a stand-in process whose command line the test chooses.
const sleeperEnv = "STRATA_TEST_SLEEPER"

func TestMain(m *testing.M) {
	if os.Getenv(sleeperEnv) != "" {
		time.Sleep(2 * time.Minute)
		os.Exit(0)
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// newTestCluster makes a cluster in a new folder on free ports, stopped and
// removed at cleanup. The longer whole-cluster tests call t.Parallel first:
// they run two at a time (as many as GOMAXPROCS, the cores), each with its
// own folder, ports and processes, after the tests that set environment
// variables for their cluster's processes (t.Setenv), which run alone.
func newTestCluster(t *testing.T) (*Cluster, *config.Config) {
	t.Helper()
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/postgres"); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	dir, err := os.MkdirTemp("", "strata-cluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	cfg := config.Default()
	cfg.Cluster.DataDir = filepath.Join(dir, "state")
	cfg.Cluster.SafekeeperPort = consecutiveFree(t, 4) // 3 safekeepers and the pageserver
	cfg.Cluster.MetricsPort = 0
	cfg.Compute.Port = freePorts(t, 1)[0]
	cfg.ObjectStore.FS.Root = filepath.Join(dir, "objects")
	cfgPath := filepath.Join(dir, "strata.yaml")
	y := "cluster:\n  data_dir: " + cfg.Cluster.DataDir + "\n  safekeeper_port: " + itoa(cfg.Cluster.SafekeeperPort) +
		"\n  metrics_port: 0\ncompute:\n  port: " + itoa(cfg.Compute.Port) + "\n  memory_budget: 256MB\nobjectstore:\n  fs:\n    root: " + cfg.ObjectStore.FS.Root + "\n"
	if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := config.LoadEnv(cfgPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(loaded, testbin.Strata(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logTails(t, dir, 40)
		}
		c.Down(context.Background(), func(string) {})
		if t.Failed() && os.Getenv("STRATA_KEEP_FAILED") != "" {
			t.Logf("kept the cluster folder %s (STRATA_KEEP_FAILED)", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return c, loaded
}

// logTails logs the last n lines of every process log under dir, so that
// a failure in CI shows what the processes said before the folder is
// removed.
func logTails(t *testing.T, dir string, n int) {
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		switch d.Name() {
		case "compute.log", "postgres.log", "pageserver.log", "safekeeper.log":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		t.Logf("last %d lines of %s:\n%s", len(lines), path, strings.Join(lines, "\n"))
		return nil
	})
}

func TestUpDownUpKeepsData(t *testing.T) {
	t.Parallel()
	c, cfg := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Two ups at once (two terminals, a script run twice): they take
	// turns on the folder's lock, the second finds the first's cluster
	// running and only prints its URL.
	type upResult struct {
		url  string
		said []string
		err  error
	}
	results := make(chan upResult, 2)
	for i := 0; i < 2; i++ {
		go func() {
			var r upResult
			r.url, r.err = c.Up(ctx, func(s string) { r.said = append(r.said, s) })
			results <- r
		}()
	}
	r1, r2 := <-results, <-results
	if r1.err != nil || r2.err != nil || r1.url != r2.url {
		t.Fatalf("two ups at once: %q %v / %q %v", r1.url, r1.err, r2.url, r2.err)
	}
	waited := 0
	for _, r := range []upResult{r1, r2} {
		t.Log(strings.Join(r.said, "\n"))
		if len(r.said) > 0 && strings.HasPrefix(r.said[0], "waiting for another strata up or down") {
			waited++
			if r.said[len(r.said)-1] != "cluster already running (started "+mustState(t, c).Started+")" {
				t.Errorf("the up that waited said %q, want that the cluster runs", r.said)
			}
		}
	}
	if waited != 1 {
		t.Fatalf("%d of two concurrent ups waited for the other, want 1", waited)
	}
	url := r1.url
	if !strings.HasPrefix(url, "postgres://") {
		t.Fatalf("url %q", url)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int primary key, v text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	streaming := 0
	for _, p := range st.Procs {
		if p.State == "streaming" {
			streaming++
		}
		if !p.Alive {
			t.Errorf("%s not alive", p.Name)
		}
	}
	if streaming < 2 || st.CurrentLSN == 0 {
		t.Fatalf("status: %+v", st)
	}
	// The safekeepers archive finished segments to the configured store.
	exec1(t, ctx, url, "SELECT pg_switch_wal()")
	exec1(t, ctx, url, "INSERT INTO t VALUES (1001, 'after switch')")
	store, err := fs.New(cfg.ObjectStore.FS, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	archived := 0
	for deadline := time.Now().Add(60 * time.Second); archived == 0 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		store.List(ctx, "wal/", func(o objectstore.ObjectInfo) error {
			if o.Size == 16<<20 {
				archived++
			}
			return nil
		})
	}
	if archived == 0 {
		t.Fatal("no full WAL segment archived to the object store within 60s")
	}
	// A second up on a running cluster only prints the URL.
	if url2, err := c.Up(ctx, func(string) {}); err != nil || url2 != url {
		t.Fatalf("second up: %q %v", url2, err)
	}
	// The state file lost while the cluster runs (an operator's rm):
	// up refuses to start a second set of processes, down finds the
	// running ones by their command lines and stops them cleanly.
	if err := os.Remove(c.statePath()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Up(ctx, func(string) {}); err == nil || !strings.Contains(err.Error(), "5 processes") {
		t.Fatalf("up without the state file of a running cluster: %v, want a refusal", err)
	}
	var said []string
	if err := c.Down(ctx, func(s string) { said = append(said, s) }); err != nil {
		t.Fatal(err)
	}
	if len(said) == 0 || !strings.Contains(said[0], "5 processes") {
		t.Fatalf("down without the state file said %q, want the 5 processes it found", said)
	}
	for _, p := range st.Procs {
		if (Proc{PID: p.PID}).Alive() && syscall.Kill(p.PID, 0) == nil {
			t.Errorf("%s (pid %d) still running after down", p.Name, p.PID)
		}
	}
	if _, err := c.Status(ctx); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("status after down: %v", err)
	}
	url, err = c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1001 {
		t.Fatalf("after restart: %d rows, %v", n, err)
	}
	conn.Close(ctx)
	exec1(t, ctx, url, "INSERT INTO t VALUES (1002, 'before the folder is lost')")
	upWithoutPageserverFolder(t, ctx, c)
	url, err = c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, url, "SELECT count(*)::text FROM t"); got != "1002" {
		t.Fatalf("after a start on an empty pageserver folder: %s rows, want 1002", got)
	}
}

func mustState(t *testing.T, c *Cluster) *State {
	t.Helper()
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// upWithoutPageserverFolder stops c and deletes the pageserver's folder:
// strata down published every timeline to the object store, so the next
// start serves everything from it.
func upWithoutPageserverFolder(t *testing.T, ctx context.Context, c *Cluster) {
	t.Helper()
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.dataDir, "pageserver")
	if b, err := os.ReadFile(filepath.Join(dir, "pageserver.log")); err != nil || !strings.Contains(string(b), "every timeline published to the object store") {
		t.Fatalf("the pageserver's log does not say it published everything at its stop (%v):\n%s", err, tail(filepath.Join(dir, "pageserver.log"), 4096))
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}

func TestCommitsNeedAQuorum(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int)")
	st, _ := c.readState()
	// Without a quorum the compute's clean stop would wait minutes for
	// durability that cannot come: kill it before the cleanup's down.
	t.Cleanup(func() { killCompute(st) })
	// One safekeeper down: commits go on.
	syscall.Kill(st.Procs[0].PID, syscall.SIGKILL)
	exec1(t, ctx, url, "INSERT INTO t VALUES (1)")
	// Two down: a commit must not be acknowledged. The kill goes to the
	// supervisor's process group, so that its safekeeper dies with it and
	// not a moment later by the parent-death signal, and the commit is
	// sent once Postgres streams to one safekeeper only: before, a commit
	// sent at once could be acknowledged by the second safekeeper in its
	// last milliseconds (seen once in CI).
	syscall.Kill(-st.Procs[1].PID, syscall.SIGKILL)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Postgres still has %d walsenders 30 s after two of three safekeepers were killed", n)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if _, err := conn.Exec(short, "INSERT INTO t VALUES (2)"); err == nil {
		t.Fatal("a commit was acknowledged with only one safekeeper")
	}
	conn.Close(ctx)
	// strata down without a quorum stops the compute at once, saying why,
	// and the acknowledged row survives the next start.
	var lines []string
	if err := c.Down(ctx, func(s string) { lines = append(lines, s) }); err != nil {
		t.Fatalf("down without a quorum: %v (%q)", err, lines)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "only 1 of 3 safekeepers answer") {
		t.Fatalf("down did not say that the quorum was lost: %q", lines)
	}
	url, err = c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	conn2, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	var n int
	if err := conn2.QueryRow(ctx, "SELECT count(*) FROM t WHERE id = 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the acknowledged row after down and up: count %d, %v", n, err)
	}
}

// TestSafekeeperRejoinsWithOneOtherUp: with one safekeeper down, another
// that comes back without its replication slot must be able to create the
// slot and restore the quorum. Postgres fsyncs a new slot, and a durable
// fsync waits for the quorum, which needs this very safekeeper: the agent
// answers the safekeepers' slot fsyncs once sent (fusefs SendOnlyPath).
// Before that, a commit waited for ever (seen in CI as a flaky
// TestCommitsNeedAQuorum, when the test killed a safekeeper before the
// third one had created its slot).
func TestSafekeeperRejoinsWithOneOtherUp(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	url, st := upWithTable(t, ctx, c)
	sk := func(id string) int {
		for i, p := range st.Procs {
			if p.Name == "safekeeper "+id {
				return i
			}
		}
		t.Fatalf("no safekeeper %s in %+v", id, st.Procs)
		return -1
	}
	sk1, sk3 := sk("sk1"), sk("sk3")
	syscall.Kill(st.Procs[sk1].PID, syscall.SIGKILL)
	syscall.Kill(st.Procs[sk3].PID, syscall.SIGKILL)
	// sk3 comes back without its slot, as a safekeeper whose slot was
	// never made durable before a compute crash.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for {
		_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot('strata_sk3')")
		if err == nil {
			break
		}
		// sk3 was killed before it made its slot (up waits for two of
		// the three safekeepers): it comes back without one all the same.
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42704" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dropping sk3's slot: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // its walsender has not exited yet
	}
	restartSafekeeper(t, c, st, "sk3")
	short, cancelShort := context.WithTimeout(ctx, 90*time.Second)
	defer cancelShort()
	if _, err := conn.Exec(short, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatalf("a commit with sk2 up and sk3 back without its slot: %v", err)
	}
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'strata_sk3'").Scan(&slots); err != nil || slots != 1 {
		t.Fatalf("sk3's slot after its return: %d, %v", slots, err)
	}
}

// TestSafekeeperMissingAtStartJoinsLater: a safekeeper that is down when
// the compute starts misses the election; once it is back the agent brings
// it into the term and into synchronous_standby_names, so the cluster
// survives the loss of another safekeeper. Before, it counted again only
// after the next compute start, and a commit then waited for ever.
func TestSafekeeperMissingAtStartJoinsLater(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, st := upWithTable(t, ctx, c)
	idx, sup, agent := restartWithoutSK3(t, st)
	query := func(sql string) string {
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		defer qcancel()
		conn, err := pgx.Connect(qctx, url)
		if err != nil {
			return ""
		}
		defer conn.Close(context.Background())
		var v string
		if conn.QueryRow(qctx, sql).Scan(&v) != nil {
			return ""
		}
		return v
	}
	waitFor := func(what, sql string, ok func(string) bool) string {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if v := query(sql); ok(v) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 3 minutes (%s); compute log:\n%s", what, query(sql), tail(sup.Log, 4096))
			}
		}
	}
	// The new agent's Postgres: its settings name sk1 and sk2 only.
	names := waitFor("Postgres back after the agent's restart", "SHOW synchronous_standby_names",
		func(v string) bool {
			return v != "" && childPIDs(sup.PID) != nil && !slices.Contains(childPIDs(sup.PID), agent)
		})
	if strings.Contains(names, "sk3") || !strings.Contains(names, "sk1") {
		t.Fatalf("synchronous_standby_names after a start without sk3: %q", names)
	}
	restartSafekeeper(t, c, st, "sk3")
	waitFor("sk3 in synchronous_standby_names", "SHOW synchronous_standby_names", func(v string) bool { return strings.Contains(v, "sk3") })
	waitFor("sk3 streaming", "SELECT state FROM pg_stat_replication WHERE application_name = 'sk3'", func(v string) bool { return v == "streaming" })
	syscall.Kill(st.Procs[idx["safekeeper sk1"]].PID, syscall.SIGKILL)
	short, cancelShort := context.WithTimeout(ctx, 90*time.Second)
	defer cancelShort()
	conn, err := pgx.Connect(short, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(short, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatalf("a commit with sk2 and the returned sk3: %v\n%s\ncompute log:\n%s", err, diagnose(ctx, c, url), tail(sup.Log, 4096))
	}
}

// TestElectedSafekeeperDownBeforeStreaming: the compute restarts while
// sk3 is down and elects sk1 and sk2; sk2 dies before it streams, and sk3
// comes back. The agent brings sk3 into the term while it waits for a
// quorum to stream, so Postgres runs and commits on sk1 and sk3. Before,
// the agent brought late safekeepers in only once Postgres ran, and it
// waited for a quorum that could not come.
func TestElectedSafekeeperDownBeforeStreaming(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, st := upWithTable(t, ctx, c)
	idx, sup, _ := restartWithoutSK3(t, st)
	// sk2 goes down as soon as the new agent has elected sk1 and sk2.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(sup.Log)
		if strings.Contains(string(b), `"term":2,"durable_end"`) && strings.Contains(string(b), `"safekeepers":["sk1","sk2"]`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no election of sk1 and sk2 in term 2 within 2 minutes; compute log:\n%s", tail(sup.Log, 4096))
		}
	}
	syscall.Kill(st.Procs[idx["safekeeper sk2"]].PID, syscall.SIGKILL)
	restartSafekeeper(t, c, st, "sk3")
	short, cancelShort := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelShort()
	for {
		err := execWithin(short, url, 20*time.Second, "INSERT INTO t VALUES (2)")
		if err == nil {
			break
		}
		if short.Err() != nil {
			t.Fatalf("a commit with sk1 and the returned sk3: %v\n%s\ncompute log:\n%s", err, diagnose(ctx, c, url), tail(sup.Log, 4096))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// diagnose says what a commit that does not return may wait for: the
// cluster's status (each process, its LSNs), Postgres' view of each
// walsender and what its busy backends wait on.
func diagnose(ctx context.Context, c *Cluster, url string) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if s, err := c.Status(ctx); err != nil {
		fmt.Fprintf(&b, "status: %v\n", err)
	} else {
		s.Print(&b)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Fprintf(&b, "postgres: %v\n", err)
		return b.String()
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		`SELECT application_name || ' pid ' || pid || ' ' || state || ' ' || sync_state || ' priority ' || sync_priority ||
			' flush ' || coalesce(flush_lsn::text, '-') FROM pg_stat_replication`,
		`SELECT 'backend ' || pid || ' ' || backend_type || ' ' || coalesce(wait_event_type, '-') || '/' || coalesce(wait_event, '-') ||
			' ' || coalesce(left(query, 60), '') FROM pg_stat_activity WHERE state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid()`,
		`SELECT 'current ' || pg_current_wal_lsn() || ' names ' || current_setting('synchronous_standby_names')`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			continue
		}
		for rows.Next() {
			var line string
			if rows.Scan(&line) == nil {
				b.WriteString(line + "\n")
			}
		}
		rows.Close()
	}
	return b.String()
}

// restartWithoutSK3 kills sk3, then the compute agent (kill -9; its
// supervisor starts it again, and the new agent elects without sk3). It
// returns the index of each process in st.Procs by name, the compute's
// supervisor and the PID of the agent it killed.
func restartWithoutSK3(t *testing.T, st *State) (map[string]int, Proc, int) {
	t.Helper()
	idx := map[string]int{}
	var sup Proc
	for i, p := range st.Procs {
		idx[p.Name] = i
		if p.Name == "compute" {
			sup = p
		}
	}
	syscall.Kill(st.Procs[idx["safekeeper sk3"]].PID, syscall.SIGKILL)
	agents := childPIDs(sup.PID)
	if len(agents) != 1 {
		t.Fatalf("supervisor %d has children %v, want one agent", sup.PID, agents)
	}
	syscall.Kill(agents[0], syscall.SIGKILL)
	return idx, sup, agents[0]
}

// upWithTable starts the cluster and creates table t; it returns the
// connection string and the processes. Should the test fail, the compute
// is killed before the cleanup's down (see killCompute).
func upWithTable(t *testing.T, ctx context.Context, c *Cluster) (string, *State) {
	t.Helper()
	url, err := c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int)")
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			killCompute(st)
		}
	})
	return url, st
}

// restartSafekeeper starts safekeeper id again and records the new process
// in the state, so that down stops it.
func restartSafekeeper(t *testing.T, c *Cluster, st *State, id string) {
	t.Helper()
	replPW, err := c.secret("replication.password")
	if err != nil {
		t.Fatal(err)
	}
	n := slices.Index(c.safekeeperIDs(), id)
	i := slices.IndexFunc(st.Procs, func(p Proc) bool { return p.Name == "safekeeper "+id })
	if n < 0 || i < 0 {
		t.Fatalf("no safekeeper %s", id)
	}
	p, err := c.startSafekeeper(n, id, replPW)
	if err != nil {
		t.Fatal(err)
	}
	st.Procs[i] = p
	if err := c.writeState(st); err != nil {
		syscall.Kill(p.PID, syscall.SIGKILL)
		t.Fatal(err)
	}
}

// killCompute kills the compute (the supervisor, whose agent and Postgres
// die with it): without a safekeeper quorum, a clean stop would wait
// minutes for durability that cannot come.
func killCompute(st *State) {
	for _, p := range st.Procs {
		if p.Name == "compute" && p.Alive() {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
}

// execWithin runs one statement on a new connection, connect included
// within d.
func execWithin(ctx context.Context, url string, d time.Duration, sql string, args ...any) error {
	qctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn, err := pgx.Connect(qctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(qctx, sql, args...)
	return err
}

func exec1(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestAgentKill9 is acceptance 3 for the compute agent: with
// full_page_writes=off and the lfc strategy, a client-side ledger runs while the agent process
// is killed with SIGKILL (its Postgres dies with it); `strata up` starts the
// cluster again from storage and every acknowledged row is there. One round
// by default, five with STRATA_LONG_TESTS=1.
func TestAgentKill9(t *testing.T) {
	c, _ := newLFCCluster(t)
	// The agent process reads its config file; the environment overrides it.
	t.Setenv("STRATA_COMPUTE_FULL_PAGE_WRITES", "false")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE ledger (id int PRIMARY KEY)")
	var fpw string
	if conn, err := pgx.Connect(ctx, url); err == nil {
		conn.QueryRow(ctx, "SHOW full_page_writes").Scan(&fpw)
		conn.Close(ctx)
	}
	if fpw != "off" {
		t.Fatalf("full_page_writes = %q, want off", fpw)
	}
	rounds := 1
	if os.Getenv("STRATA_LONG_TESTS") == "1" {
		rounds = 5
	}
	acked := map[int]bool{}
	next := 0
	for round := 1; round <= rounds; round++ {
		stop := make(chan struct{})
		done := make(chan map[int]bool)
		go func(from int) {
			got := map[int]bool{}
			defer func() { done <- got }()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return
			}
			defer conn.Close(context.Background())
			for id := from; ; id++ {
				select {
				case <-stop:
					return
				default:
				}
				qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := conn.Exec(qctx, "INSERT INTO ledger VALUES ($1)", id)
				qcancel()
				if err != nil {
					return
				}
				got[id] = true
			}
		}(next)
		time.Sleep(time.Duration(1000+round*700) * time.Millisecond)
		st, err := c.readState()
		if err != nil {
			t.Fatal(err)
		}
		var agent Proc
		for _, p := range st.Procs {
			if p.Name == "compute" {
				agent = p
			}
		}
		if err := syscall.Kill(agent.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		close(stop)
		got := <-done
		// SIGKILL is asynchronous (an agent serving FUSE takes a moment to
		// die): `strata up` on a still-dying agent finds the cluster running.
		for i := 0; i < 300 && agent.Alive(); i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if agent.Alive() {
			t.Fatalf("round %d: agent pid %d still alive 30 s after SIGKILL", round, agent.PID)
		}
		for id := range got {
			acked[id] = true
			next = max(next, id+1)
		}
		next += 1000
		t0 := time.Now()
		if url, err = c.Up(ctx, func(s string) { t.Log(s) }); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: agent killed with %d rows acknowledged; up again in %s", round, len(got), time.Since(t0).Round(time.Millisecond))
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		have := map[int]bool{}
		rows, err := conn.Query(ctx, "SELECT id FROM ledger")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int
			rows.Scan(&id)
			have[id] = true
		}
		rows.Close()
		conn.Close(ctx)
		for id := range acked {
			if !have[id] {
				t.Fatalf("round %d: acknowledged row %d lost", round, id)
			}
		}
	}
	if len(acked) == 0 {
		t.Fatal("no commit was acknowledged")
	}
}

// childPIDs lists the children of pid (of every thread: the supervisor
// starts its child from a locked thread that need not be the main one).
func childPIDs(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestAgentRestartedBySupervisor: kill -9 of the compute agent itself (the
// child of the supervisor that `strata up` starts with --restart-on-crash)
// brings Postgres back without `strata up`, with the acknowledged rows;
// kill -9 of the supervisor takes its agent down with it.
func TestAgentRestartedBySupervisor(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY)")
	exec1(t, ctx, url, "INSERT INTO t SELECT generate_series(1, 1000)")
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	var sup Proc
	for _, p := range st.Procs {
		if p.Name == "compute" {
			sup = p
		}
	}
	agents := childPIDs(sup.PID)
	if len(agents) != 1 {
		t.Fatalf("supervisor %d has children %v, want one agent", sup.PID, agents)
	}
	old := agents[0]
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var count string
	for deadline := time.Now().Add(3 * time.Minute); count != "1000"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Postgres not back 3 minutes after kill -9 of the agent (count %q); compute log:\n%s", count, tail(sup.Log, 4096))
		}
		if !sup.Alive() {
			t.Fatalf("the supervisor exited after its agent was killed; compute log:\n%s", tail(sup.Log, 4096))
		}
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		if conn, err := pgx.Connect(qctx, url); err == nil {
			var n int64
			if conn.QueryRow(qctx, "SELECT count(*) FROM t").Scan(&n) == nil {
				count = strconv.FormatInt(n, 10)
			}
			conn.Close(context.Background())
		}
		qcancel()
	}
	agents = childPIDs(sup.PID)
	if len(agents) != 1 || agents[0] == old {
		t.Fatalf("after the restart the supervisor has children %v (killed agent %d)", agents, old)
	}
	t.Logf("agent %d killed; agent %d serves the 1000 rows %s later", old, agents[0], time.Since(t0).Round(time.Millisecond))
	exec1(t, ctx, url, "INSERT INTO t VALUES (1001)")

	// kill -9 of the supervisor: its agent dies too (parent-death signal).
	if err := syscall.Kill(sup.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	agent := Proc{PID: agents[0]}
	agent.StartTime, _ = procStartTime(agent.PID)
	for deadline := time.Now().Add(30 * time.Second); agent.Alive(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("agent %d still alive 30 s after kill -9 of its supervisor", agent.PID)
		}
	}
	for i := 0; i < 300 && sup.Alive(); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if url, err = c.Up(ctx, func(s string) { t.Log(s) }); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1001 {
		t.Fatalf("after up: %d rows, %v; want 1001", n, err)
	}
}

// losePageserver kills -9 the pageserver and its supervisor (so nothing
// starts it again) and deletes its folder: the machine it ran on is gone.
func losePageserver(t *testing.T, c *Cluster) {
	t.Helper()
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Procs {
		if p.Name != "pageserver" {
			continue
		}
		kids := childPIDs(p.PID)
		for _, pid := range append([]int{p.PID}, kids...) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for deadline := time.Now().Add(10 * time.Second); p.Alive(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the pageserver's supervisor is alive 10 s after kill -9")
			}
		}
	}
	if err := os.RemoveAll(filepath.Join(c.dataDir, "pageserver")); err != nil {
		t.Fatal(err)
	}
}

// TestPageserverFolderLostWhileRunning: the pageserver's folder is lost
// while the cluster runs (kill -9 of the pageserver and its supervisor,
// folder deleted) after a clean stop had published everything. The new
// pageserver serves the object store's older state, whose pg_control
// says Postgres shut down cleanly; the safekeepers hold the WAL written
// since. The agent must make Postgres replay that WAL (crash recovery
// from the old checkpoint) rather than start clean and write over it:
// the row committed after the clean stop is there. Then the object store
// loses the timeline too (a folder lost before its first upload): strata
// up fails, the agent saying why, and runs no initdb over the WAL.
func TestPageserverFolderLostWhileRunning(t *testing.T) {
	t.Parallel()
	c, cfg := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if url, err = c.Up(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "INSERT INTO t VALUES (1001, 'after the clean stop')")
	losePageserver(t, c)
	if url, err = c.Up(ctx, func(s string) { t.Log(s) }); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, url, "SELECT count(*)::text FROM t"); got != "1001" {
		t.Fatalf("%s rows after the pageserver's folder was lost, want 1001 (the last one committed after the clean stop)", got)
	}
	pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	if clog := tail(filepath.Join(c.dataDir, "compute", "compute.log"), 1<<20); !strings.Contains(clog, "Postgres runs crash recovery to the end of it") {
		t.Fatal("the agent did not log that it forced crash recovery past the clean shutdown")
	}

	// Now the object store loses the timeline too (the state of a folder
	// lost before its first upload, or another object store): the agent
	// must refuse to start rather than run initdb over a cluster whose
	// WAL the safekeepers hold.
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.dataDir, "pageserver")); err != nil {
		t.Fatal(err)
	}
	store, err := fs.New(cfg.ObjectStore.FS, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := store.List(ctx, "timelines/", func(o objectstore.ObjectInfo) error { keys = append(keys, o.Key); return nil }); err != nil || len(keys) == 0 {
		t.Fatalf("listing the timelines' objects: %d, %v", len(keys), err)
	}
	for _, k := range keys {
		if err := store.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	_, err = c.Up(ctx, func(string) {})
	clog := tail(filepath.Join(c.dataDir, "compute", "compute.log"), 1<<20)
	if err == nil || !strings.Contains(clog, "has no files: they belong to another cluster") {
		t.Fatalf("up with the timeline lost everywhere: %v\n%s", err, tail(filepath.Join(c.dataDir, "compute", "compute.log"), 2048))
	}
	if strings.Contains(clog[strings.LastIndex(clog, "has no files"):], "initdb") {
		t.Fatal("the agent ran initdb after refusing")
	}
	t.Logf("up with the timeline lost everywhere: %v", err)
	c.Down(ctx, func(string) {})
}
