package postgres

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// workloadWAL is WAL produced by a real PostgreSQL 15 with
// wal_consistency_checking = 'all', copied out of pg_wal.
type workloadWAL struct {
	Dir        string // copy of the segments
	Start, End pg.LSN
	srv        *pgtest.Server // stopped once the first test using it ends
	// SLRU files (pg_xact, pg_multixact/*) at Start (after a checkpoint)
	// and at End, by SLRU and file name.
	SLRUStart, SLRUEnd map[SLRU]map[string][]byte
}

// tempDirs outlive single tests (the WAL copy is shared) and are removed
// by TestMain.
var tempDirs []string

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

var (
	walOnce sync.Once
	walData *workloadWAL
	walErr  error
)

func longTests() bool { return os.Getenv("STRATA_LONG_TESTS") == "1" }

// benchWAL is sharedWAL for benchmarks.
func benchWAL(b *testing.B) *workloadWAL {
	b.Helper()
	if err := pgtest.Available(); err != nil {
		b.Skip(err)
	}
	walOnce.Do(func() { walData, walErr = runWorkload(b) })
	if walErr != nil {
		b.Fatal(walErr)
	}
	return walData
}

// sharedWAL runs the workload once per test binary.
func sharedWAL(t *testing.T) *workloadWAL {
	t.Helper()
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	walOnce.Do(func() { walData, walErr = runWorkload(t) })
	if walErr != nil {
		t.Fatal(walErr)
	}
	if walData == nil {
		t.Skip("workload unavailable")
	}
	return walData
}

func runWorkload(t testing.TB) (w *workloadWAL, err error) {
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("workload: %v", e)
		}
	}()
	s := pgtest.Start(t, pgtest.Options{Conf: map[string]string{
		"wal_consistency_checking":  "'all'",
		"wal_compression":           "lz4",
		"wal_keep_size":             "'4GB'",
		"max_wal_size":              "'4GB'",
		"checkpoint_timeout":        "'1h'",
		"autovacuum":                "off",
		"max_prepared_transactions": "5",
		"shared_buffers":            "'32MB'",
	}})
	s.Exec("postgres", "checkpoint")
	slruStart, err := readSLRUFiles(s.DataDir)
	if err != nil {
		return nil, err
	}
	start := s.QueryString("postgres", "select pg_current_wal_insert_lsn()::text")
	scale := "1"
	txns := "150"
	if longTests() {
		scale, txns = "5", "5000"
	}
	if out, err := s.Pgbench("-i", "-s", scale, "postgres"); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	// Switch compression mid-way so every image format shows up.
	s.Exec("postgres", "alter system set wal_compression = 'pglz'")
	s.Exec("postgres", "select pg_reload_conf()")
	if out, err := s.Pgbench("-c", "2", "-t", txns, "postgres"); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	tpccTxns := 150
	if longTests() {
		tpccTxns = 5000
	}
	if err := runTPCC(t, s, tpccTxns); err != nil {
		return nil, err
	}
	s.Exec("postgres", "alter system set wal_compression = 'zstd'")
	s.Exec("postgres", "select pg_reload_conf()")
	for _, q := range workloadSQL {
		s.Exec("postgres", q)
	}
	s.Exec("postgres", "alter system set wal_compression = 'off'")
	s.Exec("postgres", "select pg_reload_conf()")
	s.Exec("postgres", "insert into t (n, v) select g % 50, 'again' from generate_series(1, 300) g")
	s.Exec("postgres", "checkpoint")
	end := s.QueryString("postgres", "select pg_current_wal_insert_lsn()::text")
	slruEnd, err := readSLRUFiles(s.DataDir)
	if err != nil {
		return nil, err
	}
	w = &workloadWAL{srv: s, SLRUStart: slruStart, SLRUEnd: slruEnd}
	pgWal := filepath.Join(s.DataDir, "pg_wal")
	if w.Start, err = pg.ParseLSN(start); err != nil {
		return nil, err
	}
	if w.End, err = pg.ParseLSN(end); err != nil {
		return nil, err
	}
	if d := os.Getenv("STRATA_WAL_OUT"); d != "" {
		w.Dir = d
	} else if w.Dir, err = os.MkdirTemp("", "strata-wal-"); err != nil {
		return nil, err
	} else {
		tempDirs = append(tempDirs, w.Dir)
	}
	if err := pgtest.Chown(w.Dir); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(pgWal)
	if err != nil {
		return nil, err
	}
	// Relation maps (global is database 0).
	maps, _ := filepath.Glob(filepath.Join(s.DataDir, "base", "*", "pg_filenode.map"))
	maps = append(maps, filepath.Join(s.DataDir, "global", "pg_filenode.map"))
	for _, f := range maps {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		db := filepath.Base(filepath.Dir(f))
		if db == "global" {
			db = "0"
		}
		if err := os.MkdirAll(filepath.Join(w.Dir, "relmap"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(w.Dir, "relmap", db), b, 0o644); err != nil {
			return nil, err
		}
	}
	// Visibility-map forks, to check the bits heap redo clears implicitly.
	vms, _ := filepath.Glob(filepath.Join(s.DataDir, "base", "*", "*_vm"))
	for _, f := range vms {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(w.Dir, "vm", filepath.Base(filepath.Dir(f)), filepath.Base(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return nil, err
		}
	}
	for _, e := range ents {
		if len(e.Name()) != 24 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(pgWal, e.Name()))
		if err != nil {
			return nil, err
		}
		// A segment Postgres made ahead of need is zeros, not WAL: left
		// out, as pg_waldump takes the segment size from the header of
		// whichever file its directory listing names first (on a tmpfs,
		// the newest).
		if len(b) < 2 || b[0] == 0 && b[1] == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(w.Dir, e.Name()), b, 0o644); err != nil {
			return nil, err
		}
	}
	return w, nil
}

var workloadSQL = []string{
	"create table t (id serial primary key, n int, v text)",
	"create index t_n on t (n)",
	"insert into t (n, v) select g % 50, repeat('x', g % 200) from generate_series(1, 5000) g",
	"update t set v = v || 'y' where id % 7 = 0",
	"update t set n = n + 1 where id % 11 = 0",
	"delete from t where id between 1000 and 3500",
	"vacuum t",
	"select * from t where id < 100 for update",
	"insert into t (id, n, v) values (1, 1, 'c') on conflict (id) do update set v = 'conflict'",
	"insert into t (id, n, v) values (999999, 1, 'c') on conflict (id) do nothing",
	"vacuum (freeze) t",
	"create table big (id int, b text)",
	"alter table big alter column b set storage external",
	"insert into big select g, (select string_agg(md5(random()::text), '') from generate_series(1, 300)) from generate_series(1, 20) g",
	"update big set b = b || 'z' where id < 5",
	"create sequence s1",
	"select nextval('s1') from generate_series(1, 100)",
	"create table tt as select g as id from generate_series(1, 1000) g",
	"truncate tt",
	"insert into tt select generate_series(1, 100)",
	"vacuum full t",
	"drop table tt",
	"create database d2",
	"drop database d2",
	"begin; insert into t (n, v) values (1, 'rolled back'); rollback",
	"begin; insert into t (n, v) values (2, 'sp'); savepoint a; insert into t (n, v) values (3, 'sub'); release savepoint a; savepoint b; insert into t (n, v) values (4, 'subabort'); rollback to savepoint b; commit",
	"begin; select * from t where id = 4000 for share; savepoint s; select * from t where id = 4000 for update; savepoint s2; update t set v = 'multi' where id = 4000; commit",
	"begin; insert into t (n, v) values (5, 'prepared'); prepare transaction 'p1'",
	"commit prepared 'p1'",
	"begin; insert into t (n, v) values (6, 'prepared-abort'); prepare transaction 'p2'",
	"rollback prepared 'p2'",
	"vacuum full pg_class",
	"create table vt as select g from generate_series(1, 10000) g",
	"vacuum vt",
	"delete from vt where g > 5000",
	"vacuum vt",
	// BRIN: one heap page per row and one range per page, so that the
	// ranges outgrow the first revmap page (1360 entries); wide text
	// summaries that grow on update, so that some move to another page.
	"create table br (id int, t text) with (fillfactor = 10)",
	"insert into br select g, lpad(g::text, 400, 'a') from generate_series(1, 1400) g",
	"create index br_idx on br using brin (id, t) with (pages_per_range = 1, autosummarize = off)",
	"insert into br select g, lpad(g::text, 400, 'b') from generate_series(1401, 1500) g",
	"select brin_summarize_new_values('br_idx')",
	"update br set t = lpad(id::text, 600, 'z') where id % 50 = 0",
	"select brin_desummarize_range('br_idx', 3)",
	"select brin_summarize_range('br_idx', 3)",
	// Hash: enough tuples per bucket for overflow pages and splits, then
	// deletes and vacuum (squeeze, move of page contents, bucket cleanup)
	// and more inserts into the freed space.
	"create table hs (id int, k text)",
	"create index hs_idx on hs using hash (k) with (fillfactor = 50)",
	"insert into hs select g, md5((g % 3000)::text) from generate_series(1, 20000) g",
	"delete from hs where id % 3 <> 0",
	"vacuum hs",
	"insert into hs select g, md5((g % 50)::text) from generate_series(20001, 22000) g",
	"delete from hs where id > 21000",
	"vacuum hs",
	// One key: a long overflow chain; vacuum after deleting every other
	// tuple moves tuples up the chain (MOVE_PAGE_CONTENTS, SQUEEZE_PAGE).
	"insert into hs select g, 'same' from generate_series(30001, 36000) g",
	"delete from hs where k = 'same' and id % 2 = 0",
	"vacuum hs",
	// Index scans mark deleted tuples dead; inserts into their full
	// pages remove them (VACUUM_ONE_PAGE).
	"delete from hs where k = 'same' and id % 3 = 0",
	"set enable_seqscan = off; set enable_bitmapscan = off; select count(*) from hs where k = 'same'; select count(*) from hs where k = 'same'",
	"insert into hs select g, 'same' from generate_series(40001, 43000) g",
	// GiST: a box index grown through page splits (the root's too),
	// updates of downlinks, deletes with vacuum (empty leaf pages are
	// deleted from their parent), and an exclusion constraint.
	"create table gs (id int, b box)",
	"create index gs_idx on gs using gist (b)",
	"insert into gs select g, box(point(g % 300, g / 300), point(g % 300 + 1, g / 300 + 1)) from generate_series(1, 30000) g",
	"delete from gs where id % 4 <> 0",
	"delete from gs where id between 10000 and 25000",
	"vacuum gs",
	"insert into gs select g, box(point(g % 50, g % 70), point(g % 50 + 2, g % 70 + 2)) from generate_series(30001, 33000) g",
	// Index scans mark deleted tuples dead; inserts into their pages
	// remove them (DELETE).
	"delete from gs where id > 30000 and id % 2 = 0",
	"set enable_seqscan = off; set enable_bitmapscan = off; select count(*) from gs where b && box(point(0, 0), point(60, 80)); select count(*) from gs where b && box(point(0, 0), point(60, 80))",
	"insert into gs select g, box(point(g % 50, g % 70), point(g % 50 + 2, g % 70 + 2)) from generate_series(33001, 36000) g",
	"create table gx (r int4range, exclude using gist (r with &&))",
	"insert into gx select int4range(g * 10, g * 10 + 5) from generate_series(1, 2000) g",
}

// mustVerify lists the record types the workload must produce with
// consistency images, each redone and compared at least once. The files
// that add an index method's workload (workloadSQL) add its record types.
var mustVerify = []string{"Heap/INSERT", "Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/DELETE", "Heap2/MULTI_INSERT+INIT",
	"Heap2/PRUNE", "Heap2/VACUUM", "Heap2/FREEZE_PAGE", "Heap2/VISIBLE", "Btree/INSERT_LEAF", "Btree/SPLIT_L", "Btree/SPLIT_R",
	"Btree/VACUUM", "Sequence/LOG", "Heap/LOCK", "Btree/DEDUP", "Btree/INSERT_POST", "Btree/INSERT_UPPER", "Btree/NEWROOT",
	"Btree/MARK_PAGE_HALFDEAD", "Btree/UNLINK_PAGE", "Heap/INPLACE", "Heap/HEAP_CONFIRM", "Heap2/MULTI_INSERT",
	"BRIN/CREATE_INDEX", "BRIN/INSERT", "BRIN/INSERT+INIT", "BRIN/UPDATE", "BRIN/UPDATE+INIT", "BRIN/SAMEPAGE_UPDATE",
	"BRIN/REVMAP_EXTEND", "BRIN/DESUMMARIZE", "Hash/INIT_META_PAGE", "Hash/INIT_BITMAP_PAGE", "Hash/INSERT",
	"Hash/ADD_OVFL_PAGE", "Hash/SPLIT_ALLOCATE_PAGE", "Hash/SPLIT_COMPLETE", "Hash/MOVE_PAGE_CONTENTS",
	"Hash/SQUEEZE_PAGE", "Hash/DELETE", "Hash/SPLIT_CLEANUP", "Hash/UPDATE_META_PAGE", "Hash/VACUUM_ONE_PAGE",
	"Gist/PAGE_UPDATE", "Gist/PAGE_SPLIT", "Gist/PAGE_DELETE", "Gist/DELETE"}

type verifyStats struct {
	verified    map[string]int
	mismatches  map[string]int
	unsupported map[string]int
	noBase      int
	vmClears    int
	vmTruncates int
	relmaps     map[[2]uint32][]byte // newest relmap file by (db, spc)
	firstErrs   []string
	pages       map[pg.PageKey][]byte // the last version of every page followed
}

// verify redoes every block reference that carries a consistency-check
// image from the previous version of the page and compares, after masking.
func verify(t testing.TB, src wal.Source, start, end pg.LSN) *verifyStats {
	t.Helper()
	st := &verifyStats{verified: map[string]int{}, mismatches: map[string]int{}, unsupported: map[string]int{}, relmaps: map[[2]uint32][]byte{}}
	pages := map[pg.PageKey][]byte{}
	rd := wal.NewReader(src, start)
	want := make([]byte, pg.BlockSize)
	mw := make([]byte, pg.BlockSize)
	mg := make([]byte, pg.BlockSize)
	for {
		r, err := rd.Next()
		if err != nil {
			if errors.Is(err, wal.ErrEndOfWAL) {
				break
			}
			t.Fatalf("reading WAL: %v", err)
		}
		if r.EndLSN > end {
			break
		}
		name := RecordName(r)
		if tr, ok, err := SMGRTruncation(r); err != nil {
			t.Fatal(err)
		} else if ok {
			vmBlocks, partial := VMBlocksAfterTruncate(tr.Blocks)
			for key, p := range pages {
				if key.Spc != tr.Rel.Spc || key.DB != tr.Rel.DB || key.Rel != tr.Rel.Rel {
					continue
				}
				switch {
				case key.Fork == pg.MainFork && tr.Flags&TruncateHeap != 0 && key.Block >= tr.Blocks:
					delete(pages, key)
				case key.Fork == pg.VMFork && tr.Flags&TruncateVM != 0 && key.Block >= vmBlocks:
					delete(pages, key)
				case key.Fork == pg.VMFork && tr.Flags&TruncateVM != 0 && partial && key.Block == vmBlocks-1:
					VMTruncatePage(p, tr.Blocks)
					st.vmTruncates++
				}
			}
		}
		if u, ok, err := RelMap(r); err != nil {
			t.Fatal(err)
		} else if ok {
			st.relmaps[[2]uint32{u.DB, u.Spc}] = append([]byte(nil), u.File...)
		}
		for _, c := range VMClears(r) {
			if p, ok := pages[c.Page]; ok {
				ApplyVMClear(c, p)
				st.vmClears++
			}
		}
		for i := range r.Blocks {
			blk := &r.Blocks[i]
			key := blk.Page
			if blk.ApplyImage {
				p := make([]byte, pg.BlockSize)
				if err := RedoBlock(r, blk, p, Options{}); err != nil {
					t.Fatalf("restoring image: %v", err)
				}
				pages[key] = p
				continue
			}
			base, ok := pages[key]
			if !ok && !blk.WillInit() {
				if blk.HasImage {
					st.noBase++
					p := make([]byte, pg.BlockSize)
					if err := blk.RestoreImage(p); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					pages[key] = p
				} else {
					delete(pages, key)
				}
				continue
			}
			got := make([]byte, pg.BlockSize)
			if ok {
				copy(got, base)
			}
			err := RedoBlock(r, blk, got, Options{})
			if errors.Is(err, redo.ErrUnsupported) {
				st.unsupported[name]++
				got = nil
			} else if err != nil {
				st.mismatches[name]++
				if len(st.firstErrs) < 10 {
					st.firstErrs = append(st.firstErrs, err.Error())
				}
				got = nil
			}
			if !blk.HasImage {
				// Nothing to compare with (rmgr without consistency checks).
				if got != nil {
					pages[key] = got
				} else {
					delete(pages, key)
				}
				continue
			}
			if err := blk.RestoreImage(want); err != nil {
				t.Fatalf("%s at %s: %v", name, r.LSN, err)
			}
			if got != nil {
				copy(mw, want)
				copy(mg, got)
				if Mask(r.RmID, mw, key.Block) {
					Mask(r.RmID, mg, key.Block)
				}
				if r.RmID == wal.RmGist {
					// Postgres' redo of Gist/DELETE marks the page
					// F_TUPLES_DELETED (gistRedoDeleteRecord); the primary,
					// whose images these are, does not (gistprunepage), so
					// the flag differs on that page from then on. Redo here
					// does as Postgres' redo does; the flag only tells a
					// concurrent scan to recheck.
					gistIgnoreTuplesDeleted(mw)
					gistIgnoreTuplesDeleted(mg)
				}
				if string(mw) == string(mg) {
					st.verified[name]++
					// Continue from our own page, as recovery would: the image
					// can be older than the page in unmasked fields (a VM
					// page's LSN is set after its image is taken).
					pages[key] = got
					continue
				} else {
					st.mismatches[name]++
					if len(st.firstErrs) < 10 {
						st.firstErrs = append(st.firstErrs, fmt.Sprintf("%s at %s blk #%d %s: %s", name, r.LSN, blk.ID, key, firstDiff(mg, mw)))
					}
				}
			}
			// After a mismatch, continue from Postgres' page so one bug does
			// not cascade.
			p := make([]byte, pg.BlockSize)
			copy(p, want)
			pages[key] = p
		}
	}
	st.pages = pages
	return st
}

func firstDiff(got, want []byte) string {
	for i := range got {
		if got[i] != want[i] {
			j := i + 16
			if j > len(got) {
				j = len(got)
			}
			return fmt.Sprintf("first difference at byte %d: got % x want % x", i, got[i:j], want[i:j])
		}
	}
	return "equal"
}

func (st *verifyStats) report(t *testing.T) {
	keys := map[string]bool{}
	for k := range st.verified {
		keys[k] = true
	}
	for k := range st.mismatches {
		keys[k] = true
	}
	for k := range st.unsupported {
		keys[k] = true
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %10s %10s %12s\n", "record type", "verified", "mismatch", "unsupported")
	for _, n := range names {
		fmt.Fprintf(&b, "%-32s %10d %10d %12d\n", n, st.verified[n], st.mismatches[n], st.unsupported[n])
	}
	fmt.Fprintf(&b, "block refs without a base page (first sight): %d\n", st.noBase)
	t.Log("\n" + b.String())
	for _, e := range st.firstErrs {
		t.Log(e)
	}
}

func TestConsistencyAgainstPostgres(t *testing.T) {
	w := sharedWAL(t)
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	st := verify(t, src, w.Start, w.End)
	st.report(t)
	total := 0
	for n, c := range st.mismatches {
		t.Errorf("%d mismatches for %s", c, n)
	}
	// Every record type with consistency images in this workload must be
	// redone; an unsupported one is reported by name.
	for n, c := range st.unsupported {
		t.Errorf("unsupported: %s (%d block references)", n, c)
	}
	for _, c := range st.verified {
		total += c
	}
	for _, must := range mustVerify {
		if st.verified[must] == 0 {
			t.Errorf("no %s block reference verified", must)
		}
	}
	t.Logf("verified %d block references", total)

	// Visibility-map pages: Postgres' files after the final checkpoint must
	// equal the pages followed through VISIBLE images and implicit clears.
	vmChecked := 0
	for key, p := range st.pages {
		if key.Fork != pg.VMFork || key.Spc != pg.DefaultTablespaceOID {
			continue
		}
		b, err := os.ReadFile(filepath.Join(w.Dir, "vm", fmt.Sprint(key.DB), fmt.Sprintf("%d_vm", key.Rel)))
		if err != nil {
			continue // relation dropped or rewritten since
		}
		off := int(key.Block) * pg.BlockSize
		if off+pg.BlockSize > len(b) {
			continue
		}
		disk := b[off : off+pg.BlockSize]
		if string(disk) != string(p) {
			t.Errorf("VM page %s differs from Postgres' file: %s", key, firstDiff(p, disk))
		}
		vmChecked++
	}
	t.Logf("%d implicit VM clears and %d VM truncations applied; %d VM pages equal to Postgres' files", st.vmClears, st.vmTruncates, vmChecked)
	if vmChecked == 0 || st.vmClears == 0 || st.vmTruncates == 0 {
		t.Errorf("VM check did not run (%d pages, %d clears, %d truncations)", vmChecked, st.vmClears, st.vmTruncates)
	}

	// Relation maps: the newest RelMap UPDATE per database is the file.
	relmapChecked := 0
	for k, file := range st.relmaps {
		disk, err := os.ReadFile(filepath.Join(w.Dir, "relmap", fmt.Sprint(k[0])))
		if err != nil {
			continue // database dropped since
		}
		if string(disk) != string(file) {
			t.Errorf("pg_filenode.map of database %d differs from the last RelMap UPDATE", k[0])
		}
		relmapChecked++
	}
	t.Logf("%d relation map files equal to the last RelMap UPDATE", relmapChecked)
	if relmapChecked == 0 {
		t.Error("no relation map compared")
	}
}

func readSLRUFiles(datadir string) (map[SLRU]map[string][]byte, error) {
	out := map[SLRU]map[string][]byte{}
	for _, s := range []SLRU{SLRUXact, SLRUMultiXactOffsets, SLRUMultiXactMembers} {
		m, err := readDirFiles(filepath.Join(datadir, s.String()))
		if err != nil {
			return nil, err
		}
		out[s] = m
	}
	return out, nil
}

func readDirFiles(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = b
	}
	return out, nil
}

// TestFileOps checks the file-level operations decoded from the workload:
// every relation fork created is one Postgres' own pg_waldump names, and
// the CREATE/DROP DATABASE pair appears.
func TestFileOps(t *testing.T) {
	w := sharedWAL(t)
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rd := wal.NewReader(src, w.Start)
	kinds := map[string]int{}
	created := map[uint32]bool{}
	dropped := map[uint32]bool{}
	for {
		r, err := rd.Next()
		if err != nil || r.EndLSN > w.End {
			break
		}
		ops, err := FileOps(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			kinds[op.Kind]++
			switch op.Kind {
			case "create-fork":
				if op.Rel.Rel == 0 || op.Rel.Spc != pg.DefaultTablespaceOID || op.Rel.Fork > pg.InitFork {
					t.Errorf("odd fork created: %+v", op.Rel)
				}
				// The description must name the same file as pg_waldump would.
				if d := Describe(r); d != relPath(op.Rel.Spc, op.Rel.DB, op.Rel.Rel, uint32(op.Rel.Fork)) {
					t.Errorf("description %q for %+v", d, op.Rel)
				}
			case "create-database":
				created[op.DB] = true
			case "drop-database":
				dropped[op.DB] = true
			}
		}
	}
	if kinds["create-fork"] < 10 || len(created) != 1 || len(dropped) != 1 {
		t.Fatalf("file operations: %v, created %v, dropped %v", kinds, created, dropped)
	}
	for db := range created {
		if !dropped[db] {
			t.Errorf("database %d created but not dropped", db)
		}
	}
	t.Logf("file operations: %v", kinds)
}

// gistIgnoreTuplesDeleted clears a GiST page's F_TUPLES_DELETED flag.
func gistIgnoreTuplesDeleted(b []byte) {
	p := page(b)
	if p.hasSpecial(gistOpaqueSize) {
		p.gistSetFlags(p.gistFlags() &^ gistTuplesDel)
	}
}
