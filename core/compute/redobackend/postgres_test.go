package redobackend_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/redobackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/pstest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// start runs a pageserver on a fresh folder and an in-memory object store.
func start(t *testing.T) *pstest.Server {
	t.Helper()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.WaitLSNTimeout = 5 * time.Second
	return pstest.Start(t, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: objectstore.NewMemory()})
}

// mountRedo mounts PGDATA over a redobackend: relation pages in its local
// store (reads of other pages from rd), files through psbackend on the
// pageserver timeline files, whose commit LSN a goroutine advances to the
// WAL written (standing in for the safekeepers). The returned function
// unmounts.
func mountRedo(t *testing.T, h *pstest.Server, files pg.TimelineID, rd *timeline.Timeline, mnt, scratch string, uid, gid uint32, walStart pg.LSN, maxPages int) (*fusefs.FS, *redobackend.Backend, func()) {
	t.Helper()
	ctx := context.Background()
	fb, err := psbackend.Open(ctx, h.Client, files, psbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	be, err := redobackend.Open(ctx, redobackend.Options{Pages: redobackend.TimelinePages(rd), Files: fb, MaxPages: maxPages})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fusefs.Mount(ctx, mnt, fusefs.Options{
		Backend: be, WALScratch: scratch, UID: uid, GID: gid, WALStart: walStart,
		Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	be.SetWALPosition(f.WAL().Current)
	stopFollow := pstest.FollowCommit(t, h.Client, files, f.WAL().Current)
	var once sync.Once
	done := func() {
		once.Do(func() {
			stopFollow()
			if err := f.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
			}
			fusefs.MountpointCleanup(mnt)
			if err := fb.Close(); err != nil {
				t.Errorf("close files backend: %v", err)
			}
		})
	}
	t.Cleanup(done)
	return f, be, done
}

func lsnOf(t *testing.T, s string) pg.LSN {
	t.Helper()
	l, err := pg.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func controlCheckpoint(t *testing.T, dir string) pg.LSN {
	t.Helper()
	cmd, err := pgtest.Command("pg_controldata", "-D", dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pg_controldata: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "Latest checkpoint location" {
			return lsnOf(t, strings.TrimSpace(v))
		}
	}
	t.Fatalf("no checkpoint location in\n%s", out)
	return 0
}

// redoEnv is a pageserver with a files timeline and an in-process redo
// timeline that holds initdb's output (imported through the mount), and
// the folders of a compute: PGDATA is not mounted when newRedoEnv returns.
type redoEnv struct {
	h            *pstest.Server
	files        pg.TimelineID
	rd           *timeline.Timeline
	root         string
	mnt, scratch string
	uid, gid     uint32
	base         pg.LSN // initdb's last checkpoint: where WAL ingest starts
}

func newRedoEnv(t *testing.T) *redoEnv {
	t.Helper()
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
	h := start(t)
	files := pg.TimelineID{0x4E, 1}
	if _, err := h.Client.CreateTimeline(ctx, files); err != nil {
		t.Fatal(err)
	}
	commit := &timeline.CommitLSN{}
	commit.Set(timeline.LatestLSN - 1)
	rd, err := timeline.Open(ctx, pg.TimelineID{0x4E, 2}, t.TempDir(), timeline.Options{WaitLSNTimeout: 20 * time.Second}, timeline.Deps{
		Log: zerolog.Nop(), Commit: commit, Policy: timeline.PushdownPolicy{N: 3},
		Redo: walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })

	root := pgtest.MkdirOwned(t, "strata-redobackend-")
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
	_, be, unmount := mountRedo(t, h, files, rd, mnt, scratch, uid, gid, 0, 0)
	cmd, err := pgtest.Command("initdb", "-D", mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("shared_buffers = 16MB\nfsync = on\nlog_min_messages = warning\nfull_page_writes = off\nwal_log_hints = on\n" +
		"wal_level = replica\nwal_keep_size = '1GB'\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	base := controlCheckpoint(t, mnt)
	// The redo timeline's base: initdb's output, read through the mount
	// (its relation pages come from the compute's local store).
	if err := pageserver.ImportDataDir(ctx, rd, mnt, base); err != nil {
		t.Fatal(err)
	}
	if s := be.Stats(); s.Pages == 0 {
		t.Fatalf("initdb left no page in the local store: %+v", s)
	}
	unmount()

	return &redoEnv{h: h, files: files, rd: rd, root: root, mnt: mnt, scratch: scratch, uid: uid, gid: gid, base: base}
}

const checkSQL = `SELECT concat_ws(' ',
	(SELECT count(*) FROM pgbench_accounts), (SELECT sum(abalance) FROM pgbench_accounts),
	(SELECT sum(bbalance) FROM pgbench_branches), (SELECT count(*) FROM pgbench_history),
	(SELECT md5(string_agg(id || ':' || v, ',' ORDER BY id)) FROM r_t))`

// TestPostgresInRedoMode: initdb, pgbench (scale 1) and DDL run on a FUSE mount over
// redobackend, whose relation pages never leave the compute (a small local
// store, so pages are evicted and read back from the pageserver); the
// pageserver's redo timeline holds initdb's output (imported once) and is
// fed the compute's WAL (ingested from the compute's pg_wal while
// Postgres runs). Then a fresh compute (new mount, new Backend, empty
// store) starts on the same storage and sees the same data, pg_amcheck
// clean.
func TestPostgresInRedoMode(t *testing.T) {
	env := newRedoEnv(t)
	ctx := context.Background()
	h, files, rd, root, mnt, scratch, uid, gid, base := env.h, env.files, env.rd, env.root, env.mnt, env.scratch, env.uid, env.gid, env.base
	// The compute again, now with a small store: evicted pages come back
	// from the redo timeline, which a goroutine feeds with the WAL.
	fsys, be, unmount := mountRedo(t, h, files, rd, mnt, scratch, uid, gid, base, 300)
	ingestCtx, stopIngest := context.WithCancel(ctx)
	ingestDone := make(chan error, 1)
	go func() { ingestDone <- followWAL(ingestCtx, rd, scratch, base, nil) }()
	p := pgtest.StartOn(t, mnt, root, 0)
	p.Run("pgbench", "-i", "-s", "1", "-q", "postgres")
	p.Run("pgbench", "-c", "2", "-j", "2", "-t", "300", "postgres")
	p.Exec(`CREATE TABLE r_t (id int PRIMARY KEY, v text);
		INSERT INTO r_t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
		CREATE INDEX ON r_t (v);
		UPDATE r_t SET v = 'u' || id WHERE id % 3 = 0;
		DELETE FROM r_t WHERE id % 11 = 0`)
	p.Exec("VACUUM r_t")
	p.Exec("CHECKPOINT")
	p.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	want := p.Query(checkSQL)
	s := be.Stats()
	t.Logf("first compute: %s; local store %+v", want, s)
	if s.Evicted == 0 {
		t.Fatal("no page was evicted from the local store: the pageserver path was not exercised")
	}
	p.Stop()
	w := fsys.WAL().Current()
	unmount()
	stopIngest()
	<-ingestDone
	// Whatever the follower had not reached: ingest to the end of the WAL.
	if _, err := (&walingest.Ingester{TL: rd}).Run(ctx, mustDir(t, scratch), rd.LSNs().LastRecord); err != nil {
		t.Fatal(err)
	}
	last := rd.LSNs().LastRecord
	if last < w {
		t.Fatalf("redo timeline at %s, below the compute's W %s", last, w)
	}
	t.Logf("redo timeline ingested to %s; compute W %s", last, w)

	// A fresh compute: empty store, pages from WAL only.
	_, be2, unmount2 := mountRedo(t, h, files, rd, mnt, scratch, uid, gid, last, 300)
	ingestCtx, stopIngest = context.WithCancel(ctx)
	go func() { ingestDone <- followWAL(ingestCtx, rd, scratch, last, nil) }()
	p2 := pgtest.StartOn(t, mnt, root, 0)
	if got := p2.Query(checkSQL); got != want {
		t.Fatalf("fresh compute: %s, want %s", got, want)
	}
	p2.Run("pg_amcheck", "--all", "--heapallindexed")
	t.Logf("fresh compute: same data; local store %+v", be2.Stats())

	// kill -9 of Postgres in the middle of pgbench, and the compute's store
	// lost with it: a third compute starts on storage alone (pg_control
	// and pg_xact from the files timeline, pages from WAL at the end of
	// the complete records) and Postgres' crash recovery makes it
	// consistent.
	// -n: no VACUUM and no TRUNCATE of pgbench_history first, so that
	// sum(delta) keeps matching the balances.
	bench := make(chan error, 1)
	go func() {
		cmd, err := pgtest.Command("pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(p2.Port), "-U", "postgres", "-n", "-c", "2", "-j", "2", "-T", "20", "postgres")
		if err == nil {
			_, err = cmd.CombinedOutput()
		}
		bench <- err
	}()
	time.Sleep(4 * time.Second)
	p2.Crash()
	<-bench // fails: its server went away
	time.Sleep(500 * time.Millisecond)
	unmount2()
	stopIngest()
	<-ingestDone
	if _, err := (&walingest.Ingester{TL: rd}).Run(ctx, mustDir(t, scratch), rd.LSNs().LastRecord); err != nil {
		t.Fatal(err)
	}
	end := rd.LSNs().LastRecord
	_, be3, unmount3 := mountRedo(t, h, files, rd, mnt, scratch, uid, gid, end, 0)
	p3 := pgtest.StartOn(t, mnt, root, 0)
	got := strings.Fields(p3.Query(checkSQL))
	if len(got) != 5 || got[1] != got[2] || got[4] != strings.Fields(want)[4] {
		t.Fatalf("after kill -9 and a lost store: %v (pgbench balances must agree, r_t unchanged; before the crash %s)", got, want)
	}
	if inv := p3.Query(`SELECT concat_ws(' ', (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(tbalance) FROM pgbench_tellers),
		(SELECT coalesce(sum(delta), 0) FROM pgbench_history))`); len(strings.Fields(inv)) != 3 || strings.Fields(inv)[0] != strings.Fields(inv)[1] || strings.Fields(inv)[0] != strings.Fields(inv)[2] {
		t.Fatalf("pgbench invariants broken after crash recovery: %s", inv)
	}
	p3.Run("pg_amcheck", "--all", "--heapallindexed")
	p3.Stop()
	t.Logf("after kill -9, a compute with an empty store recovered from WAL at %s: %v; local store %+v", end, got, be3.Stats())
	unmount3()
}

// TestFileCopyInRedoMode: CREATE DATABASE ... STRATEGY FILE_COPY copies
// the template's files before it logs the copy, so the clone's pages carry
// the template's page LSNs, older than the record that creates them on the
// pageserver. With the pageserver held behind the compute and a small
// local store, the clone's evicted pages are read back: the pageserver
// does not have them at their page LSN, the backend asks again at the
// compute's WAL position (and the pageserver waits for the copy record),
// never answering zeros. The clone must read like its template and pass
// pg_amcheck.
func TestFileCopyInRedoMode(t *testing.T) {
	env := newRedoEnv(t)
	ctx := context.Background()
	fsys, be, unmount := mountRedo(t, env.h, env.files, env.rd, env.mnt, env.scratch, env.uid, env.gid, env.base, 200)
	var hold atomic.Bool
	ingestCtx, stopIngest := context.WithCancel(ctx)
	ingestDone := make(chan error, 1)
	go func() { ingestDone <- followWAL(ingestCtx, env.rd, env.scratch, env.base, &hold) }()
	defer func() {
		stopIngest()
		<-ingestDone
	}()
	p := pgtest.StartOn(t, env.mnt, env.root, 0)
	defer p.Stop()
	const sum = `SELECT count(*) || ' ' || md5(string_agg(id || ':' || v, ',' ORDER BY id)) FROM t`
	p.Run("psql", "-d", "template1", "-v", "ON_ERROR_STOP=1", "-qc",
		`CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g`)
	want := strings.TrimSpace(p.Run("psql", "-d", "template1", "-Atc", sum))
	// The pageserver catches up (so that CREATE DATABASE reads the
	// template without waiting), then is held.
	p.Exec("CHECKPOINT")
	w := fsys.WAL().Current()
	for deadline := time.Now().Add(20 * time.Second); env.rd.LSNs().LastRecord < w; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the redo timeline did not reach %s (at %s)", w, env.rd.LSNs().LastRecord)
		}
	}
	hold.Store(true)
	release := time.AfterFunc(4*time.Second, func() { hold.Store(false) })
	defer release.Stop()
	p.Exec("CREATE DATABASE clone TEMPLATE template1 STRATEGY FILE_COPY")
	if got := strings.TrimSpace(p.Run("psql", "-d", "clone", "-Atc", sum)); got != want {
		t.Fatalf("clone reads %q, template %q", got, want)
	}
	p.Run("pg_amcheck", "--install-missing", "-d", "clone", "--heapallindexed")
	s := be.Stats()
	t.Logf("clone reads like its template (%s); local store %+v", want, s)
	if s.Refetches == 0 {
		t.Fatalf("stats %+v: no evicted page was asked for again at the WAL position: the FILE_COPY case was not exercised", s)
	}
	p.Stop()
	unmount()
}

func mustDir(t *testing.T, dir string) wal.Source {
	t.Helper()
	src, err := wal.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// followWAL ingests the WAL Postgres writes into scratch, every 20 ms from
// where the timeline's applied WAL ends, until ctx ends. A pass stops at
// the end of the complete records it finds (or at a page being written,
// which the next pass reads again).
// While hold (if not nil) is set, it ingests nothing: the pageserver lags.
func followWAL(ctx context.Context, tl *timeline.Timeline, scratch string, from pg.LSN, hold *atomic.Bool) error {
	for ctx.Err() == nil {
		if hold != nil && hold.Load() {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		next := max(from, tl.LSNs().LastRecord)
		if src, err := wal.OpenDir(scratch); err == nil {
			_, _ = (&walingest.Ingester{TL: tl}).Run(ctx, src, next)
			src.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return ctx.Err()
}
