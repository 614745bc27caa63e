package target

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stratadb/strata/core/bench/report"
	"github.com/stratadb/strata/internal/pgtest"
)

func query(t *testing.T, url, q string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var s string
	if err := c.QueryRow(ctx, q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}

func TestRegistryKinds(t *testing.T) {
	_, err := DefaultRegistry().New(Config{Name: "s", Kind: "strata"}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "needs profile") {
		t.Fatalf("strata without a profile: err = %v", err)
	}
	_, err = DefaultRegistry().New(Config{Name: "s", Kind: "strata", Profile: "/nonexistent.yaml"}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "profile") {
		t.Fatalf("strata with a missing profile: err = %v", err)
	}
	if _, err := DefaultRegistry().New(Config{Name: "x", Kind: "nope"}, zerolog.Nop()); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

func TestStockSyncLifecycle(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	tg, err := DefaultRegistry().New(Config{Name: "sync", Kind: "stock-sync",
		Settings: map[string]string{"max_wal_size": "2GB"}}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	if err := tg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pids := tg.PIDs()
	if len(pids) != 4 {
		t.Fatalf("pids = %v, want postmaster + 3 receivers", pids)
	}
	checkPartNames(t, tg.(ProcessParts).ProcessParts())
	if parts := tg.(ProcessParts).ProcessParts(); len(parts) != 2 || len(parts["postgres"]) != 1 || len(parts["receivers"]) != 3 || parts["postgres"][0] != pids[0] {
		t.Fatalf("parts = %v, want the postmaster %d as postgres and 3 receivers", parts, pids[0])
	}
	if got := query(t, tg.URL(), "SHOW synchronous_standby_names"); got != "ANY 2 (r1,r2,r3)" {
		t.Fatalf("synchronous_standby_names = %q", got)
	}
	if got := query(t, tg.URL(), "SELECT count(*)::text FROM pg_stat_replication WHERE sync_state = 'quorum'"); got != "3" {
		t.Fatalf("quorum receivers = %s", got)
	}
	// A commit needs the receivers: it works now.
	query(t, tg.URL(), "WITH x AS (SELECT 1) SELECT 'ok'")
	execSQL(t, tg.URL(), "CREATE TABLE t AS SELECT 1 AS x")
	if got := query(t, tg.URL(), "SHOW max_wal_size"); got != "2GB" {
		t.Fatalf("max_wal_size = %q", got)
	}

	// A reload setting does not restart; a postmaster setting does.
	restarted, err := tg.Apply(ctx, map[string]string{"full_page_writes": "off"})
	if err != nil || restarted {
		t.Fatalf("Apply fpw: restarted=%v err=%v", restarted, err)
	}
	if got := query(t, tg.URL(), "SHOW full_page_writes"); got != "off" {
		t.Fatalf("full_page_writes = %q", got)
	}
	restarted, err = tg.Apply(ctx, map[string]string{"full_page_writes": "off", "shared_buffers": "64MB"})
	if err != nil || !restarted {
		t.Fatalf("Apply shared_buffers: restarted=%v err=%v", restarted, err)
	}
	if got := query(t, tg.URL(), "SHOW shared_buffers"); got != "64MB" {
		t.Fatalf("shared_buffers = %q", got)
	}
	if got := query(t, tg.URL(), "SELECT count(*)::text FROM pg_stat_replication WHERE sync_state = 'quorum'"); got != "3" {
		t.Fatalf("quorum receivers after restart = %s", got)
	}
	// Settings absent from the next Apply are reset.
	if _, err := tg.Apply(ctx, map[string]string{"shared_buffers": "64MB"}); err != nil {
		t.Fatal(err)
	}
	if got := query(t, tg.URL(), "SHOW full_page_writes"); got != "on" {
		t.Fatalf("full_page_writes after reset = %q", got)
	}
	old := tg.PIDs()
	if err := tg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range old {
		if err := syscall.Kill(p, 0); err == nil {
			t.Errorf("process %d still alive after Stop", p)
		}
	}
	// Data survives Stop/Start.
	if err := tg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := query(t, tg.URL(), "SELECT x::text FROM t"); got != "1" {
		t.Fatalf("table lost across restart: %q", got)
	}
}

func execSQL(t *testing.T, url, q string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestURLProcessNames: a url target names its processes on this machine
// for the CPU split; a name that /proc/PID/comm cannot hold is refused.
func TestURLProcessNames(t *testing.T) {
	tg, err := NewURL(Config{Name: "s", Kind: "url", URL: "postgres://127.0.0.1:1/postgres", Processes: []string{"postgres", "strata"}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := tg.(ProcessNames); !ok || strings.Join(n.ProcessNames(), ",") != "postgres,strata" {
		t.Fatalf("process names of a url target: %v", tg)
	}
	for _, bad := range []string{"", "/usr/bin/strata", "a-name-longer-than-15"} {
		if _, err := NewURL(Config{Name: "s", Kind: "url", URL: "postgres://x/postgres", Processes: []string{bad}}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "processes") {
			t.Errorf("process name %q: %v, want an error naming processes", bad, err)
		}
	}
}

// checkPartNames fails when a target names a CPU part that the bench's
// reports do not know (report.CPUParts): its figures would be recorded
// but never shown.
func checkPartNames(t *testing.T, parts map[string][]int) {
	t.Helper()
	for p := range parts {
		if !slices.Contains(report.CPUParts, p) {
			t.Fatalf("part %q is not in report.CPUParts %v", p, report.CPUParts)
		}
	}
}
