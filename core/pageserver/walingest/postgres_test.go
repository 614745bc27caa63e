package walingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/plugins/replication/pgstream"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
)

type recFeedback struct {
	mu   sync.Mutex
	last timeline.LSNs
	n    int
}

func (f *recFeedback) Report(_ pg.TimelineID, l timeline.LSNs) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l.LastRecord < f.last.LastRecord {
		panic("feedback went back")
	}
	f.last, f.n = l, f.n+1
}

// vmRmgr marks a visibility-map fork in relInfo: pages compare whole but
// for the page LSN and checksum.
const vmRmgr = wal.RmgrID(255)

type relInfo struct {
	name string
	rm   wal.RmgrID
	tag  pg.RelTag
	path string
	size uint32 // blocks at endLSN
}

func mustLSN(t testing.TB, s string) pg.LSN {
	t.Helper()
	l, err := pg.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestIngestPostgresWAL ingests the WAL a real PostgreSQL 15 wrote (read
// from pg_wal) into a timeline and checks full page images, relation sizes
// and pages rebuilt by the redo engine against Postgres' own data files.
func TestIngestPostgresWAL(t *testing.T) {
	w := genWAL(t)
	t.Run("folder", func(t *testing.T) {
		tl, fb := newTimeline(t)
		src, err := wal.OpenDir(w.walDir)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		in := &Ingester{TL: tl, Feedback: fb, BatchSize: 64}
		last, err := in.Run(context.Background(), src, w.start)
		if err != nil {
			t.Fatal(err)
		}
		w.check(t, tl, fb, last)
	})
	t.Run("safekeeper", func(t *testing.T) {
		tl, fb := newTimeline(t)
		src, prog, walEnd := safekeeperSource(t, w)
		in := &Ingester{TL: tl, Feedback: fb, BatchSize: 64}
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() {
			_, err := in.RunStream(ctx, src, "pageserver", w.start)
			res <- err
		}()
		waitFor(t, 20*time.Second, "ingest of the streamed WAL", func() bool { return tl.LSNs().LastRecord >= walEnd })
		last := tl.LSNs().LastRecord
		// Feedback travels to the safekeeper asynchronously, after the
		// batch is ingested, and only while the stream is open: wait for
		// it before the cancel (under load the cancel closed the stream
		// before the last batch's feedback went out).
		deadline := time.Now().Add(20 * time.Second)
		for p := prog("pageserver"); p.Received != last; p = prog("pageserver") {
			if time.Now().After(deadline) {
				t.Fatalf("safekeeper saw progress %+v, want received %s", p, last)
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("RunStream after cancel: %v", err)
		}
		w.check(t, tl, fb, last)
	})
	t.Run("chunked", func(t *testing.T) {
		// The WAL arrives in small pieces that split pages and records.
		tl, fb := newTimeline(t)
		data, from, walEnd := walBytes(t, w)
		mem := replication.NewMemory(1, from)
		t.Cleanup(func() { mem.Close() })
		in := &Ingester{TL: tl, Feedback: fb, BatchSize: 16}
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() {
			_, err := in.RunStream(ctx, mem, "pageserver", w.start)
			res <- err
		}()
		rng := rand.New(rand.NewPCG(1, 2))
		for off := 0; off < len(data); {
			n := min(len(data)-off, 1+rng.IntN(3000))
			mem.Append(data[off : off+n])
			off += n
		}
		waitFor(t, 20*time.Second, "ingest of the streamed WAL", func() bool { return tl.LSNs().LastRecord >= walEnd })
		cancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("RunStream after cancel: %v", err)
		}
		w.check(t, tl, fb, tl.LSNs().LastRecord)
		if p := mem.Progress("pageserver"); p.Received != walEnd {
			t.Fatalf("progress %+v, want received %s", p, walEnd)
		}
	})
	t.Run("follow", func(t *testing.T) {
		// The stream fails twice midway: Follow reopens it where ingest is.
		tl, fb := newTimeline(t)
		data, from, walEnd := walBytes(t, w)
		mem := replication.NewMemory(1, from)
		t.Cleanup(func() { mem.Close() })
		mem.Append(data)
		fl := &flakySource{Source: mem, failAfter: 3, failures: 2}
		in := &Ingester{TL: tl, Feedback: fb, BatchSize: 16}
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- in.Follow(ctx, fl, "pageserver", w.start, zerolog.Nop()) }()
		waitFor(t, 20*time.Second, "ingest of the streamed WAL", func() bool { return tl.LSNs().LastRecord >= walEnd })
		cancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("Follow after cancel: %v", err)
		}
		w.check(t, tl, fb, tl.LSNs().LastRecord)
		fl.mu.Lock()
		defer fl.mu.Unlock()
		if fl.opens != 3 || fl.starts[1] <= fl.starts[0] {
			t.Fatalf("%d opens from %v, want 3, each further", fl.opens, fl.starts)
		}
	})
}

// flakySource fails the first failures streams after failAfter chunks.
type flakySource struct {
	replication.Source
	failAfter int
	mu        sync.Mutex
	failures  int
	opens     int
	starts    []pg.LSN
}

type flakyStream struct {
	replication.Stream
	left int // chunks before failing, -1: never
}

func (f *flakySource) Stream(ctx context.Context, consumer string, start pg.LSN) (replication.Stream, error) {
	st, err := f.Source.Stream(ctx, consumer, start)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opens++
	f.starts = append(f.starts, start)
	left := -1
	if f.failures > 0 {
		f.failures--
		left = f.failAfter
	}
	return &flakyStream{Stream: st, left: left}, nil
}

func (s *flakyStream) Recv() (replication.Chunk, error) {
	if s.left == 0 {
		return replication.Chunk{}, errors.New("connection reset")
	}
	if s.left > 0 {
		s.left--
	}
	return s.Stream.Recv()
}

type walRun struct {
	dataDir, walDir string
	start, end      pg.LSN
	rels            []relInfo
	// A database created (WAL_LOG strategy) at dbMid and dropped before end.
	db2        uint32
	dbMid      pg.LSN
	db2Map     []byte // its pg_filenode.map at dbMid
	db2Version []byte // its PG_VERSION
	xact       []byte // pg_xact/0000 after shutdown
	db2Rels    int    // its main fork files at dbMid
	// A database copied from d2 with the FILE_COPY strategy, kept.
	db3 uint32
	// pg_multixact/offsets/0000 and members/0000 after shutdown.
	mxOffsets, mxMembers []byte
	// Relations dropped before end (DROP TABLE, TRUNCATE's old file, a
	// rolled-back CREATE TABLE), each with an LSN at which it existed.
	droppedRels []droppedRel
}

type droppedRel struct {
	rel pg.RelTag
	at  pg.LSN
}

func genWAL(t testing.TB) *walRun {
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"full_page_writes": "on", "wal_level": "replica", "autovacuum": "off"}})
	srv.Exec("postgres", "CHECKPOINT")
	start := mustLSN(t, srv.QueryString("postgres", "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()"))
	srv.Exec("postgres", `CREATE TABLE t (id int PRIMARY KEY, v text);
		INSERT INTO t SELECT g, repeat('x', 50) || g FROM generate_series(1, 5000) g;
		CREATE TABLE u (id int, pad text);
		INSERT INTO u SELECT g, repeat('p', 200) FROM generate_series(1, 3000) g`)
	srv.Exec("postgres", "CHECKPOINT")
	srv.Exec("postgres", `UPDATE t SET v = 'upd' || id WHERE id % 7 = 0;
		INSERT INTO t SELECT g, 'late' FROM generate_series(5001, 5400) g;
		DELETE FROM u WHERE id > 500`)
	srv.Exec("postgres", "VACUUM u")
	// Clears visibility-map bits without referencing the VM page.
	srv.Exec("postgres", "UPDATE u SET pad = 'z' WHERE id IN (3, 400)")
	// Three transactions share-lock the same rows: multixacts.
	lockers(t, srv, "SELECT id FROM t WHERE id <= 10 FOR SHARE", "SELECT id FROM t WHERE id <= 10 FOR SHARE", "SELECT id FROM t WHERE id BETWEEN 5 AND 15 FOR SHARE")
	// Relations whose files go: a dropped table, the old file of a
	// truncated table, a table created by a transaction that rolls back.
	srv.Exec("postgres", `CREATE TABLE dropme (id int); INSERT INTO dropme SELECT generate_series(1, 1000);
		CREATE TABLE trunc (id int); INSERT INTO trunc SELECT generate_series(1, 1000)`)
	oidDB, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'postgres'"), 10, 32)
	relOf := func(name string) pg.RelTag {
		n, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT relfilenode::text FROM pg_class WHERE relname = $1", name), 10, 32)
		return pg.RelTag{Spc: 1663, DB: uint32(oidDB), Rel: uint32(n)}
	}
	dropMid := mustLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_insert_lsn()::text"))
	dropped := []droppedRel{{relOf("dropme"), dropMid}, {relOf("trunc"), dropMid}, rolledBackTable(t, srv, oidDB)}
	srv.Exec("postgres", "DROP TABLE dropme")
	srv.Exec("postgres", "TRUNCATE trunc")
	srv.Exec("postgres", "INSERT INTO trunc VALUES (1)")
	srv.Exec("postgres", "CREATE DATABASE d2 STRATEGY WAL_LOG")
	// FILE_COPY copies d2's files (its pages are in the WAL as images).
	srv.Exec("postgres", "CREATE DATABASE d3 TEMPLATE d2 STRATEGY FILE_COPY")
	dbMid := mustLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_insert_lsn()::text"))
	db2, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'd2'"), 10, 32)
	db3, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'd3'"), 10, 32)
	// Main fork files on disk: names of digits only (no _fsm, _vm, .1).
	ents, err := os.ReadDir(filepath.Join(srv.DataDir, "base", strconv.FormatUint(db2, 10)))
	if err != nil {
		t.Fatal(err)
	}
	db2Rels := 0
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err == nil {
			db2Rels++
		}
	}
	db2Map, err := os.ReadFile(filepath.Join(srv.DataDir, "base", strconv.FormatUint(db2, 10), "pg_filenode.map"))
	if err != nil {
		t.Fatal(err)
	}
	db2Version, err := os.ReadFile(filepath.Join(srv.DataDir, "base", strconv.FormatUint(db2, 10), "PG_VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Exec("postgres", "DROP DATABASE d2")
	end := mustLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_insert_lsn()::text"))
	dbOID, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'postgres'"), 10, 32)
	var rels []relInfo
	for _, r := range []struct {
		name string
		rm   wal.RmgrID
	}{{"t", wal.RmHeap}, {"t_pkey", wal.RmBtree}, {"u", wal.RmHeap}} {
		node, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT relfilenode::text FROM pg_class WHERE relname = $1", r.name), 10, 32)
		size, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT (pg_relation_size($1::regclass) / 8192)::text", r.name), 10, 32)
		path := srv.QueryString("postgres", "SELECT pg_relation_filepath($1::regclass)", r.name)
		rels = append(rels, relInfo{name: r.name, rm: r.rm, tag: pg.RelTag{Spc: 1663, DB: uint32(dbOID), Rel: uint32(node)}, path: path, size: uint32(size)})
	}
	vmSize, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT (pg_relation_size('u', 'vm') / 8192)::text"), 10, 32)
	vm := rels[2]
	vm.name, vm.rm, vm.tag.Fork, vm.path, vm.size = "u (vm)", vmRmgr, pg.VMFork, vm.path+"_vm", uint32(vmSize)
	rels = append(rels, vm)
	if vm.size == 0 {
		t.Fatal("VACUUM left no visibility map")
	}
	if rels[2].size >= 3000*200/8192 {
		t.Fatalf("VACUUM did not truncate u: %d blocks", rels[2].size)
	}
	// A clean shutdown flushes the data files and the WAL.
	srv.Stop()
	xact, err := os.ReadFile(filepath.Join(srv.DataDir, "pg_xact", "0000"))
	if err != nil {
		t.Fatal(err)
	}
	mxo, err := os.ReadFile(filepath.Join(srv.DataDir, "pg_multixact", "offsets", "0000"))
	if err != nil {
		t.Fatal(err)
	}
	mxm, err := os.ReadFile(filepath.Join(srv.DataDir, "pg_multixact", "members", "0000"))
	if err != nil {
		t.Fatal(err)
	}
	return &walRun{xact: xact, dataDir: srv.DataDir, walDir: filepath.Join(srv.DataDir, "pg_wal"), start: start, end: end, rels: rels,
		db2: uint32(db2), dbMid: dbMid, db2Map: db2Map, db2Rels: db2Rels, db2Version: db2Version,
		db3: uint32(db3), mxOffsets: mxo, mxMembers: mxm, droppedRels: dropped}
}

// lockers runs each query in its own transaction, all open at once, then
// commits them: row locks shared by several transactions are multixacts.
func lockers(t testing.TB, srv *pgtest.Server, queries ...string) {
	ctx := context.Background()
	var conns []*pgx.Conn
	for _, q := range queries {
		c, err := pgx.Connect(ctx, srv.ConnString("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
}

// rolledBackTable creates a table with rows in a transaction that rolls
// back, and returns its relation and an LSN before the rollback.
func rolledBackTable(t testing.TB, srv *pgtest.Server, db uint64) droppedRel {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var node uint32
	for _, q := range []string{"BEGIN", "CREATE TABLE rolledback (id int)", "INSERT INTO rolledback SELECT generate_series(1, 1000)"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// A checkpoint makes the uncommitted pages reach the WAL as images.
	srv.Exec("postgres", "CHECKPOINT")
	if _, err := c.Exec(ctx, "INSERT INTO rolledback VALUES (0)"); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT relfilenode FROM pg_class WHERE relname = 'rolledback'").Scan(&node); err != nil {
		t.Fatal(err)
	}
	var at string
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&at); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	return droppedRel{pg.RelTag{Spc: 1663, DB: uint32(db), Rel: node}, mustLSN(t, at)}
}

func newTimeline(t testing.TB) (*timeline.Timeline, *recFeedback) {
	return openTimeline(t, timeline.Options{NoBackground: true})
}

// openTimeline opens a timeline with the fpi policy and the Go redo engine.
func openTimeline(t testing.TB, o timeline.Options) (*timeline.Timeline, *recFeedback) {
	tl, err := timeline.Open(context.Background(), pg.TimelineID{1}, t.TempDir(), o, timeline.Deps{
		Log: zerolog.Nop(), Commit: &timeline.CommitLSN{}, Policy: timeline.FPIPolicy{},
		Redo: Redo{Engine: postgres.NewEngine(postgres.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close() })
	return tl, &recFeedback{}
}

// check verifies a timeline that ingested w's WAL up to last.
func (w *walRun) check(t *testing.T, tl *timeline.Timeline, fb *recFeedback, last pg.LSN) {
	ctx := context.Background()
	start, end, rels := w.start, w.end, w.rels
	if last < end {
		t.Fatalf("ingested up to %s, want at least %s", last, end)
	}
	if fb.n < 2 || fb.last.LastRecord != last {
		t.Fatalf("feedback: %d reports, last %s, want last %s", fb.n, fb.last.LastRecord, last)
	}

	// Every full page image of the test relations reads back at its LSN.
	src2, err := wal.OpenDir(w.walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	mine := map[pg.RelTag]bool{}
	for _, r := range rels {
		mine[r.tag] = true
	}
	rd := wal.NewReader(src2, start)
	images := 0
	var minXID, maxXID uint32
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.RmID == wal.RmXact && r.XID != 0 {
			if minXID == 0 || r.XID < minXID {
				minXID = r.XID
			}
			maxXID = max(maxXID, r.XID)
		}
		for i := range r.Blocks {
			b := &r.Blocks[i]
			if !b.ApplyImage || !mine[b.Page.Tag()] {
				continue
			}
			want := make([]byte, pg.BlockSize)
			if err := postgres.RedoBlock(r, b, want, postgres.Options{}); err != nil {
				t.Fatal(err)
			}
			got, err := tl.GetPage(ctx, b.Page, r.EndLSN, r.EndLSN)
			if err != nil {
				t.Fatalf("GetPage %s at %s: %v", b.Page, r.EndLSN, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("page %s at %s differs from the record's image", b.Page, r.EndLSN)
			}
			images++
		}
	}
	if images < 10 {
		t.Fatalf("only %d full page images of the test relations", images)
	}

	// Relation sizes at the end LSN, and every page rebuilt (images + redo)
	// matches Postgres' data file once masked.
	// The database created with WAL_LOG existed in between, then was dropped.
	mid, err := tl.ListRels(ctx, keyspace.DBRange(1663, w.db2), w.dbMid)
	if err != nil {
		t.Fatal(err)
	}
	mainForks := 0
	for _, r := range mid {
		if r.Fork == pg.MainFork {
			mainForks++
		}
	}
	if mainForks != w.db2Rels {
		t.Errorf("database %d at %s: %d main forks, Postgres has %d main fork files", w.db2, w.dbMid, mainForks, w.db2Rels)
	}
	if m, err := tl.ReadFile(ctx, relMapPath(1663, w.db2), w.dbMid); err != nil || !bytes.Equal(m, w.db2Map) {
		t.Errorf("pg_filenode.map of database %d: %d bytes, %v (want %d bytes)", w.db2, len(m), err, len(w.db2Map))
	}
	if after, err := tl.ListRels(ctx, keyspace.DBRange(1663, w.db2), last); err != nil || len(after) != 0 {
		t.Errorf("database %d after DROP: %d relations, %v", w.db2, len(after), err)
	}
	versionFile := fmt.Sprintf("base/%d/PG_VERSION", w.db2)
	if v, err := tl.ReadFile(ctx, versionFile, w.dbMid); err != nil || !bytes.Equal(v, w.db2Version) {
		t.Errorf("%s: %q, %v, want %q", versionFile, v, err, w.db2Version)
	}
	for _, f := range []string{versionFile, relMapPath(1663, w.db2)} {
		if _, ok, err := tl.StatFile(ctx, f, last); err != nil || ok {
			t.Errorf("%s after DROP DATABASE: exists %v, %v", f, ok, err)
		}
	}

	// The FILE_COPY database has the files Postgres has, with d2's pages.
	w.checkFileCopy(t, tl, last)

	// Multixact SLRU pages equal Postgres' files.
	for _, f := range []struct {
		path string
		want []byte
	}{{"pg_multixact/offsets/0000", w.mxOffsets}, {"pg_multixact/members/0000", w.mxMembers}} {
		got, err := tl.ReadFile(ctx, f.path, last)
		if err != nil {
			t.Fatalf("%s: %v", f.path, err)
		}
		if len(got) == 0 || len(got) > len(f.want) || !bytes.Equal(got, f.want[:len(got)]) {
			t.Errorf("%s: %d bytes differ from Postgres' %d bytes", f.path, len(got), len(f.want))
		}
		if bytes.Equal(got, make([]byte, len(got))) {
			t.Errorf("%s is all zeros", f.path)
		}
	}

	// Dropped relations exist before and not after.
	for _, d := range w.droppedRels {
		if _, ok, err := tl.Nblocks(ctx, d.rel, d.at); err != nil || !ok {
			t.Errorf("relation %s at %s: exists %v, %v", d.rel, d.at, ok, err)
		}
		if _, ok, err := tl.Nblocks(ctx, d.rel, last); err != nil || ok {
			t.Errorf("relation %s after its drop: exists %v, %v", d.rel, ok, err)
		}
	}

	// Transaction status of the workload's transactions, as in pg_xact.
	xact, err := tl.ReadFile(ctx, "pg_xact/0000", last)
	if err != nil {
		t.Fatal(err)
	}
	if maxXID-minXID < 5 || int(maxXID/4) >= len(xact) || int(maxXID/4) >= len(w.xact) {
		t.Fatalf("xids %d..%d, pg_xact of %d bytes here, %d in Postgres", minXID, maxXID, len(xact), len(w.xact))
	}
	aborted := 0
	for x := minXID; x <= maxXID; x++ {
		got, want := xact[x/4]>>((x%4)*2)&3, w.xact[x/4]>>((x%4)*2)&3
		if got != want {
			t.Errorf("xid %d: status %d, Postgres has %d", x, got, want)
		}
		if want == postgres.XactAborted {
			aborted++
		}
	}
	if aborted == 0 {
		t.Errorf("no aborted transaction among xids %d..%d", minXID, maxXID)
	}

	redone := 0
	for _, r := range rels {
		n, ok, err := tl.Nblocks(ctx, r.tag, end)
		if err != nil || !ok {
			t.Fatalf("Nblocks %s (%s): %d %v %v", r.name, r.tag, n, ok, err)
		}
		if n != r.size {
			t.Errorf("Nblocks %s = %d, Postgres has %d", r.name, n, r.size)
		}
		file, err := os.ReadFile(filepath.Join(w.dataDir, r.path))
		if err != nil {
			t.Fatal(err)
		}
		if len(file) != int(r.size)*pg.BlockSize {
			t.Fatalf("%s: data file of %d bytes, want %d blocks", r.name, len(file), r.size)
		}
		for blk := uint32(0); blk < r.size; blk++ {
			got, err := tl.GetPage(ctx, r.tag.Page(blk), last, last)
			if err != nil {
				t.Fatalf("GetPage %s block %d: %v", r.name, blk, err)
			}
			got = bytes.Clone(got)
			want := bytes.Clone(file[int(blk)*pg.BlockSize : int(blk+1)*pg.BlockSize])
			if r.rm == vmRmgr {
				clear(got[:10]) // pd_lsn and pd_checksum
				clear(want[:10])
			}
			postgres.Mask(r.rm, got, blk)
			postgres.Mask(r.rm, want, blk)
			if !bytes.Equal(got, want) {
				t.Errorf("%s block %d differs from the data file after masking", r.name, blk)
			}
			redone++
		}
	}
	t.Logf("ingested %s..%s: %d images checked, %d pages compared with the data files", start, last, images, redone)
}

// checkFileCopy compares the database created with FILE_COPY with
// Postgres' files: every fork file has the size the timeline says, the
// pages equal its template's at the copy, and pg_filenode.map and
// PG_VERSION are Postgres'.
func (w *walRun) checkFileCopy(t *testing.T, tl *timeline.Timeline, last pg.LSN) {
	ctx := context.Background()
	dir := filepath.Join(w.dataDir, "base", strconv.FormatUint(uint64(w.db3), 10))
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	forks := 0
	for _, e := range ents {
		name, fork := e.Name(), pg.MainFork
		for suffix, f := range map[string]pg.ForkNumber{"_fsm": pg.FSMFork, "_vm": pg.VMFork, "_init": pg.InitFork} {
			if n, ok := strings.CutSuffix(name, suffix); ok {
				name, fork = n, f
			}
		}
		node, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			if name != "PG_VERSION" && name != "pg_filenode.map" && name != "pg_internal.init" {
				t.Errorf("unexpected file %s in %s", e.Name(), dir)
			}
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		rel := pg.RelTag{Spc: 1663, DB: w.db3, Rel: uint32(node), Fork: fork}
		n, ok, err := tl.Nblocks(ctx, rel, last)
		if err != nil || !ok || int(n)*pg.BlockSize != len(data) {
			t.Errorf("%s: Nblocks %d %v %v, the file has %d bytes", e.Name(), n, ok, err, len(data))
			continue
		}
		src := rel
		src.DB = w.db2
		for blk := uint32(0); blk < n; blk++ {
			got, err := tl.GetPage(ctx, rel.Page(blk), last, last)
			if err != nil {
				t.Fatalf("%s block %d: %v", e.Name(), blk, err)
			}
			tmpl, err := tl.GetPage(ctx, src.Page(blk), w.dbMid, w.dbMid)
			if err != nil || !bytes.Equal(got, tmpl) {
				t.Errorf("%s block %d differs from the template's (%v)", e.Name(), blk, err)
			}
		}
		forks++
	}
	if forks < 100 {
		t.Errorf("only %d fork files in the FILE_COPY database", forks)
	}
	for _, name := range []string{"pg_filenode.map", "PG_VERSION"} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := tl.ReadFile(ctx, fmt.Sprintf("base/%d/%s", w.db3, name), last)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s of the FILE_COPY database: %q, %v", name, got, err)
		}
	}
}

// safekeeperSource starts a safekeeper node holding w's WAL (from the page
// of w.start to the end of WAL) as committed WAL and returns a pg-stream
// source on it and the node's view of a consumer's progress.
func safekeeperSource(t *testing.T, w *walRun) (replication.Source, func(string) replication.Progress, pg.LSN) {
	data, from, endWAL := walBytes(t, w)
	cfg := safekeeper.DefaultConfig()
	cfg.DataDir, cfg.ListenAddr = t.TempDir(), "127.0.0.1:0"
	n, err := safekeeper.New(cfg, safekeeper.Deps{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	st := n.Store()
	if err := st.Init(from, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	src, err := pgstream.New(pgstream.Config{Safekeepers: []string{n.Addr()}}, zerolog.Nop())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close(); cancel(); <-done })
	if err := st.Write(from, data); err != nil {
		t.Fatal(err)
	}
	end, err := st.Flush()
	if err != nil {
		t.Fatal(err)
	}
	wait, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	for n.CommitLSN() < end {
		select {
		case <-n.CommitNotify():
		case <-wait.Done():
			t.Fatalf("safekeeper commit LSN %s, want %s", n.CommitLSN(), end)
		}
	}
	return src, func(c string) replication.Progress {
		fb, _ := n.ConsumerProgress(c)
		return replication.Progress(fb)
	}, endWAL
}

// walBytes returns w's WAL from the page of w.start to the end of the page
// holding the end of WAL, its first LSN and the end of the last record.
func walBytes(t *testing.T, w *walRun) ([]byte, pg.LSN, pg.LSN) {
	ds, err := wal.OpenDir(w.walDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	rd := wal.NewReader(ds, w.start)
	var endWAL pg.LSN
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		endWAL = r.EndLSN
	}
	from := w.start - w.start%wal.PageSize
	to := (endWAL + wal.PageSize - 1) / wal.PageSize * wal.PageSize
	var data []byte
	page := make([]byte, wal.PageSize)
	for l := from; l < to; l += wal.PageSize {
		if err := ds.ReadPage(l, page); err != nil {
			t.Fatal(err)
		}
		data = append(data, page...)
	}
	return data, from, endWAL
}

// BenchmarkIngestFolder measures Run over the pg_wal of genWAL's workload
// (table, index, updates, VACUUM, CREATE/DROP DATABASE) into a fresh
// timeline; bytes are WAL bytes.
func BenchmarkIngestFolder(b *testing.B) {
	w := genWAL(b)
	benchIngest(b, w.walDir, w.start)
}
