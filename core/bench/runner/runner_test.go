package runner

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/bench/matrix"
	"github.com/stratadb/strata/core/bench/results"
	"github.com/stratadb/strata/core/bench/target"
	"github.com/stratadb/strata/internal/pgtest"
)

func open(t *testing.T) *results.Store {
	s, err := results.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTPCCMatrix runs a tiny FPW on/off matrix on a managed stock server
// (settled and prewarmed) and checks what lands in the results database.
func TestTPCCMatrix(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	m, err := matrix.Parse([]byte(`
name: fpw-test
targets: [{name: stock, kind: stock, settings: {max_wal_size: 4GB, checkpoint_timeout: 30min}}]
settings: {full_page_writes: [on, off]}
virtual_users: 2
warehouses: 1
rampup: 2s
duration: 6s
checkpoint_before_window: true
settle: 60s
prewarm: true
`))
	if err != nil {
		t.Fatal(err)
	}
	store := open(t)
	runs, err := Execute(context.Background(), Options{Matrix: m, Store: store, Log: zerolog.New(zerolog.NewTestWriter(t)), GitRev: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs", len(runs))
	}
	byFPW := map[string]*results.Run{}
	for _, r := range runs {
		full, err := store.Get(context.Background(), r.ID)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s notes %v", full.Label, Headline(full), full.Notes)
		if full.Status != "ok" || full.NOPM <= 0 || full.P95 <= 0 || len(full.Latency) != 5 {
			t.Fatalf("run %+v", full)
		}
		if c, ok := full.Metrics["checkpoint_before_window_seconds"]; !ok || c <= 0 || c > 60 {
			t.Fatalf("checkpoint before the window: %v s (recorded %v)", c, ok)
		}
		// An idle stock server after its clone is quiet within seconds.
		if s, ok := full.Metrics["settle_seconds"]; !ok || s < 2 || s > 30 || contains(full.Notes, "not quiet") {
			t.Fatalf("settle: %v seconds, notes %v", s, full.Notes)
		}
		// One warehouse is about 100 MB: prewarm reads every block of it.
		if b := full.Metrics["prewarm_blocks"]; b < 5000 || full.Metrics["prewarm_seconds"] <= 0 {
			t.Fatalf("prewarm: %v blocks in %v s", b, full.Metrics["prewarm_seconds"])
		}
		// ... in passes, until it is in shared_buffers (128 MB here, the
		// template's pages there too).
		if p, r := full.Metrics["prewarm_passes"], full.Metrics["prewarm_resident_pct"]; p < 1 || p > prewarmPasses || r < 90 {
			t.Fatalf("prewarm: %v passes, %v%% resident", p, r)
		}
		if full.Metrics["consistency_violations"] != 0 || !contains(full.Notes, "consistency checks passed") {
			t.Fatalf("consistency: %v %v", full.Metrics["consistency_violations"], full.Notes)
		}
		if full.Metrics["wait_ticks"] < 50 || full.Waits["CPU"] == 0 {
			t.Fatalf("waits %v ticks %v", full.Waits, full.Metrics["wait_ticks"])
		}
		// Steal is recorded on every run (0 on bare metal), as a share.
		if st, ok := full.Metrics["cpu_steal_pct"]; !ok || st < 0 || st > 100 {
			t.Fatalf("cpu_steal_pct %v (recorded %v)", st, ok)
		}
		// The target's CPU by part: a stock server alone is Postgres only,
		// the whole of the target's share, and costs CPU per New-Order.
		pg, ok := full.Metrics["cpu_postgres_pct"]
		if !ok || pg <= 0 || math.Abs(pg-full.Metrics["cpu_target_pct"]) > 1e-6 {
			t.Fatalf("cpu_postgres_pct %v (recorded %v), target %v", pg, ok, full.Metrics["cpu_target_pct"])
		}
		if _, ok := full.Metrics["cpu_receivers_pct"]; ok {
			t.Fatal("a stock server without receivers recorded cpu_receivers_pct")
		}
		// core-ms per New-Order = share x cores x window / New-Orders; the
		// collector's window is the run's, within a second.
		perNO := full.Metrics["cpu_postgres_ms_per_new_order"]
		est := 1000 * pg / 100 * float64(runtime.NumCPU()) * full.WindowSec / full.Metrics["new_orders"]
		if perNO <= 0 || math.Abs(perNO-est) > 0.2*est || perNO != full.Metrics["cpu_target_ms_per_new_order"] {
			t.Fatalf("Postgres CPU per New-Order %v ms, target %v, estimate %v", perNO, full.Metrics["cpu_target_ms_per_new_order"], est)
		}
		if full.Metrics["ping_p50_ms"] <= 0 || full.Metrics["pg.db.xact_commit"] <= 0 || full.Metrics["cache_hit_ratio"] <= 0.5 {
			t.Fatalf("metrics %v", full.Metrics)
		}
		if len(full.TimeSeries["nopm"]) < 3 || full.Machine["server_version"] == "" || full.GitRev != "test" {
			t.Fatalf("series/machine %v %v", full.TimeSeries, full.Machine)
		}
		// TPM counts commits and rollbacks of the workload, not the
		// samplers' (which use their own database): HammerDB's mix gives
		// about 2.2 transactions per new order. Postgres 15's backends
		// report their counts to pg_stat_database at most once a second,
		// so each end of this 6 s window can miss up to a second of each
		// client's: a CI run measured 1.71. Counting only new orders
		// would give 1, the samplers' transactions above 3.5.
		if ratio := full.TPM / full.NOPM; ratio < 1.3 || ratio > 3.5 {
			t.Fatalf("TPM/NOPM = %.2f", ratio)
		}
		byFPW[full.Settings["full_page_writes"]] = full
	}
	on, off := byFPW["on"], byFPW["off"]
	if on.Metrics["fpi_bytes_share"] <= 0.1 || off.Metrics["fpi_bytes_share"] != 0 {
		t.Fatalf("FPI share on %v off %v", on.Metrics["fpi_bytes_share"], off.Metrics["fpi_bytes_share"])
	}
	if on.Metrics["wal_bytes_per_new_order"] <= off.Metrics["wal_bytes_per_new_order"] {
		t.Fatalf("WAL per new order: on %v <= off %v", on.Metrics["wal_bytes_per_new_order"], off.Metrics["wal_bytes_per_new_order"])
	}
}

// TestHeadline: a run's line names the hypervisor's steal when there was
// some, and says "noisy" when steal or other processes took more than the
// noise share, so that a slow run on a busy host explains itself.
func TestHeadline(t *testing.T) {
	r := &results.Run{Workload: "tpcc", NOPM: 15000, TPM: 34000, P95: 20.1, Status: "ok",
		Metrics: map[string]float64{"cpu_other_pct": 2, "cpu_steal_pct": 0.4}}
	if h := Headline(r); strings.Contains(h, "steal") || !strings.HasSuffix(h, "other-CPU 2% [ok]") {
		t.Fatalf("quiet host: %q", h)
	}
	r.Metrics["cpu_steal_pct"] = 8
	if h := Headline(r); !strings.HasSuffix(h, "other-CPU 2% steal 8% [ok]") {
		t.Fatalf("some steal, under the noise share: %q", h)
	}
	r.Metrics["cpu_steal_pct"] = 31
	if h := Headline(r); !strings.HasSuffix(h, "other-CPU 2% steal 31% [ok, noisy]") {
		t.Fatalf("busy host: %q", h)
	}
	r.Metrics["cpu_steal_pct"] = 0
	r.Metrics["cpu_other_pct"] = 25
	if h := Headline(r); !strings.HasSuffix(h, "other-CPU 25% [ok, noisy]") {
		t.Fatalf("other processes: %q", h)
	}
	// A target split by part shows where its CPU went.
	r.Metrics["cpu_postgres_pct"], r.Metrics["cpu_safekeepers_pct"], r.Metrics["cpu_agent_pct"] = 51.4, 24.6, 5
	if h := Headline(r); !strings.HasSuffix(h, "CPU postgres 51% safekeepers 25% agent 5% other-CPU 25% [ok, noisy]") {
		t.Fatalf("parts: %q", h)
	}
}

// TestPhase: the live line counts the window from its real start, after
// the checkpoint before it, which has a phase of its own.
func TestPhase(t *testing.T) {
	start := time.Unix(1000, 0)
	ramp, window := 10*time.Second, 60*time.Second
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	ns := func(s float64) int64 { return at(s).UnixNano() }
	for _, c := range []struct {
		now       float64
		ckpt, win int64
		want      string
	}{
		{4, 0, 0, "ramp-up  4/10s"},
		{12, 0, 0, "ramp-up 10/10s"}, // ramp-up over, the checkpoint not begun
		{17, ns(10), 0, "checkpoint  7s"},
		{26, ns(10), ns(25), "window   1/60s"},
		{85, ns(10), ns(25), "window  60/60s"},
		{90, ns(10), ns(25), "window  60/60s"},
		{40, 0, ns(10), "window  30/60s"}, // no checkpoint before the window
	} {
		if got := phase(at(c.now), start, c.ckpt, c.win, ramp, window); got != c.want {
			t.Errorf("at %.0f s: %q, want %q", c.now, got, c.want)
		}
	}
}

func contains(notes []string, s string) bool {
	for _, n := range notes {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// TestInterruptKeepsMeasurement cancels a pgbench run in its window: the
// run is saved as interrupted with its figures, and the managed server's
// processes are gone.
func TestInterruptKeepsMeasurement(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	m, err := matrix.Parse([]byte(`
name: int-test
workload: pgbench
targets: [{name: sync, kind: stock-sync}]
virtual_users: 2
warehouses: 1
rampup: 1s
duration: 60s
repeats: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	store := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	reg := newSpyRegistry()
	inWindow := make(chan struct{})
	var once sync.Once
	progress := writerFunc(func(p []byte) (int, error) {
		if strings.Contains(string(p), "window") {
			once.Do(func() { close(inWindow) })
		}
		return len(p), nil
	})
	go func() {
		// Cancel 4 s into the first window.
		<-inWindow
		time.Sleep(4 * time.Second)
		cancel()
	}()
	t0 := time.Now()
	runs, err := Execute(ctx, Options{Matrix: m, Store: store, Registry: reg.Registry, Progress: progress, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err == nil {
		t.Fatal("no error after cancel")
	}
	if time.Since(t0) > 50*time.Second {
		t.Fatalf("cancel took too long: %v", time.Since(t0))
	}
	if len(runs) != 1 || runs[0].Status != "interrupted" || runs[0].TPM <= 0 || runs[0].WindowSec < 3 || runs[0].WindowSec > 20 {
		for _, r := range runs {
			t.Logf("%+v", *r)
		}
		t.Fatalf("%d runs", len(runs))
	}
	if runs[0].Metrics["wal_bytes"] <= 0 || runs[0].Metrics["wait_ticks"] <= 0 {
		t.Fatalf("collector figures missing from the interrupted run: %v %v", runs[0].Metrics, runs[0].Notes)
	}
	list, _ := store.List(context.Background(), results.Filter{})
	if len(list) != 1 {
		t.Fatalf("stored %d runs", len(list))
	}
	for _, p := range reg.pids {
		if syscall.Kill(p, 0) == nil {
			t.Errorf("process %d alive after interrupt", p)
		}
	}
	if len(reg.pids) != 4 {
		t.Errorf("pids %v", reg.pids)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// eventTarget records Start, Stop and Close; its URL leads nowhere, so its
// runs fail at once (the runner goes on to the next run).
type eventTarget struct {
	name   string
	events *[]string
}

func (e *eventTarget) Name() string { return e.name }
func (e *eventTarget) Kind() string { return "events" }
func (e *eventTarget) Start(context.Context) error {
	*e.events = append(*e.events, "start "+e.name)
	return nil
}
func (e *eventTarget) Stop(context.Context) error {
	*e.events = append(*e.events, "stop "+e.name)
	return nil
}
func (e *eventTarget) URL() string { return "postgres://nobody@127.0.0.1:1/postgres?connect_timeout=1" }
func (e *eventTarget) Apply(context.Context, map[string]string) (bool, error) {
	return false, nil
}
func (e *eventTarget) PIDs() []int        { return nil }
func (e *eventTarget) MetricsURL() string { return "" }
func (e *eventTarget) Close() error {
	*e.events = append(*e.events, "close "+e.name)
	return nil
}

// TestTargetClosedAfterItsLastRun: a target's state is removed (Close)
// once no later run needs it, before the next target starts, and only
// once.
func TestTargetClosedAfterItsLastRun(t *testing.T) {
	m, err := matrix.Parse([]byte(`
name: retire-test
targets: [{name: a, kind: url, url: "postgres://x@127.0.0.1:1/postgres"}, {name: b, kind: url, url: "postgres://x@127.0.0.1:1/postgres"}]
virtual_users: [1, 2]
warehouses: 1
rampup: 1s
duration: 1s
`))
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	reg := target.Registry{"url": func(cfg target.Config, _ zerolog.Logger) (target.Target, error) {
		return &eventTarget{name: cfg.Name, events: &events}, nil
	}}
	if _, err := Execute(context.Background(), Options{Matrix: m, Store: open(t), Registry: reg, Log: zerolog.Nop(), GitRev: "test"}); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(events, ", ")
	closeA, startB := strings.Index(got, "close a"), strings.Index(got, "start b")
	if closeA < 0 || startB < 0 || closeA > startB || strings.Count(got, "close a") != 1 || strings.Count(got, "close b") != 1 {
		t.Fatalf("events %q: want a closed once, before b starts, and b closed once", got)
	}
}

// TestNewerSource: a binary built before a tracked Go file last changed is
// told apart from one built after; untracked files do not count.
func TestNewerSource(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	git := func(args ...string) {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	if err := os.MkdirAll(filepath.Join(dir, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, f := range []string{"go.mod", "pkg/a.go", "pkg/b.go", "pkg/b_test.go"} {
		p := filepath.Join(dir, f)
		if err := os.WriteFile(p, []byte("package pkg\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	git("add", ".")
	// An untracked file changed now does not make a binary stale.
	if err := os.WriteFile(filepath.Join(dir, "pkg", "scratch.go"), []byte("package pkg\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	built := time.Now().Add(-30 * time.Minute)
	if p, _, newer := NewerSource(filepath.Join(dir, "pkg"), built); newer {
		t.Fatalf("binary built after every tracked file reported stale (newest %s)", p)
	}
	// Nor does a test file edited after the build: no binary holds it.
	now := time.Now()
	if err := os.Chtimes(filepath.Join(dir, "pkg", "b_test.go"), now, now); err != nil {
		t.Fatal(err)
	}
	if p, _, newer := NewerSource(dir, built); newer {
		t.Fatalf("a test file edited after the build made the binary stale (newest %s)", p)
	}
	// A tracked file edited after the build does.
	if err := os.Chtimes(filepath.Join(dir, "pkg", "b.go"), now, now); err != nil {
		t.Fatal(err)
	}
	p, mod, newer := NewerSource(dir, built)
	if !newer || p != "pkg/b.go" || mod.Sub(now).Abs() > time.Second {
		t.Fatalf("NewerSource = %s %v %v, want pkg/b.go changed at %v", p, mod, newer, now)
	}
	// Outside a checkout: nothing to compare.
	if _, _, newer := NewerSource(t.TempDir(), built); newer {
		t.Fatal("stale outside a checkout")
	}
}
