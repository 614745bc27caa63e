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

// otherAM creates an index access method the guard does not know: GiST's
// code under another name (its WAL is GiST's, but the guard goes by name),
// with an operator class for boxes made of GiST's box functions.
const otherAM = `CREATE ACCESS METHOD strata_other TYPE INDEX HANDLER gisthandler;
CREATE OPERATOR CLASS strata_other_box DEFAULT FOR TYPE box USING strata_other AS
  OPERATOR 3 &&, OPERATOR 6 ~=,
  FUNCTION 1 gist_box_consistent(internal, box, smallint, oid, internal), FUNCTION 2 gist_box_union(internal, internal),
  FUNCTION 5 gist_box_penalty(internal, internal, internal), FUNCTION 6 gist_box_picksplit(internal, internal),
  FUNCTION 7 gist_box_same(box, box, internal)`

// TestRedoIndexMethods: in redo mode every index method of Postgres
// (btree, hash, GiST, SP-GiST, GIN, BRIN) and contrib's bloom (generic
// WAL) is replayed: after the cluster goes down and up, a new compute
// with an empty local store reads each index back from the pageserver,
// rebuilt from WAL, and finds every row through it, each once (rows
// inserted in scattered order, so that index pages split again and again:
// a GiST split NSN misread made an index scan return 29,933 rows of
// 20,000). The compute agent's
// event trigger refuses an index of a method it does not know (CREATE
// INDEX, ALTER TABLE ... EXCLUDE), in the databases there at the start, in
// one created from template1 later and (as soon as it accepts
// connections) in one created from template0; a guard function from an older
// strata is brought up to date at the next start, and a guard the
// operator disabled stays disabled.
func TestRedoIndexMethods(t *testing.T) {
	t.Parallel()
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE g (id int, a int[], b box, p point, t text, c box, k int)")
	exec1(t, ctx, url, otherAM)
	for _, ddl := range []string{
		"CREATE INDEX g_other ON g USING strata_other (c)",
		"ALTER TABLE g ADD CONSTRAINT g_excl EXCLUDE USING strata_other (c WITH &&)",
	} {
		if err := tryExec(ctx, url, ddl); err == nil || !strings.Contains(err.Error(), "strata redo mode cannot rebuild the pages of") {
			t.Fatalf("%s: %v, want the redo index guard's refusal", ddl, err)
		}
	}
	exec1(t, ctx, url, "CREATE DATABASE later")
	later := strings.Replace(url, "/postgres?", "/later?", 1)
	exec1(t, ctx, later, "CREATE TABLE h (id int, c box)")
	exec1(t, ctx, later, otherAM)
	if err := tryExec(ctx, later, "CREATE INDEX ON h USING strata_other (c)"); err == nil || !strings.Contains(err.Error(), "strata_other indexes") {
		t.Fatalf("an index of an unknown method in a database created after the start: %v, want the guard's refusal", err)
	}
	// A database created from template0 has no guard; the agent, told of
	// its folder by the mount, installs one as soon as it accepts
	// connections, well before its periodic look (every 10 s) would.
	exec1(t, ctx, url, "CREATE DATABASE bare TEMPLATE template0")
	created := time.Now()
	bare := strings.Replace(url, "/postgres?", "/bare?", 1)
	for deadline := created.Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if queryString(t, ctx, bare, "SELECT count(*)::text FROM pg_event_trigger WHERE evtname = 'strata_redo_index_guard'") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a database created from template0 has no redo index guard 30 s later")
		}
	}
	took := time.Since(created)
	t.Logf("the database from template0 had its guard %s after CREATE DATABASE returned", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("the guard came %s after CREATE DATABASE: the periodic look, not the mount's report of the new folder", took)
	}
	exec1(t, ctx, bare, "CREATE TABLE h (id int, c box)")
	exec1(t, ctx, bare, otherAM)
	if err := tryExec(ctx, bare, "CREATE INDEX ON h USING strata_other (c)"); err == nil || !strings.Contains(err.Error(), "strata_other indexes") {
		t.Fatalf("an index of an unknown method in a database created from template0: %v, want the guard's refusal", err)
	}
	exec1(t, ctx, url, "CREATE EXTENSION bloom")
	// pgvector's indexes (generic WAL), where pgvector is installed: it is
	// not a Debian bookworm package, so CI does not have it.
	_, err = os.Stat("/usr/share/postgresql/15/extension/vector.control")
	vector := err == nil
	if vector {
		exec1(t, ctx, url, `CREATE EXTENSION vector; CREATE TABLE gv (id int, v vector(3));
			CREATE INDEX gv_hnsw ON gv USING hnsw (v vector_l2_ops) WITH (m = 4, ef_construction = 16);
			INSERT INTO gv SELECT g, ('[' || g % 100 || ',' || g % 37 || ',' || g % 11 || ']')::vector FROM generate_series(1, 5000) g;
			CREATE TABLE gw AS SELECT * FROM gv;
			CREATE INDEX gw_ivf ON gw USING ivfflat (v vector_l2_ops) WITH (lists = 10);
			INSERT INTO gw SELECT g, ('[' || g % 90 || ',' || g % 31 || ',' || g % 13 || ']')::vector FROM generate_series(5001, 8000) g`)
	}
	for _, ddl := range []string{
		"CREATE INDEX g_hash ON g USING hash (id)",
		"CREATE INDEX g_gist ON g USING gist (b)",
		"CREATE INDEX g_spgist ON g USING spgist (p)",
		"ALTER TABLE g ADD CONSTRAINT g_spgist_excl EXCLUDE USING spgist (t WITH =)",
		"CREATE INDEX g_gin ON g USING gin (a)",
		"CREATE INDEX g_brin ON g USING brin (id) WITH (pages_per_range = 1)",
		"CREATE INDEX g_bloom ON g USING bloom (k)",
	} {
		exec1(t, ctx, url, ddl)
	}
	// A guard function from an older strata (any other body) is brought
	// up to date at the next start; a disabled guard stays disabled, and
	// the index it would have refused (btree's WAL) is replayed too.
	exec1(t, ctx, url, "CREATE OR REPLACE FUNCTION pg_catalog.strata_redo_index_guard() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN END$$")
	exec1(t, ctx, url, "ALTER EVENT TRIGGER strata_redo_index_guard DISABLE")
	exec1(t, ctx, url, "CREATE INDEX g_other ON g USING strata_other (c)")
	exec1(t, ctx, url, `INSERT INTO g SELECT i, ARRAY[i % 10, i % 7], box(point(i, i), point(i + 1, i + 1)),
		point(i % 200, i / 200), md5(i::text), box(point(i * 3, i * 3), point(i * 3 + 1, i * 3 + 1)), i % 1000 FROM generate_series(1, 20000) i
		ORDER BY i * 7919 % 20011`) // scattered, so that index pages split again and again
	exec1(t, ctx, url, "DELETE FROM g WHERE id % 10 = 0")
	exec1(t, ctx, url, "VACUUM g")
	exec1(t, ctx, url, `INSERT INTO g SELECT i, ARRAY[i % 10, i % 7], box(point(i, i), point(i + 1, i + 1)),
		point(i % 200, i / 200), md5(i::text), box(point(i * 3, i * 3), point(i * 3 + 1, i * 3 + 1)), i % 1000 FROM generate_series(1, 20000) i WHERE i % 10 = 0`)
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
			t.Fatalf("the pageserver's last record is %s, still below %s after a minute", st.PageserverLast, end)
		}
		time.Sleep(500 * time.Millisecond)
	}
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
	if got := queryString(t, ctx, url, "SELECT (prosrc LIKE '%''spgist''%')::text FROM pg_proc WHERE proname = 'strata_redo_index_guard'"); got != "true" {
		t.Fatal("the older guard function was not brought up to date at the start")
	}
	b, err := os.ReadFile(filepath.Join(c.dataDir, "pageserver", "pageserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "the redo engine cannot rebuild this page") {
		t.Fatal("the pageserver logged pages it cannot rebuild")
	}
	// Each index, read from the pageserver (the new compute's local store
	// is empty), finds its rows. Each is on a column of its own (hash and
	// BRIN share id, but hash cannot serve a range), so that only it can
	// serve its query.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE a @> ARRAY[3]", "g_gin", "4571") // 2000 + 2857 - 286
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE k = 777", "g_bloom", "20")
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE id BETWEEN 5000 AND 5999", "g_brin", "1000")
	for _, set := range []string{"SET enable_hashjoin = off", "SET enable_mergejoin = off", "SET enable_bitmapscan = off"} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	// The hash index: every row found through it, one probe per key (a
	// nested loop over its index scans).
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM generate_series(1, 20000) s JOIN g ON g.id = s", "Index Scan using g_hash", "20000")
	// GiST: boxes 99 to 200 overlap; SP-GiST: one point for each (x, y)
	// with x in 10..19 and y in 5..9; the index that strata_other's code
	// (GiST's) built: boxes 100 to 200.
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE b && box(point(100, 100), point(200, 200))", "using g_gist on g", "102")
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE b && box(point(0, 0), point(30000, 30000))", "using g_gist on g", "20000") // each once
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE c && box(point(0, 0), point(90000, 90000))", "using g_other on g", "20000")
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE p <@ box(point(10, 5), point(19, 9))", "using g_spgist on g", "50")
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE t = md5('4242')", "g_spgist_excl", "1")
	throughIndex(t, ctx, conn, "SELECT count(*)::text FROM g WHERE c && box(point(300, 300), point(600, 600))", "using g_other on g", "101")
	if vector {
		// Nearest neighbours through each (an approximate search: the
		// count and the plan, not the rows, are checked).
		throughIndex(t, ctx, conn, "SELECT count(*)::text FROM (SELECT id FROM gv ORDER BY v <-> '[1,1,1]' LIMIT 10) x", "gv_hnsw", "10")
		throughIndex(t, ctx, conn, "SELECT count(*)::text FROM (SELECT id FROM gw ORDER BY v <-> '[1,1,1]' LIMIT 10) x", "gw_ivf", "10")
		t.Log("pgvector's hnsw and ivfflat indexes read back from the pageserver")
	}
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
