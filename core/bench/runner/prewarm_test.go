package runner

import (
	"context"
	"strconv"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestPrewarmPastAHotTemplate reproduces the first run after a template's
// load: shared_buffers full of another database's pages with high usage
// counts. One pg_prewarm pass leaves part of the run database out; prewarm
// repeats until it is in.
func TestPrewarmPastAHotTemplate(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	// 2,048 buffers: the template's table takes about 1,750 of them, the
	// run database's about 900.
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"shared_buffers": "16MB", "autovacuum": "off"}})
	srv.Exec("postgres", "CREATE DATABASE tmpl")
	srv.Exec("postgres", "CREATE DATABASE run")
	srv.Exec("run", "CREATE TABLE cold AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 31000) g")
	srv.Exec("tmpl", "CREATE EXTENSION pg_prewarm")
	srv.Exec("tmpl", "CREATE TABLE hot AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 60000) g")
	for range 6 {
		srv.Exec("tmpl", "SELECT pg_prewarm('hot')") // usage counts up to the maximum
	}
	coldPages, _ := strconv.Atoi(srv.QueryString("run", "SELECT pg_relation_size('cold') / 8192"))
	if coldPages < 800 {
		t.Fatalf("cold has %d pages", coldPages)
	}

	// One pass, by hand: the premise.
	srv.Exec("run", "CREATE EXTENSION pg_prewarm")
	srv.Exec("run", "CREATE EXTENSION pg_buffercache")
	srv.Exec("run", "SELECT pg_prewarm('cold')")
	one, _ := strconv.Atoi(srv.QueryString("run", `SELECT count(*) FROM pg_buffercache
		WHERE relfilenode = pg_relation_filenode('cold') AND relforknumber = 0
		AND reldatabase = (SELECT oid FROM pg_database WHERE datname = 'run')`))
	t.Logf("one pass: %d of %d pages of cold in shared_buffers", one, coldPages)
	if one > coldPages*95/100 {
		t.Fatalf("the premise does not hold: one pass brought in %d of %d pages", one, coldPages)
	}

	pw, err := prewarm(context.Background(), srv.ConnString("postgres"), "run")
	if err != nil {
		t.Fatal(err)
	}
	// The blocks include the TOAST tables of the catalog (schema pg_toast).
	t.Logf("prewarm: %d blocks, %.1f%% resident after %d passes in %v", pw.blocks, pw.resident, pw.passes, pw.took)
	if pw.blocks < int64(coldPages) || pw.resident < 95 || pw.passes < 2 || pw.passes > prewarmPasses {
		t.Fatalf("prewarm %+v, cold has %d pages", pw, coldPages)
	}
}
