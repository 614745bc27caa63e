package cluster

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSafekeeperRestartedBySupervisor: strata up runs every safekeeper
// under a supervisor, like the compute agent. kill -9 of a safekeeper
// server, not its supervisor, during commits brings it back as a new
// process that catches up and acknowledges again, and every acknowledged
// row is still there; then the same for a second safekeeper.
func TestSafekeeperRestartedBySupervisor(t *testing.T) {
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 1000) g")
	acked := 1000

	// insert adds rows next+1..next+n in one transaction; it reports
	// whether the commit was acknowledged.
	insert := func(n int) bool {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		conn, err := pgx.Connect(qctx, url)
		if err != nil {
			return false
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(qctx, "INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series($1::int, $2::int) g", acked+1, acked+n)
		if err != nil {
			return false
		}
		acked += n
		return true
	}
	count := func() int64 {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		conn, err := pgx.Connect(qctx, url)
		if err != nil {
			return -1
		}
		defer conn.Close(context.Background())
		var n int64
		if conn.QueryRow(qctx, "SELECT count(*) FROM t").Scan(&n) != nil {
			return -1
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

	for _, name := range []string{"safekeeper sk2", "safekeeper sk1"} {
		old := server(name)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		// Commits go on: two safekeepers are a quorum.
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not back 3 minutes after kill -9 of pid %d (children %v, %d acknowledged rows, count %d); log:\n%s",
					name, old, childPIDs(sups[name].PID), acked, count(), tail(sups[name].Log, 4096))
			}
			if !sups[name].Alive() {
				t.Fatalf("the %s supervisor exited after its server was killed; log:\n%s", name, tail(sups[name].Log, 4096))
			}
			insert(100)
			kids := childPIDs(sups[name].PID)
			if len(kids) == 1 && kids[0] != old && streaming(name) && insert(100) {
				break
			}
		}
		if n := count(); n != int64(acked) {
			t.Fatalf("after kill -9 of %s: %d rows, %d acknowledged", name, n, acked)
		}
		t.Logf("%s: pid %d killed, pid %d streams %s later; %d acknowledged rows, all present", name, old, server(name), time.Since(t0).Round(time.Millisecond), acked)
	}

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
	var servers []Proc
	for _, name := range []string{"safekeeper sk1", "safekeeper sk2"} {
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
