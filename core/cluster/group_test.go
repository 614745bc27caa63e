package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
)

// setGroup changes the safekeeper group of c, in process and for the
// processes it starts (the agent reads cluster.quorum from the config).
func setGroup(t *testing.T, c *Cluster, size, quorum int) {
	t.Setenv("STRATA_CLUSTER_SAFEKEEPERS", itoa(size))
	t.Setenv("STRATA_CLUSTER_QUORUM", itoa(quorum))
	c.cfg.Cluster.Safekeepers, c.cfg.Cluster.Quorum = size, quorum
}

// allStreamAtTheEnd waits until n safekeepers stream from Postgres with
// every WAL byte flushed.
func allStreamAtTheEnd(t *testing.T, ctx context.Context, url string, n int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var k int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn = pg_current_wal_lsn()").Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d safekeepers at the end of WAL after a minute", k, n)
		}
	}
}

// TestSafekeeperGroupChange: growing the group from 3 (quorum 2) to 5
// (quorum 3) while sk3 lacks the last commits is refused before anything
// starts (three of the five, sk3 and the two new ones, could elect
// without those commits); after a run with the old group, in which sk3
// catches up, the change goes through and keeps every row.
func TestSafekeeperGroupChange(t *testing.T) {
	c, _ := newTestCluster(t)
	c.cfg.Cluster.SafekeeperPort = consecutiveFree(t, 6) // 5 safekeepers and the pageserver
	t.Setenv("STRATA_CLUSTER_SAFEKEEPER_PORT", itoa(c.cfg.Cluster.SafekeeperPort))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, st := upWithTable(t, ctx, c)
	for _, p := range st.Procs {
		if p.Name == "safekeeper sk3" {
			syscall.Kill(-p.PID, syscall.SIGKILL)
		}
	}
	exec1(t, ctx, url, "INSERT INTO t SELECT generate_series(1, 1000)")
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}

	setGroup(t, c, 5, 3)
	_, err := c.Up(ctx, func(string) {})
	if err == nil || !strings.Contains(err.Error(), "could lose acknowledged commits") || !strings.Contains(err.Error(), "sk3 (") {
		t.Fatalf("growing the group while sk3 lags: %v", err)
	}
	if _, running := c.Running(); running {
		t.Fatal("a refused up left processes running")
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "safekeepers", "sk4")); err == nil {
		t.Fatal("a refused up made a folder for sk4")
	}

	setGroup(t, c, 3, 2)
	url, err = c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	allStreamAtTheEnd(t, ctx, url, 3)
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}

	setGroup(t, c, 5, 3)
	var lines []string
	url, err = c.Up(ctx, func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatalf("growing the group with every safekeeper caught up: %v", err)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "the safekeeper group changes from 3 (quorum 2) to 5 (quorum 3): sk1, sk2, sk3 hold all the WAL") {
		t.Fatalf("up did not say that the group changes: %q", lines)
	}
	exec1(t, ctx, url, "INSERT INTO t VALUES (0)")
	if n := queryString(t, ctx, url, "SELECT count(*)::text FROM t"); n != "1001" {
		t.Fatalf("%s rows after the change, want 1001", n)
	}
	if b, err := os.ReadFile(c.groupFile()); err != nil || string(b) != "5 3\n" {
		t.Fatalf("group file: %q, %v", b, err)
	}
}

// TestLastGroup: the recorded group, or for a cluster from before the
// record, one member per safekeeper folder with a majority quorum.
func TestLastGroup(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Cluster.DataDir = dir
	c, err := New(&cfg, "strata", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.lastGroup(); ok || err != nil {
		t.Fatalf("new cluster: ok %v, %v", ok, err)
	}
	for i := 1; i <= 3; i++ {
		st, err := walstore.Open(walstore.Options{Dir: c.memberDir(i), Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	if g, ok, err := c.lastGroup(); !ok || err != nil || g != (group{3, 2}) {
		t.Fatalf("three folders, no record: %v %v %v", g, ok, err)
	}
	cfg.Cluster.Quorum = 3
	if g, ok, err := c.lastGroup(); !ok || err != nil || g != (group{3, 3}) {
		t.Fatalf("three folders, no record, the config's quorum 3: %v %v %v", g, ok, err)
	}
	cfg.Cluster.Quorum = 2
	if line, err := c.checkGroupChange(); line != "" || err != nil {
		t.Fatalf("the same group: %q %v", line, err)
	}
	cfg.Cluster.Safekeepers, cfg.Cluster.Quorum = 5, 3
	if line, err := c.checkGroupChange(); err != nil || !strings.Contains(line, "from 3 (quorum 2) to 5 (quorum 3)") {
		t.Fatalf("growing empty members: %q %v", line, err)
	}
	if err := c.saveGroup(); err != nil {
		t.Fatal(err)
	}
	if g, ok, err := c.lastGroup(); !ok || err != nil || g != (group{5, 3}) {
		t.Fatalf("recorded: %v %v %v", g, ok, err)
	}
	os.WriteFile(c.groupFile(), []byte("five\n"), 0o644)
	if _, _, err := c.lastGroup(); err == nil || !strings.Contains(err.Error(), "want \"<safekeepers> <quorum>\"") {
		t.Fatalf("a damaged record: %v", err)
	}
}

// TestUpInterrupted: an up interrupted while the compute starts (Ctrl-C)
// stops what it started, says so, and the next up starts the cluster.
func TestUpInterrupted(t *testing.T) {
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := c.Up(ctx, func(s string) {
		if strings.HasPrefix(s, "compute agent") {
			cancel()
		}
	})
	if err == nil || !strings.Contains(err.Error(), "up interrupted; the processes it had started are stopped") {
		t.Fatalf("interrupted up: %v", err)
	}
	if _, running := c.Running(); running {
		t.Fatal("an interrupted up left processes running")
	}
	if strays := c.strayError(); strays != nil {
		t.Fatal(strays)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel2()
	url, err := c.Up(ctx2, func(string) {})
	if err != nil {
		t.Fatalf("up after an interrupted one: %v", err)
	}
	exec1(t, ctx2, url, "CREATE TABLE t (id int)")
}

// TestSafekeeperFoldersLost: a cluster whose safekeeper folders are all
// gone (the pageserver's timeline and the object store intact) cannot
// start, since Postgres needs the WAL of its last checkpoint; up says so
// instead of "storage is ahead of the safekeepers".
func TestSafekeeperFoldersLost(t *testing.T) {
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	upWithTable(t, ctx, c)
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.dataDir, "safekeepers")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Up(ctx, func(string) {})
	if err == nil || !strings.Contains(err.Error(), "the safekeepers hold none of its WAL") {
		t.Fatalf("up without the safekeepers' WAL: %v", err)
	}
	if _, running := c.Running(); running {
		t.Fatal("a failed up left processes running")
	}
}

// TestObjectStoreChanged: a cluster moved to another object store between
// a down and an up (another fs root) ends up whole in the new store: with
// the pageserver's folder gone, it starts from the new store alone with
// every row, and the new store holds the safekeepers' archived WAL from
// its first segment. Before, the pageserver published manifests naming
// layers only the old store held ("object not found" at that start), and
// the safekeepers never archived the older WAL again.
func TestObjectStoreChanged(t *testing.T) {
	c, _ := newTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, _ := upWithTable(t, ctx, c)
	exec1(t, ctx, url, "INSERT INTO t SELECT generate_series(1, 300000)") // 16 MB of WAL and more: archived segments
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	newRoot := filepath.Join(filepath.Dir(c.cfg.ObjectStore.FS.Root), "objects2")
	t.Setenv("STRATA_OBJECTSTORE_FS_ROOT", newRoot)
	c.cfg.ObjectStore.FS.Root = newRoot
	url, err := c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "INSERT INTO t VALUES (0)")
	// The first segment is archived again by its owner (sk1).
	first := filepath.Join(newRoot, "wal%")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		ms, _ := filepath.Glob(filepath.Join(first, "*", "000000010000000000000001"))
		if len(ms) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new store has no archived first segment after a minute (%s)", first)
		}
	}
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.dataDir, "pageserver")); err != nil {
		t.Fatal(err)
	}
	url, err = c.Up(ctx, func(string) {})
	if err != nil {
		t.Fatalf("up from the new store alone: %v", err)
	}
	if n := queryString(t, ctx, url, "SELECT count(*)::text FROM t"); n != "300001" {
		t.Fatalf("%s rows from the new store, want 300001", n)
	}
}

// TestCheckStore: a new cluster on an object store that holds
// another cluster's timeline says so before it makes its own; on an empty
// store it says nothing; a store that cannot be used fails the up.
func TestCheckStore(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Cluster.DataDir = filepath.Join(dir, "state")
	cfg.ObjectStore.FS.Root = filepath.Join(dir, "objects")
	cfg.ObjectStore.FS.NoSync = true
	c, err := New(&cfg, "strata", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if line, err := c.checkStore(ctx, true); line != "" || err != nil {
		t.Fatalf("an empty store: %q, %v", line, err)
	}
	st, err := objstore.Open(ctx, cfg.ObjectStore, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	other := pg.TimelineID{0xAB, 0xCD}
	if err := (&manifest.Remote{Store: st}).Publish(ctx, other, &manifest.Manifest{Version: 1, Timeline: other.String(), Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if line, err := c.checkStore(ctx, true); err != nil || !strings.Contains(line, "already holds 1 timeline(s) of other clusters ("+other.String()+")") {
		t.Fatalf("a store with another cluster's timeline: %q, %v", line, err)
	}
	if line, err := c.checkStore(ctx, false); line != "" || err != nil {
		t.Fatalf("the same store for a cluster that has its timeline: %q, %v", line, err)
	}

	// A store that cannot be listed fails the check, in its own words.
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.ObjectStore.FS.Root = filepath.Join(dir, "file", "objects")
	if c, err = New(&cfg, "strata", zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.checkStore(ctx, true); err == nil || !strings.Contains(err.Error(), "so nothing was started") && !strings.Contains(err.Error(), "before starting anything") {
		t.Fatalf("a store under a file: %v", err)
	}
}
