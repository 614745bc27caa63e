package walingest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// pgbenchRun is the WAL of a pgbench workload on a real PostgreSQL 15:
// pgbench -i at some scale, a CHECKPOINT (so that the run logs full page
// images, as a steady state with full_page_writes does), then a pgbench
// run of the TPC-B-like script.
type pgbenchRun struct {
	dataDir, walDir string
	start, end      pg.LSN
	rels            []relInfo // pgbench's tables and their primary keys
	xact            []byte    // pg_xact/0000 after a clean shutdown
}

// genPgbenchWAL runs the workload. synchronous_commit is off to keep the
// generation short (the WAL is the same kind); wal_keep_size keeps every
// segment in pg_wal.
func genPgbenchWAL(tb testing.TB, scale, clients, txns int) *pgbenchRun {
	srv := pgtest.Start(tb, pgtest.Options{Conf: map[string]string{
		"full_page_writes": "on", "wal_level": "replica", "autovacuum": "off",
		"synchronous_commit": "off", "wal_keep_size": "'4GB'", "max_wal_size": "'4GB'",
	}})
	srv.Exec("postgres", "CHECKPOINT")
	start := mustLSN(tb, srv.QueryString("postgres", "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()"))
	t0 := time.Now()
	if out, err := srv.Pgbench("-i", "-q", "-s", strconv.Itoa(scale), "postgres"); err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
	srv.Exec("postgres", "CHECKPOINT")
	if out, err := srv.Pgbench("-n", "-c", strconv.Itoa(clients), "-j", "2", "-t", strconv.Itoa(txns), "postgres"); err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
	end := mustLSN(tb, srv.QueryString("postgres", "SELECT pg_current_wal_insert_lsn()::text"))
	dbOID, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'postgres'"), 10, 32)
	var rels []relInfo
	for _, r := range []struct {
		name string
		rm   wal.RmgrID
	}{
		{"pgbench_accounts", wal.RmHeap}, {"pgbench_accounts_pkey", wal.RmBtree},
		{"pgbench_branches", wal.RmHeap}, {"pgbench_branches_pkey", wal.RmBtree},
		{"pgbench_tellers", wal.RmHeap}, {"pgbench_tellers_pkey", wal.RmBtree},
		{"pgbench_history", wal.RmHeap},
	} {
		node, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT relfilenode::text FROM pg_class WHERE relname = $1", r.name), 10, 32)
		size, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT (pg_relation_size($1::regclass) / 8192)::text", r.name), 10, 32)
		path := srv.QueryString("postgres", "SELECT pg_relation_filepath($1::regclass)", r.name)
		rels = append(rels, relInfo{name: r.name, rm: r.rm, tag: pg.RelTag{Spc: 1663, DB: uint32(dbOID), Rel: uint32(node)}, path: path, size: uint32(size)})
	}
	srv.Stop()
	xact, err := os.ReadFile(filepath.Join(srv.DataDir, "pg_xact", "0000"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("pgbench -s %d, %d x %d transactions: %.1f MB of WAL in %s", scale, clients, txns, float64(end-start)/1e6, time.Since(t0).Round(time.Millisecond))
	return &pgbenchRun{dataDir: srv.DataDir, walDir: filepath.Join(srv.DataDir, "pg_wal"), start: start, end: end, rels: rels, xact: xact}
}

// TestIngestPgbenchWAL ingests the WAL of pgbench -i and a pgbench run and
// checks every page of pgbench's tables and indexes, rebuilt by the redo
// engine from the ingested images and deltas, against Postgres' own data
// files (masked), their sizes, and the commit status of every transaction.
func TestIngestPgbenchWAL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PostgreSQL and pgbench")
	}
	w := genPgbenchWAL(t, 1, 4, 300)
	tl, fb := newTimeline(t)
	src, err := wal.OpenDir(w.walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	last, err := (&Ingester{TL: tl, Feedback: fb}).Run(ctx, src, w.start)
	if err != nil {
		t.Fatal(err)
	}
	if last < w.end {
		t.Fatalf("ingested up to %s, want %s", last, w.end)
	}
	if d := tl.LSNs().Durable; d != last {
		t.Fatalf("durable LSN %s after Run, want %s", d, last)
	}
	pages := 0
	for _, r := range w.rels {
		n, ok, err := tl.Nblocks(ctx, r.tag, last)
		if err != nil || !ok || n != r.size {
			t.Fatalf("Nblocks %s = %d %v %v, Postgres has %d", r.name, n, ok, err, r.size)
		}
		file, err := os.ReadFile(filepath.Join(w.dataDir, r.path))
		if err != nil {
			t.Fatal(err)
		}
		for blk := uint32(0); blk < r.size; blk++ {
			got, err := tl.GetPage(ctx, r.tag.Page(blk), last, last)
			if err != nil {
				t.Fatalf("GetPage %s block %d: %v", r.name, blk, err)
			}
			got = bytes.Clone(got)
			want := bytes.Clone(file[int(blk)*pg.BlockSize : int(blk+1)*pg.BlockSize])
			postgres.Mask(r.rm, got, blk)
			postgres.Mask(r.rm, want, blk)
			if !bytes.Equal(got, want) {
				t.Errorf("%s block %d differs from the data file after masking", r.name, blk)
			}
			pages++
		}
	}
	// The status of every transaction that committed in the WAL equals
	// Postgres' pg_xact (the transactions before start are not ingested).
	xact, err := tl.ReadFile(ctx, "pg_xact/0000", last)
	if err != nil {
		t.Fatal(err)
	}
	src2, err := wal.OpenDir(w.walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	rd := wal.NewReader(src2, w.start)
	xids := 0
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.RmID != wal.RmXact || r.XID == 0 {
			continue
		}
		x := r.XID
		if int(x/4) >= len(xact) || int(x/4) >= len(w.xact) {
			t.Fatalf("xid %d beyond pg_xact (%d bytes here, %d in Postgres)", x, len(xact), len(w.xact))
		}
		got, want := xact[x/4]>>((x%4)*2)&3, w.xact[x/4]>>((x%4)*2)&3
		if got != want {
			t.Errorf("xid %d: status %d, Postgres has %d", x, got, want)
		}
		xids++
	}
	if xids < 4*300 {
		t.Fatalf("only %d transactions in the WAL", xids)
	}
	t.Logf("ingested %.1f MB of pgbench WAL: %d pages equal Postgres' data files", float64(last-w.start)/1e6, pages)
}

// BenchmarkIngestPgbench measures Run over the pg_wal of pgbench -i -s
// $STRATA_PGBENCH_SCALE (default 4) and a pgbench run (4 clients x 2,500
// transactions), into a fresh timeline. It reports WAL MB per wall second
// (MB/s) and per CPU second of this process (MB/cpu-s, what one core does).
func BenchmarkIngestPgbench(b *testing.B) {
	scale := 4
	if s, err := strconv.Atoi(os.Getenv("STRATA_PGBENCH_SCALE")); err == nil && s > 0 {
		scale = s
	}
	if dir := os.Getenv("STRATA_PGBENCH_WAL"); dir != "" {
		d, start := keptWAL(b, dir, scale)
		benchIngest(b, d, start)
		return
	}
	w := genPgbenchWAL(b, scale, 4, 2500)
	benchIngest(b, w.walDir, w.start)
}

// keptWAL returns the pgbench WAL kept in dir ($STRATA_PGBENCH_WAL), made
// on first use: repeated runs (profiles, GOMAXPROCS=1, other revisions)
// then ingest the very same bytes.
func keptWAL(b *testing.B, dir string, scale int) (string, pg.LSN) {
	if s, err := os.ReadFile(filepath.Join(dir, "START")); err == nil {
		return dir, mustLSN(b, strings.TrimSpace(string(s)))
	}
	w := genPgbenchWAL(b, scale, 4, 2500)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ents, err := os.ReadDir(w.walDir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		if len(e.Name()) != 24 {
			continue
		}
		data, err := os.ReadFile(filepath.Join(w.walDir, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "START"), []byte(w.start.String()+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	return dir, w.start
}

// benchIngest runs Run over walDir from start b.N times into fresh
// timelines, timing only Run.
func benchIngest(b *testing.B, walDir string, start pg.LSN) {
	var cpu time.Duration
	var walBytes int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// As in a pageserver: the background loop flushes in-memory
		// layers (every 100 ms here) while ingest goes on.
		tl, _ := openTimeline(b, timeline.Options{BackgroundInterval: 100 * time.Millisecond})
		src, err := wal.OpenDir(walDir)
		if err != nil {
			b.Fatal(err)
		}
		c0 := cpuTime()
		b.StartTimer()
		last, err := (&Ingester{TL: tl}).Run(context.Background(), src, start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += cpuTime() - c0
		walBytes = int64(last - start)
		b.SetBytes(walBytes)
		src.Close()
		tl.Close()
		b.StartTimer()
	}
	if cpu > 0 {
		b.ReportMetric(float64(walBytes)*float64(b.N)/1e6/cpu.Seconds(), "MB/cpu-s")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
