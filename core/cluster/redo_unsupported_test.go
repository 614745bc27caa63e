package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/sdk/pg"
)

// TestRedoUnsupportedIndex: in redo mode the compute agent's event
// trigger refuses indexes whose WAL the Go redo engine does not replay
// (GIN, SP-GiST, ...), in the databases there at the start and in one
// created from template1 later, and lets btree, hash, GiST and BRIN
// indexes through. With the trigger disabled, GIN and SP-GiST indexes do
// not stop WAL ingest:
// the pageserver keeps their records, logs that it cannot rebuild their
// pages, and goes on ingesting everything else (before, the first image
// the pushdown policy wanted of such a page failed the ingest batch and
// the stream was retried forever: the pageserver stayed behind the
// safekeepers for good). After those indexes are dropped, a new compute
// with an empty local store reads the table, its hash, GiST and BRIN
// indexes back from the pageserver (rebuilt from WAL), and the disabled
// trigger stays disabled.
func TestRedoUnsupportedIndex(t *testing.T) {
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE g (id int, a int[], b box)")
	exec1(t, ctx, url, "CREATE INDEX g_btree ON g (id)")
	for _, ddl := range []string{
		"CREATE INDEX g_gin ON g USING gin (a)",
		"ALTER TABLE g ADD CONSTRAINT g_excl EXCLUDE USING spgist (b WITH &&)",
	} {
		if err := tryExec(ctx, url, ddl); err == nil || !strings.Contains(err.Error(), "strata redo mode cannot rebuild the pages of") {
			t.Fatalf("%s: %v, want the redo index guard's refusal", ddl, err)
		}
	}
	exec1(t, ctx, url, "CREATE DATABASE later")
	later := strings.Replace(url, "/postgres?", "/later?", 1)
	exec1(t, ctx, later, "CREATE TABLE h (id int, a int[])")
	if err := tryExec(ctx, later, "CREATE INDEX ON h USING gin (a)"); err == nil || !strings.Contains(err.Error(), "gin indexes") {
		t.Fatalf("GIN index in a database created after the start: %v, want the guard's refusal", err)
	}
	// Hash, GiST and BRIN are replayed: the guard lets them through, and their
	// pages come back from the pageserver after the restart below.
	exec1(t, ctx, url, "CREATE INDEX g_hash ON g USING hash (id)")
	exec1(t, ctx, url, "CREATE INDEX g_gist ON g USING gist (b)")
	exec1(t, ctx, url, "CREATE INDEX g_brin ON g USING brin (id) WITH (pages_per_range = 1)")
	// A guard function from an older strata (any other body) is brought
	// up to date at the next start.
	exec1(t, ctx, url, "CREATE OR REPLACE FUNCTION pg_catalog.strata_redo_index_guard() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN END$$")
	exec1(t, ctx, url, "ALTER EVENT TRIGGER strata_redo_index_guard DISABLE")
	exec1(t, ctx, url, "CREATE INDEX g_gin ON g USING gin (a)")
	exec1(t, ctx, url, "CREATE INDEX g_spgist ON g USING spgist (b)")
	exec1(t, ctx, url, "INSERT INTO g SELECT i, ARRAY[i % 10, i % 7], box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 20000) i")
	if got := queryString(t, ctx, url, "SELECT count(*)::text FROM g WHERE a @> ARRAY[3]"); got != "4571" {
		t.Fatalf("rows with 3: %s, want 4571 (2000 + 2857 - 286)", got)
	}
	end, err := pg.ParseLSN(queryString(t, ctx, url, "SELECT pg_current_wal_insert_lsn()::text"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.PageserverLast >= end {
			var out strings.Builder
			st.Print(&out)
			if !strings.Contains(out.String(), "  ingest_lag ") {
				t.Fatalf("strata status of a redo cluster shows no ingest_lag:\n%s", out.String())
			}
			t.Logf("the pageserver ingested past %s (last record %s)", end, st.PageserverLast)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pageserver's last record is %s, still below %s after a minute: WAL ingest stopped at the GIN or SP-GiST records", st.PageserverLast, end)
		}
		time.Sleep(500 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(c.dataDir, "pageserver", "pageserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "the redo engine cannot rebuild this page") {
		t.Fatal("the pageserver did not log the pages it cannot rebuild")
	}
	exec1(t, ctx, url, "DROP INDEX g_gin, g_spgist, g_btree") // g_btree too: the queries below must use g_hash, g_gist and g_brin
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if url, err = c.Up(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, url, "SELECT count(*) || ' ' || sum(id) FROM g"); got != "20000 200010000" {
		t.Fatalf("after down and up: %s, want 20000 rows summing to 200010000", got)
	}
	if got := queryString(t, ctx, url, "SELECT evtenabled::text FROM pg_event_trigger WHERE evtname = 'strata_redo_index_guard'"); got != "D" {
		t.Fatalf("the disabled guard is %q after a restart, want D (disabled)", got)
	}
	if got := queryString(t, ctx, url, "SELECT (prosrc LIKE '%''brin''%')::text FROM pg_proc WHERE proname = 'strata_redo_index_guard'"); got != "true" {
		t.Fatal("the older guard function was not brought up to date at the start")
	}
	// The BRIN index, read from the pageserver (the new compute's local
	// store is empty), rebuilt from WAL.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE id BETWEEN 5000 AND 5999", "g_brin", "1000")
	// The hash index likewise: every row found through it, one probe per
	// key (a nested loop over its index scans).
	for _, set := range []string{"SET enable_hashjoin = off", "SET enable_mergejoin = off", "SET enable_bitmapscan = off"} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM generate_series(1, 20000) s JOIN g ON g.id = s", "Index Scan using g_hash", "20000")
	// And the GiST index: boxes 99 to 200 overlap.
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE b && box(point(100, 100), point(200, 200))", "using g_gist on g", "102")
	pgtool(t, url, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
}

// throughIndex checks that the plan of query q names plan (an index
// scan) and that q returns want.
func throughIndex(t *testing.T, ctx context.Context, conn *pgx.Conn, q, plan, want string) {
	t.Helper()
	rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+q)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), plan) {
		t.Fatalf("the plan of %s does not name %q (%v):\n%s", q, plan, err, strings.Join(lines, "\n"))
	}
	var got string
	if err := conn.QueryRow(ctx, q).Scan(&got); err != nil || got != want {
		t.Fatalf("%s: %s (%v), want %s", q, got, err, want)
	}
}
