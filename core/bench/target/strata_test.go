package target

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/testbin"
)

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %s", url, err, resp.Status)
	}
	return string(b)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// TestStrataLifecycle starts a strata cluster from the repository's
// embedded default config with `strata up` in a temporary folder, applies a
// restart-only setting (which restarts it through down and up), checks that
// the data survives and that the processes are accounted for, and that
// Close stops every process and removes the folder.
func TestStrataLifecycle(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	profile := filepath.Join(testbin.Root(), "configs", "local.yaml")
	tg, err := NewStrata(Config{Name: "strata", Kind: "strata", Profile: profile, Strata: testbin.Strata(t),
		Settings: map[string]string{"shared_buffers": "32MB"}, Config: map[string]string{"compute.full_page_writes": "false"}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	st := tg.(*strataTarget)
	t.Cleanup(func() { tg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := tg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.root, "cluster", "cluster.json")); err != nil {
		t.Fatalf("the cluster did not keep its state in the target's folder: %v", err)
	}
	for _, q := range []string{"CREATE TABLE bench_probe(x int)", "INSERT INTO bench_probe VALUES (42)"} {
		c, err := pgx.Connect(ctx, tg.URL())
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, q)
		c.Close(ctx)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The target's config key reached the cluster.
	if got := query(t, tg.URL(), "SHOW full_page_writes"); got != "off" {
		t.Fatalf("full_page_writes = %s with config compute.full_page_writes false, want off", got)
	}
	// The pageserver's /metrics is found without metrics_url.
	eps := st.MetricsURLs()
	if eps["pageserver"] == "" || eps["compute"] == "" || eps["sk1"] == "" || eps["sk2"] == "" || eps["sk3"] == "" {
		t.Fatalf("metrics endpoints %v: want the pageserver's, the compute agent's and the three safekeepers'", eps)
	}
	if body := httpGet(t, eps["sk2"]); !strings.Contains(body, `strata_safekeeper_fsync_seconds_count{safekeeper="sk2"}`) {
		t.Errorf("safekeeper sk2's /metrics at %s lacks its flush histogram", eps["sk2"])
	}
	body := httpGet(t, eps["pageserver"])
	for _, want := range []string{"strata_pageserver_getpage_seconds_bucket", "strata_pageserver_redo_deltas_per_read_count", "process_cpu_seconds_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("pageserver /metrics at %s lacks %s", eps["pageserver"], want)
		}
	}
	restarted, err := tg.Apply(ctx, map[string]string{"shared_buffers": "48MB"})
	if err != nil {
		t.Fatal(err)
	}
	if !restarted {
		t.Fatal("shared_buffers changed without a restart")
	}
	if got := query(t, tg.URL(), "SHOW shared_buffers"); got != "48MB" {
		t.Fatalf("shared_buffers = %s after the restart, want 48MB", got)
	}
	if got := query(t, tg.URL(), "SELECT x::text FROM bench_probe"); got != "42" {
		t.Fatalf("row after restart = %q", got)
	}
	pids := tg.PIDs()
	if len(pids) < 2 {
		t.Fatalf("PIDs = %v: want the cluster's processes and the postmaster", pids)
	}
	// The CPU split's parts: three safekeepers, one pageserver, one agent
	// and the postmaster, which together are every PID.
	parts := tg.(ProcessParts).ProcessParts()
	checkPartNames(t, parts)
	want := map[string]int{"safekeepers": 3, "pageserver": 1, "agent": 1, "postgres": 1}
	n := 0
	for part, c := range want {
		if len(parts[part]) != c {
			t.Fatalf("parts %v: want %d %s", parts, c, part)
		}
		n += c
	}
	if len(parts) != len(want) || n != len(pids) {
		t.Fatalf("parts %v against PIDs %v", parts, pids)
	}
	if w := st.WALDir(); w == "" {
		t.Fatal("no WAL folder")
	} else if _, err := os.Stat(w); err != nil {
		t.Fatalf("WAL folder: %v", err)
	}
	root := st.root
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		deadline := time.Now().Add(30 * time.Second)
		for syscall.Kill(pid, 0) == nil {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs after Close", pid)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("folder %s still exists after Close: %v", root, err)
	}
}
