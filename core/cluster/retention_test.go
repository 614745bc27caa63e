package cluster

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/internal/doccheck"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// TestStorageRetention: storage.pitr, storage.gc_horizon and
// storage.image_layer_bytes reach the
// pageserver of `strata up`. With two seconds and 1 MiB of history, the GC
// cutoff (`strata status`) rises above zero once the first in-memory layer
// (64 MB of pages) is flushed, and stays at least gc_horizon below the last
// record. `strata status` shows each part's disk use and the room left.
// Last, a restore at the edge of that history holds GC back with a lease
// while it reads (restoreAtTheEdge).
func TestStorageRetention(t *testing.T) {
	t.Parallel()
	// With metrics on (the other cluster tests run without), so that the
	// compute agent's line of `strata status` and the disk-free gauges are
	// checked on a real cluster too.
	metrics := consecutiveFree(t, 5)
	// The lfc strategy, so that the LFC's metrics are checked too.
	c, cfg := newTestClusterEdited(t, func(y string) string {
		y = strings.Replace(y, "metrics_port: 0", "metrics_port: "+itoa(metrics), 1)
		y = strings.Replace(y, "compute:\n", "compute:\n  cache:\n    strategy: lfc\n", 1)
		return y + "storage:\n  pitr: 2s\n  gc_horizon: 1MiB\n  image_layer_bytes: 8MiB\n"
	})
	if cfg.Cluster.MetricsPort != metrics {
		t.Fatalf("metrics_port %d, want %d", cfg.Cluster.MetricsPort, metrics)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var said []string
	url, err := c.Up(ctx, func(s string) { said = append(said, s) })
	if err != nil {
		t.Fatal(err)
	}
	// With metrics on, up passes on the steps of the compute's start
	// (its /waits report; up asks four times a second, so it may miss a
	// short step, but not initdb).
	for _, want := range []string{"compute: initdb"} {
		if !slices.ContainsFunc(said, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("strata up did not say %q:\n%s", want, strings.Join(said, "\n"))
		}
	}
	// The compute line's durable LSN is the pageserver's at the time of
	// the status (the agent asks for it), not the last one the compute's
	// own page writes and fsyncs brought back: initdb's writes, sent
	// without a durability wait, became durable after the compute last
	// heard.
	if st, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	} else if st.Compute == nil || st.Compute.Durable < st.PageserverDurable {
		t.Fatalf("the compute line's durable LSN is behind the pageserver's %s, read before it: compute %+v", st.PageserverDurable, st.Compute)
	}
	// About 100 MB of table pages: more than one in-memory layer.
	exec1(t, ctx, url, "CREATE TABLE filler (id int, pad text)")
	for i := 0; i < 5; i++ {
		exec1(t, ctx, url, "INSERT INTO filler SELECT g, repeat('x', 900) FROM generate_series(1, 20000) g")
		exec1(t, ctx, url, "CHECKPOINT")
	}
	deadline := time.Now().Add(90 * time.Second)
	var st *Status
	for {
		var err error
		st, err = c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.PageserverGCCutoff > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gc cutoff still 0 after 90 s with pitr 2s (last record %s)", st.PageserverLast)
		}
		time.Sleep(time.Second)
	}
	t.Logf("gc cutoff %s, last record %s", st.PageserverGCCutoff, st.PageserverLast)
	if st.PageserverGCCutoff > st.PageserverLast-pg.LSN(1<<20) {
		t.Fatalf("gc cutoff %s is less than gc_horizon (1 MiB) below the last record %s", st.PageserverGCCutoff, st.PageserverLast)
	}
	// strata status also says what each part keeps on disk.
	use := map[string]int64{}
	for _, d := range st.Disk {
		use[d.Name] = d.Bytes
	}
	if use["pageserver"] < 32<<20 || use["safekeepers"] < 3*16<<20 || use["objects"] == 0 || len(st.Free) == 0 || st.Free[0].Free == 0 {
		t.Fatalf("disk use %v, free %+v: want the pageserver's layers (over 32 MiB), three safekeepers' segments, the objects and the room left", use, st.Free)
	}
	var out strings.Builder
	st.Print(&out)
	if !strings.Contains(out.String(), "disk      safekeepers ") || !strings.Contains(out.String(), "free      ") {
		t.Fatalf("strata status does not show disk use:\n%s", out.String())
	}
	t.Logf("status:\n%s", out.String())
	if r := st.Compute; r == nil || r.State != "running" || r.W == 0 || !strings.Contains(out.String(), "compute   running  term ") {
		t.Fatalf("strata status has no running compute agent line (report %+v):\n%s", r, out.String())
	}
	// storage.image_layer_bytes reached the pageserver: 100 MB of page
	// writes past 8 MiB made image layers (the 256 MiB default makes none
	// here).
	deadline = time.Now().Add(90 * time.Second)
	for {
		body := httpGet(t, ctx, "http://127.0.0.1:"+itoa(metrics+3)+"/metrics")
		if n := imageLayers(body); n > 0 {
			t.Logf("%d image layer files", n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no image layer after 100 MB of page writes with image_layer_bytes 8MiB:\n%s", grepLines(body, "strata_pageserver_layers"))
		}
		time.Sleep(time.Second)
	}
	for i, name := range map[int]string{0: "safekeeper", 3: "pageserver"} {
		body := httpGet(t, ctx, "http://127.0.0.1:"+itoa(metrics+i)+"/metrics")
		if !strings.Contains(body, "strata_"+name+"_disk_free_bytes ") {
			t.Fatalf("the %s's /metrics has no strata_%s_disk_free_bytes", name, name)
		}
	}
	// Every server answers /healthz: the safekeepers, the pageserver, and
	// the compute agent with its state while Postgres runs.
	for i, want := range map[int]string{0: "ok", 1: "ok", 2: "ok", 3: "ok", 4: "running"} {
		if body := strings.TrimSpace(httpGet(t, ctx, "http://127.0.0.1:"+itoa(metrics+i)+"/healthz")); body != want {
			t.Fatalf("/healthz on port %d: %q, want %q", metrics+i, body, want)
		}
	}
	if n := queryString(t, ctx, url, "SELECT count(*)::text FROM filler"); n != "100000" {
		t.Fatalf("filler has %s rows, want 100000", n)
	}
	// Every metric the servers export is in docs/metrics.md, with its type
	// and labels; the LFC's own counters are exported.
	docs, err := doccheck.Metrics("../..")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for i := 0; i < 5; i++ {
		fams, problems := doccheck.CheckExposition(httpGet(t, ctx, "http://127.0.0.1:"+itoa(metrics+i)+"/metrics"), docs)
		for _, p := range problems {
			t.Errorf("port %d: %s", metrics+i, p)
		}
		for _, f := range fams {
			exported[f] = true
		}
	}
	for _, f := range []string{"strata_safekeeper_fsync_seconds", "strata_pageserver_layers", "strata_compute_fuse_ops_total", "strata_lfc_hits_total", "strata_lfc_capacity_bytes", "strata_objectstore_operations_total"} {
		if !exported[f] {
			t.Errorf("no server exports %s", f)
		}
	}
	t.Logf("%d strata metric families exported, each documented", len(exported))

	restoreAtTheEdge(t, ctx, c, url, "http://127.0.0.1:"+itoa(metrics+3)+"/metrics")
}

// restoreAtTheEdge: a restore at the oldest moment the history reaches
// (the GC cutoff), while 80 MB more of writes make GC want to pass it,
// holds its place with a lease: while it reads, `strata status` shows the
// lease and a GC cutoff at or below it, though a newer layer was flushed
// more than pitr (2 s) ago, and the pageserver's /metrics (metricsURL)
// count the lease; the copy holds whole transactions (when x comes after
// filler was made) and passes pg_amcheck. Once the restore ends, GC
// passes the LSN again.
//
// GC goes on between the status that names the edge and the restore's
// lease (the cutoff jumps to gc_horizon below the last record once the
// last writes are pitr old): a restore refused as too old before it held
// anything reads the edge again, as `strata restore` does for its oldest
// moment.
func restoreAtTheEdge(t *testing.T, ctx context.Context, c *Cluster, url, metricsURL string) {
	root := pgtest.MkdirOwned(t, "strata-restore-lease-")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var x pg.LSN
	var held *Status
	var heldMetrics string
	hook := func(line string) {
		t.Logf("restore: %s", line)
		if held != nil || !strings.HasPrefix(line, "WAL from ") {
			return
		}
		// The lease is on x now; the pages are read after this line.
		before, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ {
			exec1(t, ctx, url, "INSERT INTO filler SELECT g, repeat('y', 900) FROM generate_series(1, 20000) g")
			exec1(t, ctx, url, "CHECKPOINT")
		}
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			now, err := c.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if now.PageserverRemote > before.PageserverRemote {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no layer flushed and uploaded past %s after 80 MB of writes", before.PageserverRemote)
			}
		}
		// pitr (2 s) and a few background rounds (a second each).
		time.Sleep(5 * time.Second)
		if held, err = c.Status(ctx); err != nil {
			t.Fatal(err)
		}
		heldMetrics = httpGet(t, ctx, metricsURL)
	}
	var r *Restored
	for try := 1; ; try++ {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		x = st.RestoreFrom
		if x == 0 || x < st.PageserverGCCutoff {
			t.Fatalf("status: restore from %s (%s) with the GC cutoff at %s", x, st.RestoreFromErr, st.PageserverGCCutoff)
		}
		r, err = c.Restore(ctx, restore.Target{LSN: x}, filepath.Join(root, "edge"+strconv.Itoa(try)), 0, hook)
		if err == nil {
			break
		}
		if !errors.Is(err, restore.ErrTooOld) || held != nil || try == 5 {
			t.Fatalf("restore at the edge of the history (%s, try %d): %v", x, try, err)
		}
		t.Logf("restore at the edge (%s, try %d): GC passed it first: %v", x, try, err)
	}
	if held == nil {
		t.Fatal("the restore never said where its WAL starts")
	}
	var out strings.Builder
	held.Print(&out)
	t.Logf("status while the restore read at %s:\n%s", x, out.String())
	if held.PageserverLease != x || held.PageserverGCCutoff > x || !strings.Contains(out.String(), "held at "+x.String()+" by a lease") {
		t.Errorf("while the restore read at %s: lease %s, GC cutoff %s (remote %s, last %s); want the lease at %s and the cutoff at or below it",
			x, held.PageserverLease, held.PageserverGCCutoff, held.PageserverRemote, held.PageserverLast, x)
	}
	tl := held.Timeline
	if got := metricValue(heldMetrics, `strata_pageserver_leases{timeline="`+tl+`"}`); got != 1 {
		t.Errorf("strata_pageserver_leases for %s while the restore read: %v, want 1:\n%s", tl, got, grepLines(heldMetrics, "strata_pageserver_leases"))
	}
	if got, want := metricValue(heldMetrics, `strata_pageserver_history_bytes{timeline="`+tl+`"}`), float64(held.PageserverLast-held.PageserverGCCutoff); got < want/2 || got > 2*want {
		t.Errorf("strata_pageserver_history_bytes while the restore read: %v, want about %v (last record %s - cutoff %s)", got, want, held.PageserverLast, held.PageserverGCCutoff)
	}
	_, stop := startRestored(t, ctx, r)
	// x may come before filler was made, or after some of its inserts.
	if queryString(t, ctx, r.URL, "SELECT (to_regclass('filler') IS NOT NULL)::text") == "true" {
		n, err := strconv.Atoi(queryString(t, ctx, r.URL, "SELECT count(*)::text FROM filler"))
		if err != nil || n%20000 != 0 || n > 100000 {
			t.Errorf("the copy at %s holds %d filler rows (%v), want whole transactions of 20000 from the first 100000", x, n, err)
		}
		t.Logf("the copy at %s holds %d filler rows", x, n)
	}
	pgtool(t, r.URL, "pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	stop()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.PageserverLease == 0 && st.PageserverGCCutoff > x {
			t.Logf("after the restore: GC cutoff %s, no lease", st.PageserverGCCutoff)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the restore: lease %s, GC cutoff %s, not past %s", st.PageserverLease, st.PageserverGCCutoff, x)
		}
	}
}

func httpGet(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}

// imageLayers sums the pageserver's strata_pageserver_layers{kind="image"}
// gauges in a /metrics body.
func imageLayers(body string) int {
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "strata_pageserver_layers{") || !strings.Contains(line, `kind="image"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// metricValue returns the value of the sample named (with its labels) in
// a /metrics body, or -1.
func metricValue(body, sample string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v
			}
		}
	}
	return -1
}
