package cluster

import (
	"context"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestCrashRoundsRedo is TestCrashRounds in redo mode (STRATA_LONG_TESTS=1):
// storage.page_source redo with pushdown, full_page_writes off and a local
// page store of 1000 pages; pgbench and a client-side ledger run while
// the postmaster or the compute agent is killed with SIGKILL at a random
// moment, ten times. Each restart starts with an empty local store, so
// every page comes back rebuilt from WAL by the pageserver; every
// acknowledged ledger row must be there, the pgbench balances must agree
// and pg_amcheck must find nothing.
//
// The round loop repeats TestCrashRounds' (crash_test.go is not to be
// edited while its own data-loss bug is open); the helpers are shared.
func TestCrashRoundsRedo(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 runs ten kill -9 rounds on the whole cluster in redo mode")
	}
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE ledger (id int PRIMARY KEY)")
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "2")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	acked := map[int]bool{}
	next := 0
	for round := 1; round <= 10; round++ {
		stop := make(chan struct{})
		done := make(chan map[int]bool)
		go ledger(ctx, url, next, stop, done)
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
			if url, err = c.Up(ctx, func(s string) { t.Log(s) }); err != nil {
				t.Fatalf("round %d: up after the agent was killed: %v", round, err)
			}
		}
		got := <-done
		<-bench
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
		pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed", "--rootdescend")
	}
	if len(acked) == 0 {
		t.Fatal("no commit was acknowledged")
	}
	t.Logf("10 rounds in redo mode, %d acknowledged rows, all present, pgbench balances agree, pg_amcheck clean", len(acked))
}
