package cluster

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/sdk/pg"
)

// TestSafekeeperAndPageserverRestartedBySupervisor: strata up runs every
// safekeeper and the pageserver under a supervisor, like the compute
// agent. kill -9 of a server, not its supervisor, during commits brings it
// back as a new process and every acknowledged row is still there: two
// safekeepers in turn (each catches up and Postgres streams to it again),
// then the pageserver. pg_amcheck finds nothing at the end. Whether the
// pageserver held page writes that were not yet durable when it died
// depends on timing (the LFC keeps most of them in the compute), so the
// test logs how often the agent restarted Postgres for a loss; the rule
// itself is TestNoStaleReadAfterPageserverRestart (core/compute/psbackend).
func TestSafekeeperAndPageserverRestartedBySupervisor(t *testing.T) {
	t.Parallel()
	c, _ := newLFCCluster(t)
	killServers(t, c, false, "safekeeper sk2", "safekeeper sk1", "pageserver")
}

// TestRedoPageserverRestartedBySupervisor: in redo mode the pageserver
// builds every page from the WAL it ingests, so a pageserver that comes
// back after a kill -9 must resume ingest where its layers end (the end of
// a WAL record) and catch up, or every read of a page written since waits
// and fails. Same ledger, checks and pg_amcheck as above.
func TestRedoPageserverRestartedBySupervisor(t *testing.T) {
	t.Parallel()
	c, _ := newRedoCluster(t)
	killServers(t, c, true, "pageserver")
}

// killServers starts c, writes a ledger of acknowledged inserts and kills
// each named server (by its supervisor's name) with SIGKILL in turn while
// inserts run; each must come back, with every acknowledged row there
// (and, with ingest, the pageserver's WAL ingest caught up with Postgres'
// WAL), pg_amcheck clean, and strata down must stop every server.
func killServers(t *testing.T, c *Cluster, ingest bool, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 1000) g")

	// The ledger: every acknowledged insert's id range. A failed insert
	// may or may not have committed, so ids are never reused.
	var mu sync.Mutex
	los, his := []int32{1}, []int32{1000}
	acked, next := 1000, 1000
	var failures atomic.Int64
	// insert adds n rows in one transaction; it reports whether the
	// commit was acknowledged.
	insert := func(n int) bool {
		mu.Lock()
		lo := next + 1
		next += n
		mu.Unlock()
		err := execWithin(ctx, url, 10*time.Second, "INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series($1::int, $2::int) g", lo, lo+n-1)
		if err != nil {
			if failures.Add(1) <= 5 {
				t.Logf("insert of %d rows failed: %v", n, err)
			}
			return false
		}
		mu.Lock()
		los, his = append(los, int32(lo)), append(his, int32(lo+n-1))
		acked += n
		mu.Unlock()
		return true
	}
	// check fails the test unless every acknowledged row is there.
	check := func(after string) int {
		t.Helper()
		mu.Lock()
		l, h, want := slices.Clone(los), slices.Clone(his), acked
		mu.Unlock()
		// Postgres may be restarting (a pageserver restart that lost
		// page writes stops it).
		var n int
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			err := func() error {
				conn, err := pgx.Connect(ctx, url)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				return conn.QueryRow(ctx, "SELECT count(*) FROM t JOIN unnest($1::int[], $2::int[]) AS r(lo, hi) ON t.id BETWEEN r.lo AND r.hi", l, h).Scan(&n)
			}()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s: counting rows: %v", after, err)
			}
		}
		if n != want {
			t.Fatalf("after %s: %d of %d acknowledged rows present", after, n, want)
		}
		return n
	}

	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	sups := map[string]Proc{}
	for _, p := range st.Procs {
		sups[p.Name] = p
	}
	// server returns the one child of a supervisor.
	server := func(name string) int {
		t.Helper()
		kids := childPIDs(sups[name].PID)
		if len(kids) != 1 {
			t.Fatalf("%s: supervisor %d has children %v, want one server", name, sups[name].PID, kids)
		}
		return kids[0]
	}
	// streaming reports whether Postgres streams to the safekeeper again.
	streaming := func(name string) bool {
		st, err := c.Status(ctx)
		if err != nil {
			return false
		}
		for _, p := range st.Procs {
			if p.Name == name {
				return p.Alive && p.State == "streaming"
			}
		}
		return false
	}
	// A supervisor retries only a child that ran 10 s (a first start that
	// fails at once is reported instead).
	time.Sleep(time.Until(upAt.Add(11 * time.Second)))

	for _, name := range names {
		// Page writes in flight when the server dies: larger inserts
		// in the background (shared_buffers is 16 MB, so they evict
		// dirty pages to the pageserver all the time).
		bctx, bcancel := context.WithCancel(ctx)
		var bg sync.WaitGroup
		bg.Add(1)
		go func() {
			defer bg.Done()
			for bctx.Err() == nil {
				insert(2000)
			}
		}()
		time.Sleep(2 * time.Second)
		old := server(name)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		// Commits go on: two safekeepers are a quorum, and the compute
		// restarts Postgres if the pageserver lost page writes.
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				bcancel()
				bg.Wait()
				t.Fatalf("%s not back 3 minutes after kill -9 of pid %d (children %v, %d acknowledged rows); log:\n%s",
					name, old, childPIDs(sups[name].PID), acked, tail(sups[name].Log, 4096))
			}
			if !sups[name].Alive() {
				bcancel()
				bg.Wait()
				t.Fatalf("the %s supervisor exited after its server was killed; log:\n%s", name, tail(sups[name].Log, 4096))
			}
			insert(100)
			kids := childPIDs(sups[name].PID)
			if len(kids) == 1 && kids[0] != old && (name == "pageserver" || streaming(name)) && insert(100) {
				break
			}
		}
		back := time.Since(t0)
		bcancel()
		bg.Wait()
		n := check("kill -9 of " + name)
		t.Logf("%s: pid %d killed, pid %d serves %s later; %d acknowledged rows, all present", name, old, server(name), back.Round(time.Millisecond), n)
		if name == "pageserver" && ingest {
			caughtUp(t, ctx, c, url)
		}
	}
	mu.Lock()
	t.Logf("%d rows in inserts that failed (not acknowledged: the ledger does not count them)", next-acked)
	mu.Unlock()

	// The cluster's status sees every process alive, and the supervisors
	// stop with their servers.
	status, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range status.Procs {
		if !p.Alive {
			t.Fatalf("strata status after the restarts: %s not alive", p.Name)
		}
	}
	clog := tail(sups["compute"].Log, 1<<22)
	t.Logf("the agent restarted Postgres %d times; %d times because the pageserver lost page writes",
		strings.Count(clog, "restarting it from storage"), strings.Count(clog, "the pageserver lost page writes"))
	var servers []Proc
	pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed", "--rootdescend")
	for _, name := range []string{"safekeeper sk1", "safekeeper sk2", "pageserver"} {
		p := Proc{Name: name, PID: server(name)}
		p.StartTime, _ = procStartTime(p.PID)
		servers = append(servers, p)
	}
	if err := c.Down(ctx, func(s string) { t.Log(s) }); err != nil {
		t.Fatal(err)
	}
	for _, p := range servers {
		for deadline := time.Now().Add(10 * time.Second); p.Alive(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) still running 10 s after strata down", p.Name, p.PID)
			}
		}
	}
}

// caughtUp waits until the pageserver's last record LSN reaches Postgres'
// WAL flush position at the call.
func caughtUp(t *testing.T, ctx context.Context, c *Cluster, url string) {
	t.Helper()
	var flush string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		err := func() error {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			return conn.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flush)
		}()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reading Postgres' WAL flush LSN: %v", err)
		}
	}
	want, err := pg.ParseLSN(flush)
	if err != nil {
		t.Fatal(err)
	}
	var last pg.LSN
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, err := c.Status(ctx)
		if err == nil {
			last = st.PageserverLast
			if last >= want {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted pageserver's last record LSN is %s a minute after Postgres flushed WAL to %s (status: %v)", last, want, err)
		}
	}
	t.Logf("the restarted pageserver's last record LSN %s has reached Postgres' WAL flush LSN %s", last, want)
}
