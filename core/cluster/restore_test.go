package cluster

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestRestore: `strata restore` on a running cluster. Work before and after
// a checkpoint, then an LSN and a time are noted, then a table is emptied
// and another dropped, and more work follows. A restore at the LSN and one
// at the time each give a data directory that starts with the printed
// command, answers on the printed URL, holds exactly the data of that
// moment (both tables, the pgbench sums) and passes pg_amcheck, though
// the pageserver holds newer versions of every page changed since; the
// cluster keeps its own data. A restore at the newest moment holds the
// cluster's. Bad targets and folders are refused with what to do, and
// nothing is left behind.
func TestRestore(t *testing.T) {
	t.Parallel()
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, x, atX := upWithWork(t, ctx, c)
	exec1(t, ctx, url, "DELETE FROM t WHERE id % 3 = 0")
	time.Sleep(1100 * time.Millisecond)
	at, err := time.Parse(time.RFC3339Nano, queryString(t, ctx, url, `SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`))
	if err != nil {
		t.Fatal(err)
	}
	atTime := queryString(t, ctx, url, restoreCheck)
	time.Sleep(1100 * time.Millisecond)
	exec1(t, ctx, url, "DROP TABLE t")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	// Every page changed since is written to the pageserver (its
	// versions after the moments restored to), and t's files unlinked.
	exec1(t, ctx, url, "CHECKPOINT")
	// The segments up to here go to the archive (the restore from the
	// archive alone below).
	switched, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_switch_wal()::text"))
	if err != nil {
		t.Fatal(err)
	}
	now := queryString(t, ctx, url, `SELECT concat_ws(' ', (SELECT count(*) FROM keep), to_regclass('t') IS NULL,
		(SELECT sum(abalance) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_history))`)
	t.Logf("at %s: %s; at %s: %s; now: %s", x, atX, at.Format(time.RFC3339Nano), atTime, now)

	// strata status says how far back a restore reaches.
	status, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.RestoreFrom == 0 || status.RestoreFrom > x || status.RestoreFromTime.After(at) {
		t.Errorf("status: restore from %s (%s), want before %s (%s)", status.RestoreFrom, status.RestoreFromTime, x, at)
	}
	var out strings.Builder
	status.Print(&out)
	if !strings.Contains(out.String(), "restore   from ") {
		t.Errorf("strata status does not say how far back a restore reaches:\n%s", out.String())
	}
	root := pgtest.MkdirOwned(t, "strata-restore-test-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	byLSN := restoreAndCheck(t, ctx, c, restore.Target{LSN: x}, filepath.Join(root, "by-lsn"), restoreCheck, atX, true)
	if byLSN.EndOfWAL || byLSN.LSN != x || !strings.Contains(byLSN.Stop, x.String()) {
		t.Errorf("restore at %s: %+v", x, byLSN.Result)
	}
	byTime := restoreAndCheck(t, ctx, c, restore.Target{Time: at}, filepath.Join(root, "by-time"), restoreCheck, atTime, false)
	if byTime.LSN <= x || byTime.LastCommit == "" {
		t.Errorf("restore at %s: %+v", at, byTime.Result)
	}
	latest := restoreAndCheck(t, ctx, c, restore.Target{Time: time.Now().Add(time.Minute)}, filepath.Join(root, "latest"),
		`SELECT concat_ws(' ', (SELECT count(*) FROM keep), to_regclass('t') IS NULL,
		(SELECT sum(abalance) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_history))`, now, false)
	if !latest.EndOfWAL {
		t.Errorf("restore a minute from now: %+v, want the end of WAL", latest.Result)
	}
	// The WAL from the archive alone (the safekeepers keep only their
	// newest WAL: an older moment needs the archive).
	segEnd := pg.LSN((uint64(switched) + pg.WALSegmentSize - 1) / pg.WALSegmentSize * pg.WALSegmentSize)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, err := safekeeperStatus(ctx, c.safekeeperAddr(0))
		if err == nil && st.ArchivedLSN >= segEnd {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sk1 has not archived up to %s: %+v, %v", segEnd, st, err)
		}
	}
	fromArchive, err := c.restore(ctx, restore.Target{LSN: x}, filepath.Join(root, "from-archive"), 0, func(string) {}, func(o *restore.Options) { o.WAL.Safekeepers = nil })
	if err != nil {
		t.Fatalf("restore from the archive alone: %v", err)
	}
	_, stop := startRestored(t, ctx, fromArchive)
	if got := queryString(t, ctx, fromArchive.URL, restoreCheck); got != atX {
		t.Errorf("restore at %s from the archive alone holds %q, want %q", x, got, atX)
	}
	stop()
	if got := queryString(t, ctx, url, "SELECT count(*) FROM keep"); got != "500" {
		t.Errorf("the cluster after the restores: keep has %s rows", got)
	}

	// Refusals.
	for _, tc := range []struct {
		at   restore.Target
		dir  string
		want error
		say  string
	}{
		{restore.Target{LSN: x + 1<<40}, filepath.Join(root, "new"), restore.ErrTooNew, "past the newest durable WAL"},
		{restore.Target{LSN: 0x100}, filepath.Join(root, "new"), restore.ErrTooOld, "storage.pitr"},
		{restore.Target{Time: time.Now().Add(-24 * time.Hour)}, filepath.Join(root, "new"), restore.ErrTooOld, "before the oldest moment"},
		{restore.Target{LSN: x}, filepath.Join(root, "by-lsn"), restore.ErrDirNotEmpty, "give a new folder"},
		{restore.Target{LSN: x}, filepath.Join(c.dataDir, "copy"), nil, "inside the cluster's folder"},
	} {
		_, err := c.Restore(ctx, tc.at, tc.dir, 0, func(string) {})
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("restore at %s into %s: %v, want %v saying %q", tc.at, tc.dir, err, tc.want, tc.say)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused restore left %s: %v", filepath.Join(root, "new"), err)
	}

	// The pageserver killed (-9) while a restore reads: its supervisor
	// starts it again, and the restore asks again until it answers and
	// finishes with the same data.
	sup := procPID(t, c, "pageserver")
	var said []string
	killed := 0
	r, err := c.Restore(ctx, restore.Target{LSN: x}, filepath.Join(root, "through-restart"), 0, func(s string) {
		said = append(said, s)
		if strings.HasPrefix(s, "WAL from") && killed == 0 {
			if kids := childPIDs(sup); len(kids) == 1 {
				killed = kids[0]
				syscall.Kill(killed, syscall.SIGKILL)
			}
		}
	})
	if err != nil || killed == 0 {
		t.Fatalf("restore while the pageserver (pid %d) was killed: %v\n%s", killed, err, strings.Join(said, "\n"))
	}
	joined := strings.Join(said, "\n")
	for _, l := range said {
		if strings.Contains(l, "the pageserver") {
			t.Logf("restore through a pageserver restart (pid %d killed), in %s: %s", killed, r.Took, l)
		}
	}
	if !strings.Contains(joined, "the pageserver does not answer") || !strings.Contains(joined, "the pageserver answers again") {
		t.Errorf("the restore through a pageserver restart said:\n%s\nwant that it waited for the pageserver, and when it answered again", joined)
	}
	_, stop = startRestored(t, ctx, r)
	if got := queryString(t, ctx, r.URL, restoreCheck); got != atX {
		t.Errorf("restore at %s through a pageserver restart holds %q, want %q", x, got, atX)
	}
	stop()
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restore(ctx, restore.Target{LSN: x}, filepath.Join(root, "new"), 0, func(string) {}); err == nil || !strings.Contains(err.Error(), "strata up") {
		t.Errorf("restore of a stopped cluster: %v, want it to say to start it", err)
	}
}

// restoreAndCheck restores at into dir, starts the copy with the command
// Restore printed, checks that sql gives want on the printed URL (and
// pg_amcheck when amcheck), and stops it.
func restoreAndCheck(t *testing.T, ctx context.Context, c *Cluster, at restore.Target, dir, sql, want string, amcheck bool) *Restored {
	t.Helper()
	var said []string
	r, err := c.Restore(ctx, at, dir, 0, func(s string) { said = append(said, s) })
	if err != nil {
		t.Fatalf("restore at %s: %v\n%s", at, err, strings.Join(said, "\n"))
	}
	t.Logf("restore at %s: %s in %s, %d pages, %d WAL segments, checkpoint %s, stop %q, last commit %s; said %q",
		at, r.LSN, r.Took, r.Pages, r.Segments, r.Checkpoint, r.Stop, r.LastCommit, said)
	if _, err := os.Stat(filepath.Join(dir, "recovery.signal")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: recovery.signal is still there (not promoted?): %v", dir, err)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "pg_replslot")); err != nil || len(ents) != 0 {
		t.Errorf("%s: pg_replslot holds %d entries (%v), want the cluster's slots dropped", dir, len(ents), err)
	}
	_, stop := startRestored(t, ctx, r)
	if got := queryString(t, ctx, r.URL, sql); got != want {
		t.Errorf("restore at %s holds %q, want %q", at, got, want)
	}
	if got := queryString(t, ctx, r.URL, "SELECT pg_is_in_recovery()::text || ' ' || current_setting('synchronous_standby_names') || '.'"); got != "false ." {
		t.Errorf("the restored server: in recovery, synchronous_standby_names: %q", got)
	}
	if amcheck {
		pgtool(t, r.URL, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	}
	stop()
	return r
}

// TestRestoreRedo: the same in redo mode, where the relation pages come
// from the redo timeline (rebuilt from WAL at the target) and the other
// files from the files timeline.
func TestRestoreRedo(t *testing.T) {
	t.Parallel()
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 3000) g")
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "1")
	exec1(t, ctx, url, "CHECKPOINT")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	x, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_current_wal_lsn()::text"))
	if err != nil {
		t.Fatal(err)
	}
	atX := queryString(t, ctx, url, redoCheckSQL)
	exec1(t, ctx, url, "DELETE FROM t WHERE id % 3 = 0")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	exec1(t, ctx, url, "CHECKPOINT")
	root := pgtest.MkdirOwned(t, "strata-restore-test-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	r := restoreAndCheck(t, ctx, c, restore.Target{LSN: x}, filepath.Join(root, "by-lsn"), redoCheckSQL, atX, true)
	if r.LSN != x || r.EndOfWAL {
		t.Errorf("restore at %s: %+v", x, r.Result)
	}

	// From the object store alone, the folder lost: the two timelines
	// are told apart by which holds relations.
	last := queryString(t, ctx, url, redoCheckSQL)
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(c.dataDir, c.dataDir+".lost"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "from-store")
	fs, err := c.RestoreFromStore(ctx, restore.Target{Latest: true}, dir, 0, StoreTimelines{}, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatalf("restore from the store: %v", err)
	}
	sock, _ := startRestored(t, ctx, fs)
	if got := queryString(t, ctx, sock, redoCheckSQL); got != last {
		t.Errorf("restore from the store holds %q, want %q", got, last)
	}
	pgtool(t, sock, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
}

// TestRestoreFromStoreAfterCrash: the machine of a running cluster dies
// (every process killed at once, the data folder lost) after the
// safekeepers archived its last WAL but long before the pageserver would
// upload its newest pages (every ten minutes, or 64 MiB): a restore from
// the store at its latest moment holds every commit, Postgres replaying
// the archived WAL over the older pages the store holds. The last segment
// is closed with pg_switch_wal, as archive_timeout would, so that it is
// archived whole at once rather than after ten quiet seconds.
func TestRestoreFromStoreAfterCrash(t *testing.T) {
	t.Parallel()
	c, cfg := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, _, _ := upWithWork(t, ctx, c)
	exec1(t, ctx, url, "DELETE FROM t WHERE id % 3 = 0")
	last := queryString(t, ctx, url, restoreCheck)
	flush, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_current_wal_flush_lsn()::text"))
	if err != nil {
		t.Fatal(err)
	}
	sysID, err := strconv.ParseUint(queryString(t, ctx, url, "SELECT system_identifier::text FROM pg_control_system()"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	queryString(t, ctx, url, "SELECT pg_switch_wal()::text")
	st, err := fs.New(fs.Config{Root: cfg.ObjectStore.FS.Root}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		end, err := archivedEnd(ctx, st, "wal", sysID)
		if err != nil {
			t.Fatal(err)
		}
		if end >= flush {
			t.Logf("WAL archived up to %s, past the last commit's %s", end, flush)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("WAL archived up to %s a minute after pg_switch_wal, want %s", end, flush)
		}
	}

	// strata status says how far the WAL in the store reaches: what a
	// restore from the store alone gets back.
	status, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	status.Print(&out)
	if status.StoreWAL < flush || !strings.Contains(out.String(), "archive   WAL in the object store to "+status.StoreWAL.String()) {
		t.Fatalf("status: the WAL in the object store %s (%s), want at least %s, and said:\n%s", status.StoreWAL, status.StoreWALErr, flush, out.String())
	}

	// The crash: every process at once, then the folder is lost.
	state, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range state.Procs {
		syscall.Kill(-p.PID, syscall.SIGKILL)
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	for _, p := range state.Procs {
		for deadline := time.Now().Add(10 * time.Second); p.Alive(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) still runs 10 s after SIGKILL", p.Name, p.PID)
			}
		}
	}
	if err := fusefs.MountpointCleanup(c.postgres().DataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(c.dataDir, c.dataDir+".lost"); err != nil {
		t.Fatal(err)
	}

	root := pgtest.MkdirOwned(t, "strata-restore-test-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	replayed := false
	r, err := c.RestoreFromStore(ctx, restore.Target{Latest: true}, filepath.Join(root, "latest"), 0, StoreTimelines{}, func(s string) {
		t.Log(s)
		replayed = replayed || strings.HasPrefix(s, "the pages reach ") && strings.Contains(s, "replayed over them")
	})
	if err != nil {
		t.Fatalf("restore from the store after the crash: %v", err)
	}
	t.Logf("restored: %s, pages at %s, %d WAL segments, checkpoint %s", r.LSN, r.PagesAt, r.Segments, r.Checkpoint)
	if !replayed || r.PagesAt >= r.LSN {
		t.Errorf("the store's pages reach %s, the restore %s: the test meant the pages to lag the archived WAL (a pageserver that uploads them every ten minutes)", r.PagesAt, r.LSN)
	}
	if r.LSN < status.StoreWAL {
		t.Errorf("restored up to %s, before the end of the WAL in the object store that strata status gave, %s", r.LSN, status.StoreWAL)
	}
	sock, _ := startRestored(t, ctx, r)
	if got := queryString(t, ctx, sock, restoreCheck); got != last {
		t.Errorf("restore from the store after the crash holds %q, want %q", got, last)
	}
	pgtool(t, sock, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
}

// safekeeperStatus asks the safekeeper at addr for its status.
func safekeeperStatus(ctx context.Context, addr string) (server.Status, error) {
	cl, err := server.Dial(addr)
	if err != nil {
		return server.Status{}, err
	}
	defer cl.Close()
	return cl.Status(ctx)
}

// TestRestoreFromStore: a cluster stopped with `strata down` whose whole
// data folder is then lost is restored from the object store alone, at
// its newest moment (every acknowledged commit, since the safekeepers
// archive the partial last segment as they stop) and at an earlier LSN.
// The restore writes nothing into the store.
func TestRestoreFromStore(t *testing.T) {
	t.Parallel()
	c, cfg := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, x, atX := upWithWork(t, ctx, c)
	exec1(t, ctx, url, "DELETE FROM t WHERE id % 3 = 0")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	last := queryString(t, ctx, url, restoreCheck)
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	// The machine's folder is lost.
	if err := os.Rename(c.dataDir, c.dataDir+".lost"); err != nil {
		t.Fatal(err)
	}
	before := storeObjects(t, ctx, cfg.ObjectStore.FS.Root)

	root := pgtest.MkdirOwned(t, "strata-restore-test-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var latest string
	for _, tc := range []struct {
		at   restore.Target
		want string
	}{{restore.Target{Latest: true}, last}, {restore.Target{LSN: x}, atX}} {
		dir := filepath.Join(root, strings.ReplaceAll(tc.at.String(), "/", "-"))
		if tc.at.Latest {
			latest = dir
		}
		r, err := c.RestoreFromStore(ctx, tc.at, dir, 0, StoreTimelines{}, func(s string) {
			t.Log(s)
			// After strata down the archive holds every commit.
			if strings.Contains(s, "past the archived WAL") {
				t.Errorf("restore at %s from the store after strata down: %s", tc.at, s)
			}
		})
		if err != nil {
			t.Fatalf("restore at %s from the store: %v", tc.at, err)
		}
		t.Logf("restore at %s from the store: %s, %d pages, %d WAL segments, checkpoint %s, end of WAL %v", tc.at, r.LSN, r.Pages, r.Segments, r.Checkpoint, r.EndOfWAL)
		if r.PasswordLost == "" || !strings.Contains(r.URL, "PASSWORD") {
			t.Errorf("restore with the cluster's folder lost: URL %q, password note %q", r.URL, r.PasswordLost)
		}
		// The password is gone with the folder: the Unix socket.
		sock, stop := startRestored(t, ctx, r)
		if got := queryString(t, ctx, sock, restoreCheck); got != tc.want {
			t.Errorf("restore at %s from the store holds %q, want %q", tc.at, got, tc.want)
		}
		if tc.at.Latest {
			pgtool(t, sock, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
		}
		stop()
	}
	if after := storeObjects(t, ctx, cfg.ObjectStore.FS.Root); !maps.Equal(before, after) {
		t.Errorf("the restores changed the object store: %d objects before, %d after", len(before), len(after))
	}

	// The layers the newest manifests name are gone (a cluster still
	// running on the store replaced them, or the store lost them): the
	// restore fails saying so, and leaves no half-written folder.
	st, err := fs.New(fs.Config{Root: cfg.ObjectStore.FS.Root}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	moved := 0
	for k := range before {
		if strings.Contains(k, "/layers/") {
			if err := st.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
			moved++
		}
	}
	dir := filepath.Join(root, "gone")
	_, err = c.RestoreFromStore(ctx, restore.Target{Latest: true}, dir, 0, StoreTimelines{}, func(s string) { t.Log(s) })
	if err == nil || !strings.Contains(err.Error(), "gone from the object store") || !strings.Contains(err.Error(), "without --from-store") {
		t.Fatalf("restore from a store without its %d layer objects: %v; want an error naming the gone layer and what to do", moved, err)
	}
	t.Logf("restore with the layers gone: %v", err)
	if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("the failed restore left %s behind: %v", dir, serr)
	}

	// The way back to a running cluster after the folder was lost, as
	// docs/operator.md gives it: the same configuration, `strata up
	// --import` of the copy (the old timeline's layers are gone by now,
	// and the new cluster needs none of them).
	said := []string{}
	u, err := c.Import(ctx, latest, func(s string) { said = append(said, s) })
	if err != nil {
		t.Fatalf("strata up --import of the copy from the store, on the lost cluster's configuration: %v\n%s", err, strings.Join(said, "\n"))
	}
	if got := queryString(t, ctx, u, restoreCheck); got != last {
		t.Errorf("the imported cluster holds %q, want the lost one's last %q", got, last)
	}
	pgtool(t, u, "pgbench", "-n", "-c", "2", "-t", "100")
	pgtool(t, u, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
}

// storeObjects lists the fs object store at root: key -> size.
func storeObjects(t *testing.T, ctx context.Context, root string) map[string]int64 {
	t.Helper()
	st, err := fs.New(fs.Config{Root: root}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	out := map[string]int64{}
	if err := st.List(ctx, "", func(oi objectstore.ObjectInfo) error { out[oi.Key] = oi.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// restoreCheck sums up the restore tests' data: the tables t and keep, and
// pgbench's.
const restoreCheck = `SELECT concat_ws(' ', (SELECT count(*) FROM keep),
	(SELECT count(*) FROM t), (SELECT md5(string_agg(id || ':' || v, ',' ORDER BY id)) FROM t),
	(SELECT sum(abalance) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_history))`

// upWithWork starts the cluster and does the restore tests' work: two
// tables, pgbench before and after a checkpoint. It returns the URL, the
// WAL position after the work, and restoreCheck's answer there.
func upWithWork(t *testing.T, ctx context.Context, c *Cluster) (string, pg.LSN, string) {
	t.Helper()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 3000) g")
	exec1(t, ctx, url, "CREATE TABLE keep (id int PRIMARY KEY)")
	exec1(t, ctx, url, "INSERT INTO keep SELECT generate_series(1, 500)")
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "1")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	exec1(t, ctx, url, "CHECKPOINT")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "100")
	x, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_current_wal_lsn()::text"))
	if err != nil {
		t.Fatal(err)
	}
	return url, x, queryString(t, ctx, url, restoreCheck)
}

// startRestored starts a restored copy with the command Restore printed
// and returns a URL over its Unix socket (no password needed) and a stop
// function (also run at cleanup).
func startRestored(t *testing.T, ctx context.Context, r *Restored) (string, func()) {
	t.Helper()
	if out, err := exec.CommandContext(ctx, "sh", "-c", r.Start).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", r.Start, err, out)
	}
	srv := postgres.Server{DataDir: r.Dir, Port: r.Port}
	t.Cleanup(func() { srv.Stop(context.Background()) })
	stop := func() {
		if err := srv.Stop(ctx); err != nil {
			t.Error(err)
		}
	}
	return "postgres://postgres@/postgres?host=" + r.Dir + "&port=" + strconv.Itoa(r.Port) + "&sslmode=disable", stop
}
