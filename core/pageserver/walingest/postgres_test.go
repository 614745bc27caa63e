package walingest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
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

type relInfo struct {
	name string
	rm   wal.RmgrID
	tag  pg.RelTag
	path string
	size uint32 // blocks at endLSN
}

func mustLSN(t *testing.T, s string) pg.LSN {
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
	if rels[2].size >= 3000*200/8192 {
		t.Fatalf("VACUUM did not truncate u: %d blocks", rels[2].size)
	}
	// A clean shutdown flushes the data files and the WAL.
	srv.Stop()

	ctx := context.Background()
	tl, err := timeline.Open(ctx, pg.TimelineID{1}, t.TempDir(), timeline.Options{NoBackground: true}, timeline.Deps{
		Log: zerolog.Nop(), Commit: &timeline.CommitLSN{}, Policy: timeline.FPIPolicy{},
		Redo: Redo{Engine: postgres.NewEngine(postgres.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	src, err := wal.OpenDir(filepath.Join(srv.DataDir, "pg_wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fb := &recFeedback{}
	in := &Ingester{TL: tl, Feedback: fb, BatchSize: 64}
	last, err := in.Run(ctx, src, start)
	if err != nil {
		t.Fatal(err)
	}
	if last < end {
		t.Fatalf("ingested up to %s, want at least %s", last, end)
	}
	if fb.n < 2 || fb.last.LastRecord != last {
		t.Fatalf("feedback: %d reports, last %s, want last %s", fb.n, fb.last.LastRecord, last)
	}

	// Every full page image of the test relations reads back at its LSN.
	src2, err := wal.OpenDir(filepath.Join(srv.DataDir, "pg_wal"))
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
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			t.Fatal(err)
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
	redone := 0
	for _, r := range rels {
		n, ok, err := tl.Nblocks(ctx, r.tag, end)
		if err != nil || !ok {
			t.Fatalf("Nblocks %s (%s): %d %v %v", r.name, r.tag, n, ok, err)
		}
		if n != r.size {
			t.Errorf("Nblocks %s = %d, Postgres has %d", r.name, n, r.size)
		}
		file, err := os.ReadFile(filepath.Join(srv.DataDir, r.path))
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
