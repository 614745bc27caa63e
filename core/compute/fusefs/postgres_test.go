package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

const checkSQL = `SELECT (SELECT count(*) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(abalance) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(bbalance) FROM pgbench_branches)::text || ' ' ||
	(SELECT coalesce(sum(delta),0) FROM pgbench_history)::text || ' ' ||
	(SELECT count(*) FROM pgbench_history)::text`

// TestPostgresOnMount runs initdb, pgbench and pg_amcheck with PGDATA on the
// mount over the in-memory Backend, then starts a fresh compute (a new mount
// over the same Backend, nothing in shared_buffers or the kernel) and checks
// the data.
func TestPostgresOnMount(t *testing.T) {
	mem := NewMemory()
	chk := &lsnChecker{Backend: mem}
	postgresOnMount(t, chk, mem.MaxW, false)
	chk.check(t)
}

// TestPostgresOnMountWALLink is the same run with pg_wal a link out of the
// mount to local scratch (initdb -X) and read-ahead on: WAL never crosses
// FUSE, and W comes from walking the WAL in scratch. Every write must still be tagged at or
// above the page's LSN, and W must reach the WAL Postgres wrote.
func TestPostgresOnMountWALLink(t *testing.T) {
	mem := NewMemory()
	chk := &lsnChecker{Backend: mem}
	postgresOnMount(t, chk, mem.MaxW, true)
	chk.check(t)
}

// TestPostgresOnMountLocalDir is the same run over the LocalDir Backend
// (STRATA_LONG_TESTS=1).
func TestPostgresOnMountLocalDir(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 not set")
	}
	be, err := NewLocalDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	postgresOnMount(t, be, nil, false)
}

func postgresOnMount(t *testing.T, be Backend, maxW func() pg.LSN, walLink bool) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	e := newEnv(t)
	e.walLink = walLink
	if walLink {
		e.readAhead = 16 // the production layout reads ahead too
	}
	fsys := e.mount(t, be, NewMemCache(4096))
	t0 := time.Now()
	args := []string{"-D", e.mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust"}
	if walLink {
		args = append(args, "-X", e.scratch)
	}
	cmd, err := pgtest.Command("initdb", args...)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	t.Logf("initdb on the mount: %v", time.Since(t0).Round(time.Millisecond))
	logWaits(t, fsys)
	// Small shared_buffers so that pages travel through FUSE all the time.
	conf := "shared_buffers = 16MB\nfsync = on\nmax_wal_size = 256MB\nlog_min_messages = warning\n"
	f, err := os.OpenFile(filepath.Join(e.mnt, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(conf); err != nil {
		t.Fatal(err)
	}
	f.Close()

	port := pgtest.FreePort(t)
	p := pgtest.StartOn(t, e.mnt, e.root, port)
	t1 := time.Now()
	p.Run("pgbench", "-i", "-s", "2", "postgres")
	t.Logf("pgbench -i -s 2: %v", time.Since(t1).Round(time.Millisecond))
	// A fixed count of transactions, not a duration: the default test run
	// is CPU-bound, and a duration takes the same time on a loaded machine
	// for less work. The WALLink run differs in where WAL goes, not in the
	// page path: half the transactions (4 x 400 is about half of what
	// 10 s gave under the default run's load).
	run := []string{"-t", "400"}
	if walLink {
		run = []string{"-t", "200"}
	}
	if s := os.Getenv("STRATA_FUSE_PGBENCH_SECONDS"); s != "" {
		run = []string{"-T", s}
	}
	out := p.Run("pgbench", append(append([]string{"-c", "4", "-j", "2"}, run...), "postgres")...)
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tps") || strings.Contains(line, "latency average") || strings.Contains(line, "number of transactions actually") {
			t.Logf("pgbench: %s", line)
		}
	}
	// DDL that unlinks, truncates, rewrites and copies relation files and
	// creates and removes database folders.
	p.Exec("CREATE DATABASE d2 STRATEGY FILE_COPY")
	p.Exec("CREATE DATABASE d3")
	p.Exec("DROP DATABASE d3")
	p.Exec("CREATE TABLE tt AS SELECT g AS id, md5(g::text) AS s FROM generate_series(1, 50000) g")
	p.Exec("CREATE INDEX ON tt (s)")
	p.Exec("TRUNCATE tt")
	p.Exec("INSERT INTO tt SELECT g, md5(g::text) FROM generate_series(1, 5) g")
	p.Exec("VACUUM FULL pgbench_tellers")
	p.Exec("CREATE TABLE gone AS SELECT generate_series(1, 1000) g")
	p.Exec("DROP TABLE gone")
	p.Exec("CHECKPOINT")
	p.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed", "--rootdescend")
	ddl := p.Query("SELECT (SELECT count(*) FROM tt)::text || ' ' || (SELECT count(*) FROM pg_database WHERE datname IN ('d2', 'd3'))::text || ' ' || (SELECT sum(tbalance) FROM pgbench_tellers)::text")
	if !strings.HasPrefix(ddl, "5 1 ") {
		t.Fatalf("after DDL: %s", ddl)
	}
	before := p.Query(checkSQL)
	fields := strings.Fields(before)
	if len(fields) != 5 || fields[0] != "200000" || fields[1] != fields[2] || fields[1] != fields[3] {
		t.Fatalf("pgbench invariants broken: %s", before)
	}
	t.Logf("before restart: accounts, sum(abalance), sum(bbalance), sum(delta), history = %s", before)
	p.Stop()
	w := fsys.Waits()
	t.Logf("first compute: rel reads %d, rel writes %d, GetPage %d (%v), fsync waits %d, W %v",
		w.Count(OpRead, relpath.KindRel), w.Count(OpWrite, relpath.KindRel), w.Count(OpGetPage, relpath.KindRel),
		w.Total(OpGetPage, relpath.KindRel).Round(time.Millisecond), w.Count(OpFsync, relpath.KindRel)+w.Count(OpFsync, relpath.KindOther),
		fsys.WAL().Current())
	if maxW != nil && (maxW() == 0 || maxW() > fsys.WAL().Current()) {
		t.Fatalf("writes tagged with W %v; WAL position %v", maxW(), fsys.WAL().Current())
	}
	if walLink {
		if target, err := os.Readlink(filepath.Join(e.mnt, "pg_wal")); err != nil || target != e.scratch {
			t.Fatalf("pg_wal links to %q (%v), want %q", target, err, e.scratch)
		}
		if n := fsys.Waits().Count(OpWrite, relpath.KindWAL); n != 0 {
			t.Fatalf("%d WAL writes crossed FUSE with pg_wal a link", n)
		}
		// W reached the end of the WAL Postgres wrote: past its shutdown
		// checkpoint record.
		cmd, err := pgtest.Command("pg_controldata", "-D", e.mnt)
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pg_controldata: %v\n%s", err, out)
		}
		var ckpt pg.LSN
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "Latest checkpoint location:"); ok {
				if ckpt, err = pg.ParseLSN(strings.TrimSpace(v)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if ckpt == 0 || fsys.WAL().Current() <= ckpt {
			t.Fatalf("W %v is not past the shutdown checkpoint at %v", fsys.WAL().Current(), ckpt)
		}
		if err := fsys.WAL().FollowErr(); err != nil {
			t.Fatalf("following pg_wal: %v", err)
		}
	}
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}

	// A fresh compute: new mount, new (empty) cache, same Backend; pg_wal
	// scratch kept (in production the safekeepers refill it).
	fsys2 := e.mountAt(t, be, NewMemCache(4096), fsys.WAL().Current())
	p2 := pgtest.StartOn(t, e.mnt, e.root, 0)
	after := p2.Query(checkSQL)
	if after != before {
		t.Fatalf("after restart %s; before %s", after, before)
	}
	if got := p2.Query("SELECT (SELECT count(*) FROM tt)::text || ' ' || (SELECT count(*) FROM pg_database WHERE datname IN ('d2', 'd3'))::text || ' ' || (SELECT sum(tbalance) FROM pgbench_tellers)::text"); got != ddl {
		t.Fatalf("after restart DDL state %q; before %q", got, ddl)
	}
	p2.Run("pg_amcheck", "--all", "--heapallindexed")
	// New writes work on the fresh compute too.
	p2.Run("pgbench", "-c", "2", "-t", "200", "postgres")
	if got := p2.Query("SELECT count(*)::text FROM pgbench_history"); got == fields[4] {
		t.Fatalf("history did not grow: %s", got)
	}
	if n := fsys2.Waits().Count(OpGetPage, relpath.KindRel); n == 0 {
		t.Fatal("fresh compute read no page from the Backend")
	}
	t.Logf("page writes with a page LSN above W (tagged with the page LSN): first compute %d, fresh compute %d",
		fsys.Waits().PageLSNAboveW(), fsys2.Waits().PageLSNAboveW())
	t.Logf("fresh compute: GetPage %d, cache hits/misses %v", fsys2.Waits().Count(OpGetPage, relpath.KindRel), fmt.Sprint(fsys2.Waits().CacheHits()))
	p2.Stop()
}

func logWaits(t *testing.T, fsys *FS) {
	w := fsys.Waits()
	for op := Op(0); op < numOps; op++ {
		for k := relpath.Kind(0); k < numKinds; k++ {
			if n := w.Count(op, k); n > 0 {
				t.Logf("  %s %s: %d ops, %v", opNames[op], k, n, w.Total(op, k).Round(time.Microsecond))
			}
		}
	}
}

// TestPostgresCrashOnMount kills every Postgres process in the middle of a
// pgbench run (full_page_writes=off: pages cannot tear on the mount), then
// starts a fresh compute over the same Backend and the kept pg_wal scratch:
// crash recovery must leave pgbench's invariants and pg_amcheck clean
// (STRATA_LONG_TESTS=1).
func TestPostgresCrashOnMount(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 not set")
	}
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	e := newEnv(t)
	be := NewMemory()
	fsys := e.mount(t, be, NewMemCache(4096))
	cmd, err := pgtest.Command("initdb", "-D", e.mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust", "--no-sync")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	f, err := os.OpenFile(filepath.Join(e.mnt, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("shared_buffers = 16MB\nfull_page_writes = off\ncheckpoint_timeout = 30s\n")
	f.Close()
	p := pgtest.StartOn(t, e.mnt, e.root, 0)
	p.Run("pgbench", "-i", "-s", "2", "postgres")
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, _ := pgtest.Command("pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres", "-c", "4", "-j", "2", "-T", "30", "postgres")
		_ = c.Run() // fails when the server dies
	}()
	time.Sleep(6 * time.Second)
	p.Crash()
	<-done
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}
	e.mount(t, be, NewMemCache(4096))
	p2 := pgtest.StartOn(t, e.mnt, e.root, 0)
	got := strings.Fields(p2.Query(checkSQL))
	if len(got) != 5 || got[0] != "200000" || got[1] != got[2] || got[1] != got[3] || got[4] == "0" {
		t.Fatalf("after crash recovery: %v", got)
	}
	t.Logf("after crash recovery: accounts, sum(abalance), sum(bbalance), sum(delta), history = %v", got)
	p2.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	p2.Stop()
}
