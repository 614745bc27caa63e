package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestCrashRounds is the compute issue's crash test on the whole cluster
// (STRATA_LONG_TESTS=1), with the lfc strategy (TestCrashRoundsRedo runs the
// default, shared-buffers): with full_page_writes=off, pgbench, a client-side
// ledger and a DDL churn run while either the postmaster or the compute
// agent is killed with SIGKILL at a random moment, ten times. After each
// kill the cluster comes back (the agent restarts Postgres itself; a dead
// agent needs `strata up`), every acknowledged ledger row and table change
// is there, the pgbench balances agree and pg_amcheck finds nothing
// (crashRounds).
func TestCrashRounds(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 runs ten kill -9 rounds on the whole cluster")
	}
	c, _ := newLFCCluster(t)
	t.Setenv("STRATA_COMPUTE_FULL_PAGE_WRITES", "false")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	n := crashRounds(t, ctx, c, url, 7)
	t.Logf("10 rounds, %d acknowledged rows, all present, pgbench balances agree, pg_amcheck clean", n)
}

// crashRounds is the crash test on a running cluster (either page source):
// pgbench, a client-side ledger and a DDL churn (tables created, filled,
// checkpointed, dropped) run while the postmaster or the compute agent is
// killed with SIGKILL at a random moment, ten times. After each kill the
// cluster comes back (the agent restarts Postgres itself; a dead agent
// needs `strata up`), every acknowledged ledger row must be there, every
// acknowledged CREATE, INSERT and DROP of the churn must show, the
// ledger's GIN, GiST and SP-GiST indexes must find every row once, the
// pgbench balances must agree and pg_amcheck must find nothing. It returns how many
// rows were acknowledged.
func crashRounds(t *testing.T, ctx context.Context, c *Cluster, url string, seed uint64) int {
	t.Helper()
	exec1(t, ctx, url, ledgerIndexed)
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "2")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), seed))
	acked := map[int]bool{}
	next := 0
	tables := map[int]string{} // churn table number -> acknowledged state
	nextTable := 0
	for round := 1; round <= 10; round++ {
		stop := make(chan struct{})
		done := make(chan map[int]bool)
		go ledger(ctx, url, next, stop, done)
		ddlDone := make(chan map[int]string)
		go ddlChurn(ctx, url, nextTable, stop, ddlDone)
		bench := make(chan struct{})
		go func() {
			defer close(bench)
			// -n: no VACUUM or TRUNCATE of pgbench_history, so that the
			// balances keep matching the history.
			if cmd, err := pgtest.Command("pgbench", "-n", "-c", "4", "-T", "60", url); err == nil {
				cmd.Run() // ends with an error when the server dies
			}
		}()
		wait := time.Duration(500+rng.IntN(4500)) * time.Millisecond
		time.Sleep(wait)
		victim := "postmaster"
		if rng.IntN(2) == 0 {
			victim = "agent"
		}
		var pid int
		if victim == "agent" {
			pid = procPID(t, c, "compute")
		} else {
			pid = postmasterPID(t, c)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("round %d: kill %s %d: %v", round, victim, pid, err)
		}
		close(stop)
		t0 := time.Now()
		if victim == "agent" {
			dying := Proc{Name: "compute", PID: pid}
			for i := 0; i < 300 && dying.Alive(); i++ {
				time.Sleep(100 * time.Millisecond)
			}
			var err error
			if url, err = c.Up(ctx, func(s string) { t.Log(s) }); err != nil {
				t.Fatalf("round %d: up after the agent was killed: %v", round, err)
			}
		}
		got := <-done
		churn := <-ddlDone
		<-bench
		for n, st := range churn {
			tables[n] = st
			nextTable = max(nextTable, n+1)
		}
		nextTable += 1000
		for id := range got {
			acked[id] = true
			next = max(next, id+1)
		}
		next += 1000
		if victim == "postmaster" {
			if err := waitConnect(ctx, url, 3*time.Minute); err != nil {
				t.Fatalf("round %d: Postgres did not come back after the postmaster was killed: %v", round, err)
			}
		}
		t.Logf("round %d: %s killed after %s with %d rows acknowledged; back in %s", round, victim, wait, len(got), time.Since(t0).Round(time.Millisecond))
		have := ledgerRows(t, ctx, url)
		lost := 0
		for id := range acked {
			if !have[id] {
				lost++
			}
		}
		if lost > 0 {
			t.Fatalf("round %d: %d of %d acknowledged rows lost (%d present)", round, lost, len(acked), len(have))
		}
		sum := queryString(t, ctx, url, `SELECT concat_ws(' ', (SELECT sum(abalance) FROM pgbench_accounts),
			(SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum(tbalance) FROM pgbench_tellers),
			(SELECT coalesce(sum(delta), 0) FROM pgbench_history))`)
		checkPgbench(t, sum)
		checkChurn(t, ctx, url, round, tables)
		checkLedgerIndexes(t, ctx, url, round)
		pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed", "--rootdescend")
	}
	if len(acked) == 0 {
		t.Fatal("no commit was acknowledged")
	}
	return len(acked)
}

// ledgerIndexed is the crash rounds' ledger: its rows also carry an array,
// a box, a point and a text made from the id (generated columns, so the
// ledger's INSERT stays one value), indexed by GIN (its pending list on),
// GiST and SP-GiST: the WAL of every index method goes through the
// kills, with full_page_writes=off.
const ledgerIndexed = `CREATE TABLE ledger (id int PRIMARY KEY,
	a int[] GENERATED ALWAYS AS (ARRAY[0, id % 97]) STORED,
	b box GENERATED ALWAYS AS (box(point(id % 1000, id / 1000), point(id % 1000 + 1, id / 1000 + 1))) STORED,
	p point GENERATED ALWAYS AS (point(id % 1000, id / 1000)) STORED,
	t text GENERATED ALWAYS AS (md5(id::text)) STORED);
CREATE INDEX ledger_a ON ledger USING gin (a);
CREATE INDEX ledger_b ON ledger USING gist (b);
CREATE INDEX ledger_p ON ledger USING spgist (p);
CREATE INDEX ledger_t ON ledger USING spgist (t)`

// checkLedgerIndexes checks that the ledger's GIN, GiST and SP-GiST
// indexes each find every row of the table, once (GiST and SP-GiST by a
// plain index scan, which would return a row twice where a bitmap scan
// would not; GIN has only bitmap scans).
func checkLedgerIndexes(t *testing.T, ctx context.Context, url string, round int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var want string
	if err := conn.QueryRow(ctx, "SELECT count(*)::text FROM ledger").Scan(&want); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"SET enable_seqscan = off", "SET enable_indexonlyscan = off"} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		index, q string
		bitmap   bool
	}{
		{"ledger_a", "SELECT count(*)::text FROM ledger WHERE a @> ARRAY[0]", true},
		{"ledger_b", "SELECT count(*)::text FROM ledger WHERE b && box(point(-1, -1), point(1001, 1e7))", false},
		{"ledger_p", "SELECT count(*)::text FROM ledger WHERE p <@ box(point(-1, -1), point(1001, 1e7))", false},
		{"ledger_t", "SELECT count(*)::text FROM ledger WHERE t >= ''", false},
	} {
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET enable_bitmapscan = %t", c.bitmap)); err != nil {
			t.Fatal(err)
		}
		throughIndex(t, ctx, conn, c.q, c.index, want)
	}
	t.Logf("round %d: the GIN, GiST and SP-GiST indexes find all %s ledger rows", round, want)
}

// ddlChurn creates tables crash_ddl_<n> from n = from on until stop or the
// first error: every other one gets a row, every third CREATE is followed
// by a CHECKPOINT (a checkpoint with little to write right after a CREATE
// TABLE: its pg_control must not outlive the new table's files), and every
// fourth table drops the one made two before. It sends each table's last
// acknowledged state: "created", "row" or "dropped".
func ddlChurn(ctx context.Context, url string, from int, stop chan struct{}, done chan map[int]string) {
	got := map[int]string{}
	defer func() { done <- got }()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	exec := func(sql string) bool {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		_, err := conn.Exec(qctx, sql)
		return err == nil
	}
	for n := from; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if !exec(fmt.Sprintf("CREATE TABLE crash_ddl_%d (id int PRIMARY KEY)", n)) {
			return
		}
		got[n] = "created"
		if n%3 == 0 && !exec("CHECKPOINT") {
			return
		}
		if n%2 == 0 {
			if !exec(fmt.Sprintf("INSERT INTO crash_ddl_%d VALUES (%d)", n, n)) {
				return
			}
			got[n] = "row"
		}
		if n%4 == 3 && n-2 >= from {
			if !exec(fmt.Sprintf("DROP TABLE crash_ddl_%d", n-2)) {
				return
			}
			got[n-2] = "dropped"
		}
	}
}

// checkChurn checks every churn table against its acknowledged state: a
// created table exists (with or without the row whose INSERT may have
// committed unacknowledged), a filled one has its row, a dropped one is
// gone.
func checkChurn(t *testing.T, ctx context.Context, url string, round int, tables map[int]string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var bad []string
	for n, st := range tables {
		name := fmt.Sprintf("crash_ddl_%d", n)
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		switch {
		case st == "dropped" && exists:
			bad = append(bad, name+" exists after an acknowledged DROP")
		case st != "dropped" && !exists:
			bad = append(bad, name+" missing after an acknowledged CREATE")
		case st == "row":
			var c int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+name+" WHERE id = $1", n).Scan(&c); err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", name, err))
			} else if c != 1 {
				bad = append(bad, fmt.Sprintf("%s has %d rows, want its acknowledged row", name, c))
			}
		case st == "created":
			if _, err := conn.Exec(ctx, "SELECT count(*) FROM "+name); err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", name, err))
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Fatalf("round %d: %d of %d churn tables wrong: %s", round, len(bad), len(tables), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	t.Logf("round %d: %d churn tables as acknowledged", round, len(tables))
}

// ledger inserts increasing ids from `from` until stop or the first error,
// and sends the ids whose INSERT was acknowledged.
func ledger(ctx context.Context, url string, from int, stop chan struct{}, done chan map[int]bool) {
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
}

func ledgerRows(t *testing.T, ctx context.Context, url string) map[int]bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id FROM ledger")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	have := map[int]bool{}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		have[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return have
}

func waitConnect(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, url)
		if err == nil {
			_, err = conn.Exec(cctx, "SELECT 1")
			conn.Close(context.Background())
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pgtool runs a PostgreSQL client program against url (its connection
// parameters passed in the environment) and fails the test on error.
func pgtool(t *testing.T, url, name string, args ...string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := pgtest.Command(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, "PGHOST="+cfg.Host, "PGPORT="+strconv.Itoa(int(cfg.Port)),
		"PGUSER="+cfg.User, "PGPASSWORD="+cfg.Password, "PGDATABASE="+cfg.Database)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	} else if name == "pg_amcheck" {
		// Corruption makes it exit non-zero; anything it says besides the
		// notices of --install-missing is a finding too.
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" && !strings.HasPrefix(l, "NOTICE:") {
				t.Fatalf("pg_amcheck reported:\n%s", out)
			}
		}
	}
}

func procPID(t *testing.T, c *Cluster, name string) int {
	t.Helper()
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Procs {
		if p.Name == name {
			return p.PID
		}
	}
	t.Fatalf("no %s process in the cluster state", name)
	return 0
}

func postmasterPID(t *testing.T, c *Cluster) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.postgres().DataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}
