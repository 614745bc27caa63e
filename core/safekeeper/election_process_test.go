package safekeeper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/election"
	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestElectionWithProcesses: the compute restarts while one safekeeper lags;
// a new term is elected over real safekeeper processes, the laggard catches
// up from a peer, an old-term proposer is fenced, and the restarted Postgres
// streams to the new term with every acknowledged commit kept.
func TestElectionWithProcesses(t *testing.T) {
	c := startProcCluster(t)
	acked := c.crashWithSk3Behind()
	c.start(2)
	testpg.WaitFor(t, 30*time.Second, "sk3 up", func() bool { _, err := c.status(2); return err == nil })
	st3, _ := c.status(2)
	t.Logf("sk3 restarted at flush %s", st3.FlushLSN)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	end, err := Elect(ctx, 1, "compute-2", "", c.addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("term 1 elected; durable end %s", end)
	if st3.FlushLSN >= end {
		t.Fatalf("sk3 was not lagging (%s >= %s)", st3.FlushLSN, end)
	}
	for i := range c.addrs {
		st, err := c.status(i)
		if err != nil {
			t.Fatal(err)
		}
		if st.Term != 1 || !st.Accepted || st.FlushLSN < end {
			t.Fatalf("sk%d after election: term %d accepted %t flush %s (end %s)", i+1, st.Term, st.Accepted, st.FlushLSN, end)
		}
		if len(st.History) == 0 || st.History[len(st.History)-1] != (election.TermStart{Term: 1, Start: end}) {
			t.Fatalf("sk%d history %v", i+1, st.History)
		}
	}
	// The laggard caught up from a peer: its WAL up to the end equals the
	// donor's (checked against pg_wal below, once Postgres is back).

	// An old proposer (term 1 again, another compute) is fenced.
	if _, err := Elect(ctx, 1, "compute-old", "", c.addrs); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale proposer: %v", err)
	}

	// The compute restarts (crash recovery from its own pg_wal) and streams
	// to the safekeepers of term 1.
	c.restartInTerm(acked)
}

// TestJoinAfterElection: a safekeeper that is down during an election
// joins the term afterwards (Join with the term's Accept): it votes,
// catches up to E from a member of the term, follows the compute, and its
// WAL then equals the others'; a Join for an older term is fenced.
func TestJoinAfterElection(t *testing.T) {
	c := startProcCluster(t)
	acked := c.crashWithSk3Behind()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	el, err := ElectWith(ctx, 1, "compute-2", "", c.addrs, ElectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if el.Accept.Term != 1 || el.Accept.Start != el.End || el.Accept.ComputeID != "compute-2" {
		t.Fatalf("elected %+v", el)
	}
	c.start(2)
	testpg.WaitFor(t, 30*time.Second, "sk3 up", func() bool { _, err := c.status(2); return err == nil })
	if st, _ := c.status(2); st.Term != 0 || st.FlushLSN >= el.End {
		t.Fatalf("sk3 before the join: term %d flush %s (E %s)", st.Term, st.FlushLSN, el.End)
	}
	if err := Join(ctx, c.addrs[2], el.Accept, ""); err != nil {
		t.Fatal(err)
	}
	st, err := c.status(2)
	if err != nil {
		t.Fatal(err)
	}
	if st.Term != 1 || !st.Accepted || st.FlushLSN != el.End ||
		len(st.History) == 0 || st.History[len(st.History)-1] != (election.TermStart{Term: 1, Start: el.End}) {
		t.Fatalf("sk3 after the join: term %d accepted %t flush %s history %v (E %s)", st.Term, st.Accepted, st.FlushLSN, st.History, el.End)
	}
	if err := Join(ctx, c.addrs[2], election.AcceptRequest{ComputeID: "compute-old"}, ""); !errors.Is(err, ErrFenced) {
		t.Fatalf("a join for term 0 after term 1: %v", err)
	}
	// Postgres comes back and streams to all three in term 1.
	c.restartInTerm(acked)
}

// crashWithSk3Behind runs a ledger, kills sk3 (it lags from there on),
// commits more, then kills Postgres with SIGKILL (the compute crashes); it
// returns the ledger's acknowledged payloads.
func (c *procCluster) crashWithSk3Behind() []string {
	t := c.t
	t.Helper()
	waitSync(t, c.srv, 3)
	l := startLedger(t, c.srv, 2)
	testpg.WaitFor(t, 30*time.Second, "ledger commits", func() bool { return l.count() > 100 })
	c.kill(2, syscall.SIGKILL)
	n0 := l.count()
	testpg.WaitFor(t, 30*time.Second, "commits without sk3", func() bool { return l.count() > n0+150 })
	c.srv.Kill9()
	l.stop()
	return append([]string(nil), l.acked...)
}

// restartInTerm launches the crashed Postgres again (crash recovery from
// its own pg_wal) and checks that it streams to all three safekeepers of
// the new term: every acknowledged row is there, new commits are
// acknowledged, and every safekeeper's WAL equals pg_wal.
func (c *procCluster) restartInTerm(acked []string) {
	t := c.t
	t.Helper()
	c.srv.Launch()
	waitSync(t, c.srv, 3)
	if got := c.srv.QueryString("postgres", "SELECT count(*)::text FROM ledger WHERE payload = ANY($1)", acked); got != itoa(len(acked)) {
		t.Fatalf("after the compute restart, %s of %d acknowledged rows remain", got, len(acked))
	}
	l2 := startLedger(t, c.srv, 2)
	testpg.WaitFor(t, 30*time.Second, "commits in term 1", func() bool { return l2.count() > 100 })
	l2.stop()
	c.compareAll()
}

// TestCatchUpFromPeersWhenPostgresRemovedWAL: a safekeeper that comes back
// after Postgres removed the WAL it needs next ("requested WAL segment has
// already been removed") fetches that WAL from a peer of its term, then
// streams from Postgres again; its WAL equals a peer's.
func TestCatchUpFromPeersWhenPostgresRemovedWAL(t *testing.T) {
	c := startProcCluster(t)
	waitSync(t, c.srv, 3)
	c.srv.Exec("postgres", "CREATE TABLE filler (v text)")
	st3, err := c.status(2)
	if err != nil {
		t.Fatal(err)
	}
	c.kill(2, syscall.SIGKILL)
	// Without sk3's slot Postgres keeps no WAL for it.
	testpg.WaitFor(t, 30*time.Second, "sk3's slot dropped", func() bool {
		return c.srv.QueryString("postgres", "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = 'strata_sk3' AND NOT active") == "1"
	})
	c.srv.Exec("postgres", "SELECT pg_drop_replication_slot('strata_sk3')")
	c.srv.Exec("postgres", "ALTER SYSTEM SET wal_keep_size = 0")
	c.srv.Exec("postgres", "SELECT pg_reload_conf()")
	need := walSeg(uint64(st3.FlushLSN) / pg.WALSegmentSize)
	for i := 0; ; i++ {
		oldest := c.srv.QueryString("postgres", "SELECT min(name) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'")
		if oldest > need {
			t.Logf("pg_wal starts at %s; sk3 needs %s next", oldest, need)
			break
		}
		if i == 20 {
			t.Fatalf("pg_wal still holds %s (oldest %s) after %d checkpoints", need, oldest, i)
		}
		c.srv.Exec("postgres", "INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 20000)")
		c.srv.Exec("postgres", "SELECT pg_switch_wal()")
		c.srv.Exec("postgres", "CHECKPOINT")
	}
	c.start(2)
	waitSync(t, c.srv, 3)
	end := testpg.FlushLSN(t, c.srv)
	st3 = c.waitFlush(2, end)
	st1 := c.waitFlush(0, end)
	if st1.StartLSN > st3.StartLSN {
		t.Fatalf("sk1 starts at %s, after sk3 (%s)", st1.StartLSN, st3.StartLSN)
	}
	n := testpg.CompareWALDirs(t, filepath.Join(c.dirs[2], "pg_wal"), filepath.Join(c.dirs[0], "pg_wal"), st3.StartLSN, end)
	t.Logf("sk3 %s..%s (%d MiB) equals sk1", st3.StartLSN, end, n>>20)
	if !strings.Contains(readFile(t, filepath.Join(c.dirs[2], "..", "sk3.log")), "caught up from a peer") {
		t.Fatal("sk3's log does not say it caught up from a peer")
	}
}

func walSeg(no uint64) string { return walstore.SegmentName(1, no, pg.WALSegmentSize) }

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func itoa(n int) string {
	return fmtInt(n)
}

func fmtInt(n int) string { return fmt.Sprint(n) }
