package pageserver_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// controlData returns pg_controldata's "Label: value" lines as a map.
func controlData(t *testing.T, dir string) map[string]string {
	t.Helper()
	cmd, err := pgtest.Command("pg_controldata", "-D", dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pg_controldata: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

func parseLSN(t *testing.T, s string) pg.LSN {
	t.Helper()
	l, err := pg.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// redoTimeline opens a timeline with the Go redo engine and the pushdown
// policy, as a redo-mode pageserver has.
func redoTimeline(t *testing.T, n int) *timeline.Timeline {
	t.Helper()
	commit := &timeline.CommitLSN{}
	commit.Set(timeline.LatestLSN - 1)
	tl, err := timeline.Open(context.Background(), pg.TimelineID{0xBB, byte(n)}, t.TempDir(), timeline.Options{NoBackground: true}, timeline.Deps{
		Log: zerolog.Nop(), Commit: commit, Policy: timeline.PushdownPolicy{N: 3},
		Redo: walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close() })
	return tl
}

// untarWAL extracts a basebackup into dir (owned by the postgres OS user).
func untarWAL(t *testing.T, r io.Reader, dir string) (files []string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			files = append(files, h.Name)
		}
		if err := pgtest.Chown(p); err != nil {
			t.Fatal(err)
		}
	}
}

// copyWAL copies the WAL segment files of src from the one holding from
// on into dst.
func copyWAL(t *testing.T, src, dst string, from pg.LSN) int {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	first := fmt.Sprintf("%08X%08X%08X", 1, uint64(from)/pg.WALSegmentSize/0x100, uint64(from)/pg.WALSegmentSize%0x100)
	n := 0
	for _, e := range ents {
		if len(e.Name()) != 24 || e.Name()[8:] < first[8:] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, e.Name())
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := pgtest.Chown(p); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// startOn starts a stock postmaster on dir and returns its URL and port;
// it is stopped (SIGINT, then SIGKILL) at cleanup.
func startOn(t *testing.T, dir, sock string) (string, int) {
	t.Helper()
	port := pgtest.FreePort(t)
	cmd, err := pgtest.Command("postgres", "-D", dir, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+sock, "-c", "logging_collector=off")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(sock, "postgres.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			c.Close(ctx)
			return url, port
		}
		select {
		case err := <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("postgres exited: %v\n%s", err, b)
		default:
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("postgres did not start: %v\n%s", err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func queryString(t *testing.T, url, sql string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v string
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// resultSQL summarizes the workload's data: pgbench's balances and
// history, and a digest of every row of the DDL tables. A sequence comes
// back from WAL at its logged value (up to 32 ahead), as after any crash.
const resultSQL = `SELECT concat_ws(' ',
	(SELECT count(*) FROM pgbench_accounts), (SELECT sum(abalance) FROM pgbench_accounts),
	(SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum(tbalance) FROM pgbench_tellers),
	(SELECT count(*) FROM pgbench_history), (SELECT coalesce(sum(delta), 0) FROM pgbench_history),
	(SELECT md5(string_agg(id || ':' || v, ',' ORDER BY id)) FROM bb_t),
	(SELECT count(*) FROM bb_t WHERE v LIKE 'upd%'),
	(SELECT count(*) FROM bb_trunc), (SELECT last_value >= 40 FROM bb_seq))`

// TestBasebackupFromWAL: Postgres 15 runs on local disk with
// full_page_writes=off; the pageserver timeline gets initdb's output once
// (the imported base) and then only WAL (ingested from pg_wal, redo engine,
// pushdown policy): no page Postgres wrote ever reaches it. A basebackup of
// that timeline at an LSN X after the workload, with pg_control rebuilt
// from the last checkpoint before X and the WAL from its REDO point, starts
// a stock Postgres in an empty folder that returns the same query results
// and passes pg_amcheck.
func TestBasebackupFromWAL(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{
		"full_page_writes": "off", "wal_log_hints": "on", "wal_level": "replica", "wal_keep_size": "'1GB'", "max_wal_size": "'1GB'",
	}})
	srv.Stop()
	base := parseLSN(t, controlData(t, srv.DataDir)["Latest checkpoint location"])

	// The imported base: initdb's output, as a redo-mode pageserver gets it.
	tl := redoTimeline(t, 1)
	if err := pageserver.ImportDataDir(ctx, tl, srv.DataDir, base); err != nil {
		t.Fatal(err)
	}

	srv.Launch()
	if out, err := srv.Pgbench("-i", "-s", "2", "-q", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	srv.Exec("postgres", `CREATE TABLE bb_t (id int PRIMARY KEY, v text);
		INSERT INTO bb_t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
		CREATE INDEX ON bb_t (v);
		CREATE SEQUENCE bb_seq;
		CREATE TABLE bb_trunc AS SELECT g FROM generate_series(1, 5000) g`)
	srv.Exec("postgres", "CHECKPOINT")
	// After the checkpoint: what crash recovery must replay on top of
	// pages that are already newer.
	if out, err := srv.Pgbench("-c", "2", "-j", "2", "-t", "300", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	srv.Exec("postgres", `UPDATE bb_t SET v = 'upd' || id WHERE id % 5 = 0;
		DELETE FROM bb_t WHERE id % 7 = 0;
		SELECT nextval('bb_seq') FROM generate_series(1, 40);
		TRUNCATE bb_trunc;
		INSERT INTO bb_trunc SELECT g FROM generate_series(1, 100) g;
		ALTER TABLE bb_t ADD COLUMN w int DEFAULT 7`)
	srv.Exec("postgres", "VACUUM bb_t")
	want := srv.QueryString("postgres", resultSQL)
	x := parseLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_lsn()::text"))
	srv.Stop()

	walDir := filepath.Join(srv.DataDir, "pg_wal")
	src, err := wal.OpenDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	t0 := time.Now()
	last, err := (&walingest.Ingester{TL: tl}).Run(ctx, src, base)
	if err != nil {
		t.Fatal(err)
	}
	if last < x {
		t.Fatalf("ingested up to %s, want at least %s", last, x)
	}
	t.Logf("ingested %s..%s (%.1f MB) in %v", base, last, float64(last-base)/1e6, time.Since(t0).Round(time.Millisecond))
	src2, err := wal.OpenDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	ckpt, err := pageserver.FindCheckpoint(src2, base, x)
	if err != nil {
		t.Fatal(err)
	}
	if ckpt.Redo <= base || ckpt.Shutdown {
		t.Fatalf("checkpoint %+v: want the online CHECKPOINT after the base", ckpt)
	}

	var buf bytes.Buffer
	t1 := time.Now()
	if err := pageserver.BasebackupFromWAL(ctx, tl, x, ckpt, time.Now(), &buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("basebackup at %s (checkpoint %s, redo %s): %d MB in %v", x, ckpt.LSN, ckpt.Redo, buf.Len()>>20, time.Since(t1).Round(time.Millisecond))

	root := pgtest.MkdirOwned(t, "strata-bbwal-")
	dir := filepath.Join(root, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(dir); err != nil {
		t.Fatal(err)
	}
	files := untarWAL(t, &buf, dir)
	for _, f := range files {
		if strings.HasSuffix(f, "_fsm") {
			t.Fatalf("FSM fork %s in a WAL-only basebackup", f)
		}
	}
	cd := controlData(t, dir)
	if cd["Database cluster state"] != "in production" || parseLSN(t, cd["Latest checkpoint location"]) != ckpt.LSN ||
		parseLSN(t, cd["Latest checkpoint's REDO location"]) != ckpt.Redo {
		t.Fatalf("pg_control of the basebackup: %q, checkpoint %q, redo %q", cd["Database cluster state"],
			cd["Latest checkpoint location"], cd["Latest checkpoint's REDO location"])
	}
	segs := copyWAL(t, walDir, filepath.Join(dir, "pg_wal"), ckpt.Redo)
	url, port := startOn(t, dir, root)
	got := queryString(t, url, resultSQL)
	if got != want {
		t.Fatalf("query results differ:\n got %s\nwant %s", got, want)
	}
	cmd, err := pgtest.Command("pg_amcheck", "-h", "127.0.0.1", "-p", strconv.Itoa(port),
		"-U", "postgres", "--install-missing", "--all", "--heapallindexed")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_amcheck: %v\n%s", err, out)
	}
	t.Logf("stock Postgres started from the WAL-only basebackup (%d files, %d WAL segments from %s): %s", len(files), segs, ckpt.Redo, got)
}

// TestControlFromCheckpointRejects: a pg_control whose CRC does not match
// (or of another layout) is refused rather than patched.
func TestControlFromCheckpointRejects(t *testing.T) {
	ctl := make([]byte, 8192)
	if _, err := pageserver.ControlFromCheckpoint(ctl, pageserver.Checkpoint{Data: make([]byte, 88)}, time.Now()); !errors.Is(err, pageserver.ErrBadControl) {
		t.Fatalf("zero pg_control: %v", err)
	}
}

// countingRedo counts the WAL records a timeline replays.
type countingRedo struct {
	r timeline.Redo
	n *atomic.Int64
}

func (c countingRedo) Apply(key keyspace.Key, lsn pg.LSN, base []byte, records [][]byte) ([]byte, error) {
	c.n.Add(int64(len(records)))
	return c.r.Apply(key, lsn, base, records)
}

// BenchmarkRedoGetPage measures image policies on the WAL of pgbench
// (scale 2, 4000 transactions, full_page_writes=off): ingest of the whole
// WAL into a timeline holding the initdb base, then GetPage at the newest
// LSN of every page of the pgbench tables and indexes, uncached (the
// timeline's page cache is off). Metrics: ns/op per GetPage,
// records/getpage (read amplification: WAL records replayed per GetPage),
// ingest-s (seconds to ingest, pushdown materialization included) and
// records-redone-at-ingest (WAL records replayed to materialize images).
//
//	go test ./core/pageserver/ -run XXX -bench BenchmarkRedoGetPage -benchtime 20000x
func BenchmarkRedoGetPage(b *testing.B) {
	if err := pgtest.Available(); err != nil {
		b.Skip(err)
	}
	ctx := context.Background()
	srv := pgtest.Start(b, pgtest.Options{Conf: map[string]string{
		"full_page_writes": "off", "wal_log_hints": "on", "wal_keep_size": "'1GB'", "max_wal_size": "'1GB'", "autovacuum": "off",
	}})
	srv.Stop()
	cmd, err := pgtest.Command("pg_controldata", "-D", srv.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatal(err)
	}
	var base pg.LSN
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "Latest checkpoint location" {
			base, err = pg.ParseLSN(strings.TrimSpace(v))
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	baseDir := b.TempDir()
	if out, err := exec.Command("cp", "-a", srv.DataDir+"/.", baseDir).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	srv.Launch()
	if out, err := srv.Pgbench("-i", "-s", "2", "-q", "postgres"); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	if out, err := srv.Pgbench("-c", "2", "-j", "2", "-t", "2000", "postgres"); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	var rels []pg.RelTag
	for _, name := range []string{"pgbench_accounts", "pgbench_accounts_pkey", "pgbench_branches", "pgbench_tellers", "pgbench_history"} {
		node, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT pg_relation_filenode($1::regclass)::text", name), 10, 32)
		db, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'postgres'"), 10, 32)
		rels = append(rels, pg.RelTag{Spc: 1663, DB: uint32(db), Rel: uint32(node)})
	}
	srv.Stop()
	walDir := filepath.Join(srv.DataDir, "pg_wal")
	for _, pc := range []struct {
		name string
		p    timeline.ImagePolicy
	}{
		{"pushdown-N=1", timeline.PushdownPolicy{N: 1}},
		{"pushdown-N=3", timeline.PushdownPolicy{N: 3}},
		{"pushdown-N=10", timeline.PushdownPolicy{N: 10}},
		{"no-images", timeline.FPIPolicy{}}, // fpi with full_page_writes=off: chains from the base
	} {
		b.Run(pc.name, func(b *testing.B) {
			var n atomic.Int64
			commit := &timeline.CommitLSN{}
			commit.Set(timeline.LatestLSN - 1)
			tl, err := timeline.Open(ctx, pg.TimelineID{0xBE}, b.TempDir(), timeline.Options{NoBackground: true, CacheBytes: 1}, timeline.Deps{
				Log: zerolog.Nop(), Commit: commit, Policy: pc.p,
				Redo: countingRedo{r: walingest.Redo{Engine: postgres.NewEngine(postgres.Options{HintBitsLogged: true})}, n: &n},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer tl.Close()
			if err := pageserver.ImportDataDir(ctx, tl, baseDir, base); err != nil {
				b.Fatal(err)
			}
			src, err := wal.OpenDir(walDir)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			t0 := time.Now()
			last, err := (&walingest.Ingester{TL: tl}).Run(ctx, src, base)
			if err != nil {
				b.Fatal(err)
			}
			ingest := time.Since(t0)
			images := n.Load()
			var pages []pg.PageKey
			for _, r := range rels {
				nb, _, err := tl.Nblocks(ctx, r, last)
				if err != nil {
					b.Fatal(err)
				}
				for blk := uint32(0); blk < nb; blk++ {
					pages = append(pages, r.Page(blk))
				}
			}
			n.Store(0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tl.GetPage(ctx, pages[i%len(pages)], timeline.LatestLSN, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(n.Load())/float64(b.N), "records/getpage")
			b.ReportMetric(ingest.Seconds(), "ingest-s")
			b.ReportMetric(float64(images), "records-redone-at-ingest")
			b.ReportMetric(float64(last-base)/1e6, "WAL-MB")
		})
	}
}
