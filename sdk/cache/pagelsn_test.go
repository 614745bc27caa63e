package cache_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

func TestPageLSNLayout(t *testing.T) {
	p := make([]byte, pg.BlockSize)
	copy(p, []byte{0x16, 0, 0, 0, 0x48, 0xD8, 0x74, 0xB3})
	if got := cache.PageLSN(p); got.String() != "16/B374D848" {
		t.Fatalf("PageLSN = %v", got)
	}
	if cache.PageLSN(p[:7]) != pg.InvalidLSN || cache.PageLSN(make([]byte, 8)) != pg.InvalidLSN {
		t.Fatal("short or zero page")
	}
}

// TestPageLSNPostgres reads a heap page that a real Postgres 15 wrote and
// compares PageLSN with pageinspect's page_header().lsn.
func TestPageLSNPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres")
	}
	s := pgtest.Start(t, pgtest.Options{})
	s.Exec("postgres", "CREATE EXTENSION pageinspect")
	s.Exec("postgres", "CREATE TABLE t AS SELECT g FROM generate_series(1, 100) g")
	s.Exec("postgres", "CHECKPOINT")
	want := s.QueryString("postgres", "SELECT lsn FROM page_header(get_raw_page('t', 0))")
	rel := s.QueryString("postgres", "SELECT pg_relation_filepath('t')")
	b, err := os.ReadFile(filepath.Join(s.DataDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	if got := cache.PageLSN(b[:pg.BlockSize]).String(); got != want {
		t.Fatalf("PageLSN = %s, pageinspect says %s", got, want)
	}
}
