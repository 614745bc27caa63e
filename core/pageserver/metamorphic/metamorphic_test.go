package metamorphic_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/bench/tpcc"
	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/metamorphic"
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

// mount mounts PGDATA over psbackend on timeline id, with a goroutine
// that stands in for the safekeepers (it advances the commit LSN to the
// WAL the mount has seen written). The returned function unmounts.
func mount(t *testing.T, h *pstest.Server, id pg.TimelineID, mnt, scratch string, uid, gid uint32) (*fusefs.FS, func()) {
	t.Helper()
	be, err := psbackend.Open(context.Background(), h.Client, id, psbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fusefs.Mount(context.Background(), mnt, fusefs.Options{
		Backend: be, Cache: fusefs.NewMemCache(4096), WALScratch: scratch, UID: uid, GID: gid,
		Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopFollow := pstest.FollowCommit(t, h.Client, id, f.WAL().Current)
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

// resultSQL summarizes the workload's data.
const resultSQL = `SELECT concat_ws(' ',
	(SELECT count(*) FROM pgbench_accounts), (SELECT sum(abalance) FROM pgbench_accounts),
	(SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum(tbalance) FROM pgbench_tellers),
	(SELECT count(*) FROM pgbench_history), (SELECT coalesce(sum(delta), 0) FROM pgbench_history),
	(SELECT md5(string_agg(id || ':' || v || ':' || n || ':' || w, ',' ORDER BY id)) FROM m_t),
	(SELECT count(*) FROM m_trunc), (SELECT count(*) FROM pg_class WHERE relname LIKE 'm\_%'),
	(SELECT md5(string_agg(aid::text, ',' ORDER BY aid)) FROM pgbench_accounts WHERE abalance <> 0),
	(SELECT count(*) FROM m_ix WHERE a @> ARRAY[3]), (SELECT count(*) FROM m_ix WHERE p <@ box(point(10, 5), point(19, 9))),
	(SELECT count(*) FROM m_ix WHERE b && box(point(10, 10), point(20, 20))), (SELECT count(*) FROM m_ix WHERE t LIKE 'ab%'))`

// point is a quiesced checkpoint of the workload, followed by a WAL switch:
// at lsn (just below the end of that segment) every page is in both
// timelines.
type point struct {
	name string
	lsn  pg.LSN
}

// mismatch describes a page that differs.
type mismatch struct {
	rel pg.RelTag
	blk uint32
	why string
}

// compare checks every relation page of the writeback timeline at lsn
// against the redo timeline at lsn. FSM forks are skipped (Postgres does
// not WAL-log them). Blocks the writeback timeline has past the redo
// timeline's size must be new (all-zero) pages: extensions Postgres never
// WAL-logged. Visibility-map pages of the redo timeline may lack bits
// (see metamorphic.VMBitsSubset); they are counted in vmLost. It returns
// the pages compared and the mismatches.
func compare(ctx context.Context, t *testing.T, wb, rd *timeline.Timeline, lsn pg.LSN, vmLost *int) (int, []mismatch) {
	t.Helper()
	rels, err := wb.ListRels(ctx, keyspace.RelsRange, lsn)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var bad []mismatch
	zero := make([]byte, pg.BlockSize)
	for _, r := range rels {
		if r.Fork == pg.FSMFork {
			continue
		}
		nw, _, err := wb.Nblocks(ctx, r, lsn)
		if err != nil {
			t.Fatal(err)
		}
		nr, ok, err := rd.Nblocks(ctx, r, lsn)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			// Postgres unlinks the files of a dropped relation after the
			// next checkpoint (mdunlink), so the writeback timeline still
			// lists a relation that WAL ingest dropped at commit: the redo
			// timeline then holds versions of it (a tombstone last).
			had := false
			if err := rd.ScanKeys(ctx, keyspace.RelRange(r), lsn, func(keyspace.Key) error { had = true; return nil }); err != nil {
				t.Fatal(err)
			}
			if had {
				continue
			}
			bad = append(bad, mismatch{rel: r, why: fmt.Sprintf("missing in the redo timeline (%d blocks in writeback)", nw)})
			continue
		}
		if nr > nw {
			bad = append(bad, mismatch{rel: r, why: fmt.Sprintf("redo timeline has %d blocks, writeback %d", nr, nw)})
		}
		for blk := uint32(0); blk < nw; blk++ {
			a, err := wb.GetPage(ctx, r.Page(blk), lsn, 0)
			if err != nil {
				t.Fatalf("writeback page %s at %s: %v", r.Page(blk), lsn, err)
			}
			if blk >= nr {
				if !bytes.Equal(a, zero) {
					bad = append(bad, mismatch{rel: r, blk: blk, why: "past the redo timeline's end but not a new page"})
				}
				continue
			}
			b, err := rd.GetPage(ctx, r.Page(blk), lsn, 0)
			if err != nil {
				bad = append(bad, mismatch{rel: r, blk: blk, why: "redo: " + err.Error()})
				continue
			}
			n++
			if r.Fork == pg.VMFork && !metamorphic.Equal(r.Fork, blk, a, b) && metamorphic.VMBitsSubset(a, b) {
				*vmLost++
				continue
			}
			if !metamorphic.Equal(r.Fork, blk, a, b) {
				k, _ := metamorphic.PageKind(a)
				bad = append(bad, mismatch{rel: r, blk: blk, why: fmt.Sprintf("pages differ after masking (kind %v)", k)})
			}
		}
	}
	return n, bad
}

// compareFiles checks pg_xact and the relation maps of both timelines.
func compareFiles(ctx context.Context, t *testing.T, wb, rd *timeline.Timeline, lsn pg.LSN) (int, []string) {
	t.Helper()
	files, err := wb.ListFiles(ctx, lsn)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var bad []string
	for _, f := range files {
		if !strings.HasPrefix(f.Path, "pg_xact/") && !strings.HasSuffix(f.Path, "/pg_filenode.map") {
			continue
		}
		a, err := wb.ReadFile(ctx, f.Path, lsn)
		if err != nil {
			t.Fatal(err)
		}
		b, err := rd.ReadFile(ctx, f.Path, lsn)
		n++
		if err != nil || !bytes.Equal(a, b) {
			bad = append(bad, fmt.Sprintf("%s: %d vs %d bytes, %v", f.Path, len(a), len(b), err))
		}
	}
	return n, bad
}

// TestWritebackEqualsRedo: one workload (pgbench, DDL: CREATE/DROP/ALTER
// TABLE with and without a rewrite, CREATE INDEX, VACUUM, VACUUM FREEZE,
// TRUNCATE, UPDATE/DELETE, an index of each method: hash, GiST, SP-GiST,
// GIN, BRIN, bloom) runs once on a FUSE mount over psbackend with
// full_page_writes=off. Its WAL is ingested into a second timeline (the
// initdb output imported once, then WAL only; Go redo engine, pushdown
// N=3). At every quiesced checkpoint the two timelines hold the same
// relation pages (masked), pg_xact and relation maps; at the end a stock
// Postgres started from a WAL-only basebackup of the redo timeline gives
// the same query results as the workload's Postgres.
func TestWritebackEqualsRedo(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip(err)
	}
	long := os.Getenv("STRATA_LONG_TESTS") == "1"
	ctx := context.Background()
	h := start(t)
	wbID := pg.TimelineID{0x3E, 1}
	if _, err := h.Client.CreateTimeline(ctx, wbID); err != nil {
		t.Fatal(err)
	}
	root := pgtest.MkdirOwned(t, "strata-metamorphic-")
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
	_, unmount := mount(t, h, wbID, mnt, scratch, uid, gid)
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
		"wal_level = replica\nautovacuum = off\nwal_keep_size = '2GB'\nmax_wal_size = '2GB'\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	base := controlCheckpoint(t, mnt)

	// The redo timeline: initdb's output once, then WAL only.
	commit := &timeline.CommitLSN{}
	commit.Set(timeline.LatestLSN - 1)
	rd, err := timeline.Open(ctx, pg.TimelineID{0x3E, 2}, t.TempDir(), timeline.Options{NoBackground: true}, timeline.Deps{
		Log: zerolog.Nop(), Commit: commit, Policy: timeline.PushdownPolicy{N: 3},
		Redo: walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := pageserver.ImportDataDir(ctx, rd, mnt, base); err != nil {
		t.Fatal(err)
	}

	p := pgtest.StartOn(t, mnt, root, 0)
	var points []point
	quiesce := func(name string) {
		p.Exec("CHECKPOINT")
		end := lsnOf(t, p.Query("SELECT pg_switch_wal()::text"))
		seg := pg.LSN(pg.WALSegmentSize)
		// Just below the end of the segment: the next phase's first file
		// operations carry W = the segment's end (the WAL written so far)
		// while their WAL records come after it.
		points = append(points, point{name: name, lsn: (end+seg-1)/seg*seg - 1})
	}
	scale, txs := "1", "300"
	if long {
		scale, txs = "5", "3000"
	}
	t0 := time.Now()
	p.Run("pgbench", "-i", "-s", scale, "-q", "postgres")
	quiesce("pgbench -i")
	p.Run("pgbench", "-c", "2", "-j", "2", "-t", txs, "postgres")
	quiesce("pgbench")
	rounds := 1
	if long {
		rounds = 3
	}
	for i := 0; i < rounds; i++ {
		p.Exec(`DROP TABLE IF EXISTS m_t, m_trunc;
			CREATE TABLE m_t (id int PRIMARY KEY, v text, n int);
			INSERT INTO m_t SELECT g, md5(g::text), g % 100 FROM generate_series(1, 20000) g;
			CREATE INDEX m_t_v ON m_t (v);
			UPDATE m_t SET v = 'upd' || id WHERE id % 5 = 0;
			DELETE FROM m_t WHERE id % 7 = 0;
			ALTER TABLE m_t ADD COLUMN w int DEFAULT 7;
			CREATE TABLE m_drop AS SELECT g FROM generate_series(1, 3000) g;
			CREATE TABLE m_trunc AS SELECT g FROM generate_series(1, 5000) g`)
		p.Exec("VACUUM m_t")
		p.Exec(`ALTER TABLE m_t ALTER COLUMN n TYPE bigint;
			DROP TABLE m_drop;
			TRUNCATE m_trunc;
			INSERT INTO m_trunc SELECT g FROM generate_series(1, 100) g;
			UPDATE m_t SET w = id WHERE id % 3 = 0`)
		p.Exec("VACUUM pgbench_accounts")
		quiesce(fmt.Sprintf("DDL round %d", i+1))
	}
	// Every index method the redo engine replays, with full_page_writes
	// off: only the index builds' pages arrive whole.
	p.Exec(`CREATE EXTENSION IF NOT EXISTS bloom;
		CREATE TABLE m_ix (id int, a int[], b box, p point, t text);
		CREATE INDEX m_ix_hash ON m_ix USING hash (id);
		CREATE INDEX m_ix_gist ON m_ix USING gist (b);
		CREATE INDEX m_ix_spgist ON m_ix USING spgist (p);
		CREATE INDEX m_ix_spgist_t ON m_ix USING spgist (t);
		CREATE INDEX m_ix_gin ON m_ix USING gin (a) WITH (gin_pending_list_limit = 64);
		CREATE INDEX m_ix_brin ON m_ix USING brin (id) WITH (pages_per_range = 2);
		CREATE INDEX m_ix_bloom ON m_ix USING bloom (id);
		INSERT INTO m_ix SELECT g, ARRAY[g % 10, g % 1000], box(point(g % 100, g / 100), point(g % 100 + 1, g / 100 + 1)),
			point(g % 150, g / 150), md5(g::text) FROM generate_series(1, 15000) g;
		DELETE FROM m_ix WHERE id % 3 = 0`)
	p.Exec("VACUUM m_ix")
	quiesce("index methods")
	var tpccWant string
	if long {
		// A small TPROC-C: one warehouse, two virtual users for 20 s.
		if err := tpcc.Load(ctx, tpcc.LoadOptions{Base: p.URL(), DB: "tpcc", Warehouses: 1, Workers: 2, Log: zerolog.Nop(), Seed: 42}); err != nil {
			t.Fatal(err)
		}
		quiesce("TPROC-C load")
		res, err := tpcc.Run(ctx, tpcc.Options{Base: p.URL(), DB: "tpcc", Warehouses: 1, VUs: 2, Rampup: time.Second, Duration: 20 * time.Second, Seed: 7, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("TPROC-C: %d new orders, %d transactions", res.NewOrders, res.Xacts)
		tpccWant = tpccDigest(t, p.URL())
		quiesce("TPROC-C run")
	}
	p.Run("pgbench", "-c", "2", "-j", "2", "-t", txs, "postgres")
	p.Exec("VACUUM (FREEZE) pgbench_history")
	p.Exec("VACUUM pgbench_tellers")
	quiesce("pgbench + VACUUM FREEZE")
	want := p.Query(resultSQL)
	names := p.Query(`SELECT string_agg(pg_relation_filenode(oid) || '=' || relname || '/' || relkind::text || relpersistence::text, ' ')
		FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL`)
	relName := map[string]string{}
	for _, f := range strings.Fields(names) {
		if k, v, ok := strings.Cut(f, "="); ok {
			relName[k] = v
		}
	}
	t.Logf("workload: %v, %d checkpoints", time.Since(t0).Round(time.Millisecond), len(points))
	p.Stop()
	unmount()

	src, err := wal.OpenDir(scratch)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	t1 := time.Now()
	last, err := (&walingest.Ingester{TL: rd}).Run(ctx, src, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ingested %s..%s (%.1f MB of WAL) in %v", base, last, float64(last-base)/1e6, time.Since(t1).Round(time.Millisecond))
	wb, err := h.PS.Timeline(wbID)
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range points {
		if last < pt.lsn {
			t.Fatalf("%s at %s: ingest stopped at %s", pt.name, pt.lsn, last)
		}
		t2 := time.Now()
		vmLost := 0
		n, bad := compare(ctx, t, wb, rd, pt.lsn, &vmLost)
		nf, badFiles := compareFiles(ctx, t, wb, rd, pt.lsn)
		t.Logf("%s at %s: %d pages and %d files compared in %v, %d page and %d file mismatches, %d VM pages with fewer bits (CREATE DATABASE's images)", pt.name, pt.lsn, n, nf,
			time.Since(t2).Round(time.Millisecond), len(bad), len(badFiles), vmLost)
		for i, m := range bad {
			if i == 20 {
				break
			}
			t.Errorf("  %s (%s) block %d: %s", m.rel, relName[strconv.FormatUint(uint64(m.rel.Rel), 10)], m.blk, m.why)
		}
		for _, b := range badFiles {
			t.Errorf("  %s", b)
		}
		if n == 0 {
			t.Errorf("%s: no page compared", pt.name)
		}
	}
	if t.Failed() {
		return
	}

	// Query results from a stock Postgres on a WAL-only basebackup of the
	// redo timeline at the last point.
	x := points[len(points)-1].lsn
	src2, err := wal.OpenDir(scratch)
	if err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	ckpt, err := pageserver.FindCheckpoint(src2, base, x)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := pageserver.BasebackupFromWAL(ctx, rd, x, ckpt, time.Now(), &buf); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "fromwal")
	pgtest.Untar(t, &buf, dir)
	copyWAL(t, scratch, filepath.Join(dir, "pg_wal"), ckpt.Redo)
	p2 := pgtest.StartOn(t, dir, root, 0)
	if got := p2.Query(resultSQL); got != want {
		t.Fatalf("query results of the WAL-only basebackup differ:\n got %s\nwant %s", got, want)
	}
	p2.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	if long {
		if got := tpccDigest(t, p2.URL()); got != tpccWant {
			t.Fatalf("TPROC-C data of the WAL-only basebackup differs:\n got %s\nwant %s", got, tpccWant)
		}
		c, err := tpcc.Connect(ctx, p2.URL(), "tpcc")
		if err != nil {
			t.Fatal(err)
		}
		checks, ok, err := tpcc.Verify(ctx, c)
		c.Close(ctx)
		if err != nil || !ok {
			t.Fatalf("TPROC-C consistency on the WAL-only basebackup: %v %+v", err, checks)
		}
	}
	p2.Stop()
	t.Logf("stock Postgres on the redo timeline's basebackup at %s (checkpoint %s): same results: %s", x, ckpt.LSN, want)
}

// tpccDigest summarizes the TPROC-C database's mutable tables.
func tpccDigest(t *testing.T, base string) string {
	t.Helper()
	ctx := context.Background()
	c, err := tpcc.Connect(ctx, base, "tpcc")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v string
	if err := c.QueryRow(ctx, `SELECT concat_ws(' ', (SELECT sum(d_next_o_id) FROM district), (SELECT sum(w_ytd) FROM warehouse),
		(SELECT count(*) FROM orders), (SELECT count(*) FROM new_order), (SELECT count(*) FROM order_line),
		(SELECT count(*) FROM history), (SELECT sum(s_quantity) FROM stock), (SELECT sum(c_balance) FROM customer))`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// copyWAL copies the WAL segment files of src from the one holding from on.
func copyWAL(t *testing.T, src, dst string, from pg.LSN) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	seg := uint64(from) / pg.WALSegmentSize
	first := fmt.Sprintf("%08X%08X", seg/0x100, seg%0x100)
	for _, e := range ents {
		if len(e.Name()) != 24 || e.Name()[8:] < first {
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
	}
}
