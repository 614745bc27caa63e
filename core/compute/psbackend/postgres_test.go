package psbackend_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/pstest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

func logWaits(t *testing.T, name string, f *fusefs.FS) {
	w := f.Waits()
	k := relpath.KindRel
	hits, misses := w.CacheHits()
	t.Logf("%s: GetPage %d (%v), relation writes %d (%v), fsync waits %d (%v), cache hits/misses %d/%d", name,
		w.Count(fusefs.OpGetPage, k), w.Total(fusefs.OpGetPage, k).Round(time.Millisecond),
		w.Count(fusefs.OpWrite, k), w.Total(fusefs.OpWrite, k).Round(time.Millisecond),
		w.Count(fusefs.OpFsync, k)+w.Count(fusefs.OpFsync, relpath.KindOther),
		(w.Total(fusefs.OpFsync, k) + w.Total(fusefs.OpFsync, relpath.KindOther)).Round(time.Millisecond), hits, misses)
}

const checkSQL = `SELECT (SELECT count(*) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(abalance) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(bbalance) FROM pgbench_branches)::text || ' ' ||
	(SELECT coalesce(sum(delta),0) FROM pgbench_history)::text || ' ' ||
	(SELECT count(*) FROM pgbench_history)::text`

// mountPS mounts PGDATA over a psbackend on h's timeline, with W starting
// at walStart, and a goroutine that stands in for the safekeepers: it
// advances the timeline's commit LSN to the WAL position the filesystem
// tracks (what Postgres wrote to pg_wal). It returns the filesystem and a
// function that stops the advancer and unmounts.
func mountPS(t *testing.T, h *harness, mnt, scratch string, uid, gid uint32, walStart pg.LSN) (*fusefs.FS, func()) {
	t.Helper()
	be := open(t, h, psbackend.Options{})
	f, err := fusefs.Mount(context.Background(), mnt, fusefs.Options{
		Backend: be, Cache: fusefs.NewMemCache(4096), WALScratch: scratch, UID: uid, GID: gid,
		WALStart: walStart, Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopFollow := pstest.FollowCommit(t, h.c, tl, f.WAL().Current)
	var once sync.Once
	done := func() {
		once.Do(func() {
			stopFollow()
			if err := f.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
			}
			fusefs.MountpointCleanup(mnt)
			if err := be.Close(); err != nil {
				t.Errorf("close backend: %v", err)
			}
		})
	}
	t.Cleanup(done)
	return f, done
}

// TestPostgresOnPageserver: initdb, pgbench and pg_amcheck with PGDATA on
// a FUSE mount over psbackend (writeback to an in-process pageserver whose
// commit LSN follows the WAL Postgres writes); then Postgres stops, the
// mount goes, the pageserver restarts on its data folder, and a fresh
// compute (new mount, new Backend, empty caches) checks the data.
func TestPostgresOnPageserver(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	psDir := t.TempDir()
	store := objectstore.NewMemory()
	h := start(t, psDir, store)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	root := pgtest.MkdirOwned(t, "strata-psbackend-")
	mnt, scratch := filepath.Join(root, "data"), filepath.Join(root, "walscratch")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(mnt); err != nil {
		t.Fatal(err)
	}
	var uid, gid uint32
	if cred, err := pgtest.Credential(); err != nil {
		t.Fatal(err)
	} else if cred != nil {
		uid, gid = cred.Uid, cred.Gid
	}

	fsys, unmount := mountPS(t, h, mnt, scratch, uid, gid, 0)
	t0 := time.Now()
	cmd, err := pgtest.Command("initdb", "-D", mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	t.Logf("initdb on the mount: %v", time.Since(t0).Round(time.Millisecond))
	f, err := os.OpenFile(filepath.Join(mnt, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("shared_buffers = 16MB\nfsync = on\nlog_min_messages = warning\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()

	p := pgtest.StartOn(t, mnt, root, 0)
	t1 := time.Now()
	p.Run("pgbench", "-i", "-s", "1", "postgres")
	t.Logf("pgbench -i -s 1: %v", time.Since(t1).Round(time.Millisecond))
	// 1,200 transactions (5 s made about 4,900 under the default run's load).
	out := p.Run("pgbench", "-c", "4", "-j", "2", "-t", "300", "postgres")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tps") || strings.Contains(line, "number of transactions actually") {
			t.Logf("pgbench: %s", line)
		}
	}
	p.Run("psql", "-c", "CREATE TABLE tt AS SELECT g AS id, md5(g::text) AS s FROM generate_series(1, 20000) g", "-c", "CREATE INDEX ON tt (s)",
		"-c", "CREATE DATABASE d2", "-c", "CHECKPOINT", "postgres")
	p.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	before := p.Query(checkSQL)
	fields := strings.Fields(before)
	if len(fields) != 5 || fields[0] != "100000" || fields[1] != fields[2] || fields[1] != fields[3] || fields[4] == "0" {
		t.Fatalf("pgbench invariants broken: %s", before)
	}
	t.Logf("before restart: accounts, sum(abalance), sum(bbalance), sum(delta), history = %s", before)
	p.Stop()
	w := fsys.WAL().Current()
	unmount()
	info, err := h.c.ListTimelines(ctx)
	if err != nil || len(info) != 1 {
		t.Fatalf("timelines %v, %v", info, err)
	}
	t.Logf("first compute: W %v; pageserver LSNs %+v", w, info[0].LSNs)
	if info[0].LSNs.Pending != 0 {
		t.Fatalf("%d versions still pending after the commit LSN reached W", info[0].LSNs.Pending)
	}

	// Restart the pageserver on its data folder, then a fresh compute.
	h.stop()
	h2 := start(t, psDir, store)
	fsys2, unmount2 := mountPS(t, h2, mnt, scratch, uid, gid, w)
	p2 := pgtest.StartOn(t, mnt, root, 0)
	if after := p2.Query(checkSQL); after != before {
		t.Fatalf("after restart %s; before %s", after, before)
	}
	if got := p2.Query("SELECT (SELECT count(*) FROM tt)::text || ' ' || (SELECT count(*) FROM pg_database WHERE datname = 'd2')::text"); got != "20000 1" {
		t.Fatalf("after restart: tt rows and d2 = %s", got)
	}
	p2.Run("pg_amcheck", "--all", "--heapallindexed")
	p2.Run("pgbench", "-c", "2", "-t", "100", "postgres")
	if got := p2.Query("SELECT count(*)::text FROM pgbench_history"); got == fields[4] {
		t.Fatalf("history did not grow: %s", got)
	}
	p2.Stop()
	logWaits(t, "first compute", fsys)
	logWaits(t, "fresh compute", fsys2)
	if n := fsys2.Waits().Count(fusefs.OpGetPage, relpath.KindRel); n == 0 {
		t.Fatal("fresh compute read no page from the pageserver")
	}
	t.Logf("fresh compute: W %v", fsys2.WAL().Current())
	unmount2()
}
