package cluster

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
)

// TestImport: a new cluster from an earlier moment of another. Cluster A
// does its work, a table is emptied after the LSN noted, and `strata
// restore` writes A at that LSN into a folder (with the folders strata
// keeps, and no strata record among the files); `strata up --import`
// starts cluster B from that folder on A's own object store. B holds
// exactly A's data of that moment, has a system identifier of its own
// and its own superuser password, takes writes, passes pg_amcheck, keeps
// its data across down and up, and archives its WAL apart from A's. A
// second --import on B is refused with what to do, and A is unchanged.
func TestImport(t *testing.T) {
	t.Parallel()
	a, aCfg := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	urlA, x, atX := upWithWork(t, ctx, a)
	exec1(t, ctx, urlA, "DELETE FROM t WHERE id % 2 = 0")
	nowA := queryString(t, ctx, urlA, restoreCheck)
	sysA := queryString(t, ctx, urlA, "SELECT system_identifier::text FROM pg_control_system()")

	root := pgtest.MkdirOwned(t, "strata-import-test-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "at-x")
	r, err := a.Restore(ctx, restore.Target{LSN: x}, dir, 0, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, psbackend.DirsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the restored folder holds strata's %s: %v", psbackend.DirsFile, err)
	}
	for _, d := range []string{"pg_notify", "pg_snapshots", "pg_logical/snapshots", "pg_stat_tmp"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("the restored folder lacks %s: %v", d, err)
		}
	}

	b, _ := newTestClusterEdited(t, func(y string) string {
		// B shares A's object store.
		i := strings.Index(y, "objectstore:\n  fs:\n    root: ")
		return y[:i] + "objectstore:\n  fs:\n    root: " + aCfg.ObjectStore.FS.Root + "\n"
	})
	var said []string
	urlB, err := b.Import(ctx, dir, func(s string) { said = append(said, s) })
	if err != nil {
		t.Fatalf("strata up --import %s: %v\n%s", dir, err, strings.Join(said, "\n"))
	}
	if !strings.HasPrefix(said[0], "importing "+dir) {
		t.Errorf("up --import said first %q", said[0])
	}
	if got := queryString(t, ctx, urlB, restoreCheck); got != atX {
		t.Errorf("B holds %q, want A's at %s: %q (A now: %q)", got, x, atX, nowA)
	}
	sysB := queryString(t, ctx, urlB, "SELECT system_identifier::text FROM pg_control_system()")
	if sysB == sysA {
		t.Errorf("B has A's system identifier %s", sysA)
	}
	ua, errA := url.Parse(r.URL)
	ub, errB := url.Parse(urlB)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	pwA, _ := ua.User.Password()
	pwB, _ := ub.User.Password()
	if pwA == "" || pwB == pwA {
		t.Errorf("B's superuser password %q, A's %q: want one of B's own", pwB, pwA)
	}
	exec1(t, ctx, urlB, "INSERT INTO keep SELECT generate_series(501, 600)")
	pgtool(t, urlB, "pgbench", "-n", "-c", "2", "-t", "100")
	pgtool(t, urlB, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	urlB = downUp(t, ctx, b)
	if got := queryString(t, ctx, urlB, "SELECT count(*) FROM keep"); got != "600" {
		t.Errorf("B after down and up: keep has %s rows, want 600", got)
	}
	if err := b.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	// The safekeepers upload the partial segment as they stop: B's WAL is
	// archived under its own system identifier, beside A's.
	store, err := fs.New(aCfg.ObjectStore.FS, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, sys := range []string{sysA, sysB} {
		n := 0
		err := store.List(ctx, "wal/"+sys+"/", func(objectstore.ObjectInfo) error { n++; return nil })
		if err != nil || n == 0 {
			t.Errorf("%d archived WAL objects of system %s in the shared store: %v", n, sys, err)
		}
	}
	// A second import on B is refused: it holds data.
	_, err = b.Import(ctx, dir, func(string) {})
	if err == nil || !strings.Contains(err.Error(), "holds this import already") {
		t.Errorf("a second import on B: %v, want a refusal saying it holds this import already", err)
	}
	if got := queryString(t, ctx, urlA, restoreCheck); got != nowA {
		t.Errorf("A after the import: %q, want %q", got, nowA)
	}
	// A folder that cannot be imported is refused before anything starts.
	c, _ := newTestCluster(t)
	if _, err := c.Import(ctx, filepath.Join(root, "nothing"), func(string) {}); !errors.Is(err, agent.ErrImport) {
		t.Errorf("an import of a folder that does not exist: %v, want agent.ErrImport", err)
	}
	if _, ok := c.Running(); ok {
		t.Error("a refused import left the cluster running")
	}
}

// TestImportStockFolder: moving a database onto strata. A stock server's
// folder (not strata's: its own pg_hba.conf, no strata.conf, a second
// database, an ALTER SYSTEM setting) is refused while it was not shut
// down cleanly (kill -9), with nothing started; after a clean stop
// `strata up --import` serves both databases with their data and the
// setting, takes writes, keeps them across a down and up, and pg_amcheck
// is clean.
func TestImportStockFolder(t *testing.T) {
	t.Parallel()
	s := stockFolder(t)
	s.Kill9()

	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.Import(ctx, s.DataDir, func(string) {}); !errors.Is(err, agent.ErrImport) || !strings.Contains(err.Error(), "pg_ctl stop") {
		t.Fatalf("an import of a crashed server's folder: %v, want agent.ErrImport saying to stop it cleanly", err)
	}
	if _, ok := c.Running(); ok {
		t.Fatal("a refused import left the cluster running")
	}
	s.Launch() // crash recovery
	s.Stop()

	checkStockImport(t, ctx, c, s.DataDir)
}

// TestImportStockFolderRedo: the same import in redo mode, where the
// folder's relation pages become the redo timeline's base (as initdb's
// output does) and a small local page store sends reads to the
// pageserver, before and after a down and up.
func TestImportStockFolderRedo(t *testing.T) {
	t.Parallel()
	s := stockFolder(t)
	s.Stop()
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	checkStockImport(t, ctx, c, s.DataDir)
}

// stockFolder starts a stock server and gives it what TestImportStockFolder
// checks for.
func stockFolder(t *testing.T) *pgtest.Server {
	s := pgtest.Start(t, pgtest.Options{})
	s.Exec("postgres", "CREATE TABLE f AS SELECT g AS id, repeat('z', 100) AS pad FROM generate_series(1, 20000) g")
	s.Exec("postgres", "CREATE INDEX ON f (id)")
	s.Exec("postgres", "CREATE DATABASE other")
	s.Exec("other", "CREATE TABLE o AS SELECT 42 AS x")
	s.Exec("postgres", "ALTER SYSTEM SET work_mem = '12MB'")
	return s
}

// checkStockImport imports the stopped folder dir into c and checks the
// data, a write, a down and up, and pg_amcheck.
func checkStockImport(t *testing.T, ctx context.Context, c *Cluster, dir string) {
	t.Helper()
	url, err := c.Import(ctx, dir, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, url, "SELECT count(*) || ' ' || current_setting('work_mem') FROM f"); got != "20000 12MB" {
		t.Errorf("the imported cluster: %q, want 20000 rows and work_mem 12MB", got)
	}
	other := strings.Replace(url, "/postgres?", "/other?", 1)
	if got := queryString(t, ctx, other, "SELECT x::text FROM o"); got != "42" {
		t.Errorf("database other: %q, want 42", got)
	}
	exec1(t, ctx, url, "INSERT INTO f SELECT g, 'n' FROM generate_series(20001, 30000) g")
	url = downUp(t, ctx, c)
	if got := queryString(t, ctx, url, "SELECT count(*) || ' ' || sum(id) FROM f"); got != "30000 450015000" {
		t.Errorf("after down and up: %q, want 30000 rows summing to 450015000", got)
	}
	pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
}

// downUp stops the cluster and starts it again, and returns its URL.
func downUp(t *testing.T, ctx context.Context, c *Cluster) string {
	t.Helper()
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	url, err := c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	return url
}
