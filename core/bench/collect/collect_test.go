package collect

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stratadb/strata/internal/pgtest"
)

func TestParseMetrics(t *testing.T) {
	in := `# HELP x_total things
# TYPE x_total counter
x_total 3
y{a="1",b="two words"} 4.5 1700000000
z NaN
`
	m, err := ParseMetrics(bufio.NewScanner(strings.NewReader(in)))
	if err != nil {
		t.Fatal(err)
	}
	if m["x_total"] != 3 || m[`y{a="1",b="two words"}`] != 4.5 || len(m) != 3 {
		t.Fatalf("parsed %v", m)
	}
}

func TestParseWALDumpStats(t *testing.T) {
	out := `WAL statistics between 0/1000028 and 0/2000000:
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
Heap                                         100 ( 50.00)                 5000 ( 50.00)                 8000 ( 80.00)                13000 ( 65.00)
                                        --------                      --------                      --------                      --------
Total                                        200                         10000 [33.33%]                20000 [66.67%]                30000 [100%]
`
	w, err := ParseWALDumpStats(out)
	if err != nil {
		t.Fatal(err)
	}
	if w.Records != 200 || w.RecordBytes != 10000 || w.FPIBytes != 20000 || w.TotalBytes != 30000 {
		t.Fatalf("parsed %+v", w)
	}
	if s := w.FPIShare(); s < 0.666 || s > 0.667 {
		t.Fatalf("share %v", s)
	}
}

func TestCPUDelta(t *testing.T) {
	self := os.Getpid()
	a := cpuSnap{total: 1000, idle: 500, cores: 2, procs: map[int]procStat{
		100:  {ppid: 1, comm: "postgres", ticks: 10},
		101:  {ppid: 100, comm: "postgres", ticks: 0},
		200:  {ppid: 1, comm: "gcc", ticks: 0},
		self: {ppid: 1, comm: "strata", ticks: 0},
	}}
	b := cpuSnap{total: 2000, idle: 1200, cores: 2, procs: map[int]procStat{
		100:  {ppid: 1, comm: "postgres", ticks: 60},    // +50
		101:  {ppid: 100, comm: "postgres", ticks: 100}, // +100
		200:  {ppid: 1, comm: "gcc", ticks: 150},        // +150
		300:  {ppid: 1, comm: "new", ticks: 20},         // new process: +20
		self: {ppid: 1, comm: "strata", ticks: 30},      // +30
	}}
	c := cpuDelta(a, b, Who{PIDs: []int{100}})
	near := func(x, y float64) bool { return x > y-0.01 && x < y+0.01 }
	if !near(c.Busy, 30) || !near(c.Target, 15) || !near(c.Other, 17) || !near(c.Driver, 3) {
		t.Fatalf("cpu = %+v", c)
	}
	if len(c.TopOther) != 2 || c.TopOther[0].Comm != "gcc" {
		t.Fatalf("top = %+v", c.TopOther)
	}
	// A backend that used 40 ticks before the window and 25 in it, then
	// exited and was reaped: its 65 ticks moved into the postmaster's
	// children time; only the 25 of the window count (plus the
	// postmaster's own 5).
	a = cpuSnap{total: 1000, idle: 500, cores: 2, procs: map[int]procStat{
		100: {ppid: 1, comm: "postgres", ticks: 10},
		102: {ppid: 100, comm: "postgres", ticks: 40},
	}}
	b = cpuSnap{total: 2000, idle: 1200, cores: 2, procs: map[int]procStat{
		100: {ppid: 1, comm: "postgres", ticks: 10 + 5 + 65},
	}}
	if c := cpuDelta(a, b, Who{PIDs: []int{100}}); !near(c.Target, 3) {
		t.Fatalf("exited backend: cpu = %+v, want target 3%% (30 of 1000 ticks)", c)
	}
}

// TestCollect runs the collector around a small write load on a real
// Postgres and checks every part of what it reports.
func TestCollect(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	srv.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v text)")
	srv.Exec("postgres", "INSERT INTO t SELECT g, 'y' FROM generate_series(1, 900) g")
	srv.Exec("postgres", "CHECKPOINT")
	var scrapes atomic.Int64
	ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := scrapes.Add(1)
		fmt.Fprintf(w, "# TYPE strata_getpage_total counter\nstrata_getpage_total{tier=\"lfc\"} %d\n", n*100)
	}))
	defer ms.Close()
	var psScrapes atomic.Int64
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := psScrapes.Add(1)
		fmt.Fprintf(w, "process_cpu_seconds_total %d.5\n", n*3)
	}))
	defer ps.Close()
	ctx := context.Background()
	c, err := Start(ctx, Options{URL: srv.ConnString("postgres"), DB: "postgres",
		Target: Who{PIDs: []int{srv.PID()}}, MetricsURL: ms.URL, MetricsURLs: map[string]string{"pageserver": ps.URL},
		Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	// A backend alive when the collector stops, with some CPU in the
	// window: the workers' backends exit before it (so that their
	// statistics are flushed), and the CPU of a backend that exits moves
	// to the postmaster's children time, which counts as background (its
	// role is gone); on a fast machine the window then saw no backend.
	live, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close(ctx)
	if _, err := live.Exec(ctx, "SELECT count(*) FROM generate_series(1, 2000000)"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	const workers, rows = 3, 300
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			for i := 0; i < rows; i++ {
				if _, err := conn.Exec(ctx, "UPDATE t SET v = repeat('x', 200) WHERE id = $1", w*rows+i+1); err != nil {
					t.Error(err)
					return
				}
			}
			_, _ = conn.Exec(ctx, "SELECT pg_sleep(0.3)")
		}()
	}
	wg.Wait()
	time.Sleep(1100 * time.Millisecond) // let backends flush their statistics
	r, err := c.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("waits %v ticks %d stats wal=%v lsn=%v commits=%v ping n=%d p50=%dus cpu %+v metrics %v errs %v",
		r.Waits, r.WaitTicks, r.Stats["wal.wal_records"], r.Stats["wal.lsn_bytes"], r.Stats["db.xact_commit"],
		r.Ping.TotalCount(), r.Ping.ValueAtQuantile(50), r.CPU, r.Metrics, r.Errors)
	if r.WaitTicks < 20 || r.Waits["Timeout:PgSleep"] == 0 {
		t.Errorf("wait sampler: ticks %d waits %v", r.WaitTicks, r.Waits)
	}
	if r.Ping.TotalCount() < 5 {
		t.Errorf("ping probe: %d samples", r.Ping.TotalCount())
	}
	if got := r.Stats["db.xact_commit"]; got < workers*rows {
		t.Errorf("db.xact_commit delta %v < %d", got, workers*rows)
	}
	if r.Stats["wal.wal_records"] < workers*rows || r.Stats["wal.lsn_bytes"] < workers*rows*200 {
		t.Errorf("wal stats %v", r.Stats)
	}
	if r.Stats["wal.wal_fpi"] <= 0 {
		t.Errorf("no FPIs right after a checkpoint: %v", r.Stats["wal.wal_fpi"])
	}
	if r.Metrics[`strata_getpage_total{tier="lfc"}`] != 100 {
		t.Errorf("metrics delta %v", r.Metrics)
	}
	if r.Metrics["pageserver.process_cpu_seconds_total"] != 3 || r.Metrics["process_cpu_seconds_total"] != 0 {
		t.Errorf("prefixed metrics delta %v", r.Metrics)
	}
	if r.CPU.Cores < 1 || r.CPU.Busy <= 0 || r.CPU.Target <= 0 {
		t.Errorf("cpu %+v", r.CPU)
	}
	// The UPDATEs ran in client backends, which the process titles tell
	// from the postmaster and its helpers.
	if k := r.CPU.PGKinds; k[PGBackends] <= 0 || k[PGBackends]+k[PGWalsenders]+k[PGBackground] > r.CPU.Target+1e-9 {
		t.Errorf("postgres kinds %v, target %.2f%%", k, r.CPU.Target)
	}
	ws, err := WALDump(ctx, pgtest.BinDir, filepath.Join(srv.DataDir, "pg_wal"), r.StartLSN, r.EndLSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("waldump %+v share %.2f", ws, ws.FPIShare())
	if ws.TotalBytes <= 0 || ws.FPIBytes <= 0 || float64(ws.TotalBytes) > r.Stats["wal.lsn_bytes"]*1.01 {
		t.Errorf("waldump %+v vs lsn bytes %v", ws, r.Stats["wal.lsn_bytes"])
	}
}
