package sharedbuffers

import (
	"strconv"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestPostgresAcceptsPlan starts a real Postgres 15 with a plan's settings
// (as the compute writes them into postgresql.conf) and checks that the
// server runs with exactly that many shared buffers and that huge_pages
// setting on this host.
func TestPostgresAcceptsPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres")
	}
	s, err := Plan(64<<20, StrategySharedBuffers, 0.75)
	if err != nil {
		t.Fatal(err)
	}
	pgs := pgtest.Start(t, pgtest.Options{Conf: s.Settings()})
	got := pgs.QueryString("postgres", "SELECT setting FROM pg_settings WHERE name = 'shared_buffers'")
	if got != strconv.FormatInt(s.SharedBuffers, 10) || got != "6144" {
		t.Fatalf("shared_buffers = %s pages, planned %d (48 MiB = 6144)", got, s.SharedBuffers)
	}
	if hp := pgs.QueryString("postgres", "SHOW huge_pages"); hp != s.HugePages {
		t.Fatalf("huge_pages = %s, planned %s", hp, s.HugePages)
	}
	if sz := pgs.QueryString("postgres", "SHOW shared_buffers"); sz != "48MB" {
		t.Fatalf("SHOW shared_buffers = %s", sz)
	}
}
