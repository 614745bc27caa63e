package cluster

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// TestRestoreUnderLoad (STRATA_LONG_TESTS=1): restores of a cluster that
// pgbench keeps busy, at LSNs taken while a writer commits rows one by
// one into a ledger and notes, for each row, the WAL position before its
// transaction began and after it committed. In each copy every row that
// committed before the LSN is there, no row that began after it is, and
// pg_amcheck is clean.
func TestRestoreUnderLoad(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 runs it")
	}
	c, _ := newTestCluster(t)
	restoreUnderLoad(t, c)
}

// TestRestoreUnderLoadRedo is TestRestoreUnderLoad in redo mode.
func TestRestoreUnderLoadRedo(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 runs it")
	}
	c, _ := newRedoCluster(t)
	restoreUnderLoad(t, c)
}

func restoreUnderLoad(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "10")
	exec1(t, ctx, url, "CREATE TABLE ledger (id int PRIMARY KEY, pad text)")

	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cmd, err := pgtest.Command("pgbench", "-n", "-c", "4", "-T", "600", url)
		if err != nil {
			t.Error(err)
			return
		}
		if err := cmd.Start(); err != nil {
			t.Error(err)
			return
		}
		<-lctx.Done()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	type row struct{ before, after pg.LSN }
	var mu sync.Mutex
	rows := map[int]row{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		lsn := func() pg.LSN {
			var s string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
				return 0
			}
			l, _ := pg.ParseLSN(s)
			return l
		}
		for id := 1; lctx.Err() == nil; id++ {
			b := lsn()
			if _, err := conn.Exec(ctx, "INSERT INTO ledger VALUES ($1, repeat('x', 200))", id); err != nil {
				t.Error(err)
				return
			}
			a := lsn()
			mu.Lock()
			rows[id] = row{b, a}
			mu.Unlock()
		}
	}()

	root := pgtest.MkdirOwned(t, "strata-restore-load-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		time.Sleep(8 * time.Second)
		x, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_current_wal_lsn()::text"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		dir := filepath.Join(root, "r"+itoa(i))
		r, err := c.Restore(ctx, restore.Target{LSN: x}, dir, 0, func(string) {})
		if err != nil {
			t.Fatalf("restore %d at %s under load: %v", i, x, err)
		}
		sock, stop := startRestored(t, ctx, r)
		got := map[int]bool{}
		conn, err := pgx.Connect(ctx, sock)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := conn.Query(ctx, "SELECT id FROM ledger")
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var id int
			rs.Scan(&id)
			got[id] = true
		}
		rs.Close()
		conn.Close(ctx)
		mu.Lock()
		in, out, missing, extra := 0, 0, 0, 0
		for id, w := range rows {
			switch {
			case w.after < x:
				in++
				if !got[id] {
					missing++
				}
			case w.before >= x:
				out++
				if got[id] {
					extra++
				}
			}
		}
		mu.Unlock()
		t.Logf("restore %d at %s under load in %s: %d pages; %d ledger rows in the copy; %d committed before (missing %d), %d began after (present %d)",
			i, x, r.Took, r.Pages, len(got), in, missing, out, extra)
		if missing > 0 || extra > 0 || in == 0 {
			t.Errorf("restore %d at %s: %d rows committed before it missing, %d rows begun after it present (of %d and %d)", i, x, missing, extra, in, out)
		}
		pgtool(t, sock, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
		stop()
	}
	stopLoad()
	wg.Wait()
}
