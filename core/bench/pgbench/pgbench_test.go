package pgbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
)

func TestInitRun(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	opts := Options{BinDir: pgtest.BinDir, URL: srv.ConnString("postgres"), Scale: 1, Clients: 2,
		Rampup: time.Second, Duration: 3 * time.Second, Mode: "prepared", Builtin: "tpcb-like"}
	if err := Init(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if n := srv.QueryString("postgres", "SELECT count(*)::text FROM pgbench_accounts"); n != "100000" {
		t.Fatalf("accounts = %s", n)
	}
	before := srv.QueryString("postgres", "SELECT count(*)::text FROM pgbench_history")
	var ticks int
	var windowed bool
	opts.Tick = func(string) { ticks++ }
	opts.OnWindow = func() { windowed = true }
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	after := srv.QueryString("postgres", "SELECT count(*)::text FROM pgbench_history")
	t.Logf("tps %.0f n %d p95 %dus ticks %d history %s -> %s", res.TPS, res.Transactions, res.Latency.ValueAtQuantile(95), ticks, before, after)
	if res.Transactions <= 0 || res.TPS <= 0 || res.Latency.TotalCount() != res.Transactions {
		t.Fatalf("result %+v", res)
	}
	if !windowed || ticks < 2 {
		t.Fatalf("windowed %v ticks %d", windowed, ticks)
	}
	// The window is the last 3 of 4 seconds: fewer transactions than the
	// history table gained in all. How many fewer depends on the machine's
	// load; TestReadLogsWindow checks the window's arithmetic exactly.
	h0, _ := strconv.ParseInt(before, 10, 64)
	h1, _ := strconv.ParseInt(after, 10, 64)
	if res.Transactions >= h1-h0 {
		t.Fatalf("window transactions %d vs total %d", res.Transactions, h1-h0)
	}
}

// TestReadLogsWindow feeds readLogs pgbench logs written by hand: only
// transactions that ended inside the window count, a failed one counts as
// failed, and the series has one point per whole second of the window.
func TestReadLogsWindow(t *testing.T) {
	dir := t.TempDir()
	w0 := time.Unix(1_700_000_000, 0)
	res := &Result{WindowStart: w0, WindowEnd: w0.Add(3 * time.Second)}
	line := func(client int, lat string, at time.Time) string {
		us := at.UnixMicro()
		return fmt.Sprintf("%d 1 %s 0 %d %d\n", client, lat, us/1_000_000, us%1_000_000)
	}
	log0 := line(0, "900", w0.Add(-time.Millisecond)) + // ramp-up: left out
		line(0, "1000", w0) +
		line(0, "2000", w0.Add(500*time.Millisecond)) +
		line(0, "failed", w0.Add(1200*time.Millisecond)) +
		line(0, "3000", w0.Add(1500*time.Millisecond)) +
		"a short line\n"
	log1 := line(1, "4000", w0.Add(2500*time.Millisecond)) +
		line(1, "5000", w0.Add(3*time.Second)) +
		line(1, "6000", w0.Add(3*time.Second+time.Microsecond)) // after the end: left out
	for name, body := range map[string]string{"log.1": log0, "log.1.1": log1} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := readLogs(dir, res); err != nil {
		t.Fatal(err)
	}
	if res.Transactions != 5 || res.Failed != 1 {
		t.Fatalf("transactions %d failed %d, want 5 and 1", res.Transactions, res.Failed)
	}
	if got := res.Latency.Min(); got != 1000 {
		t.Fatalf("min latency %d, want 1000", got)
	}
	if got := res.Latency.Max(); got < 4990 || got > 5010 {
		t.Fatalf("max latency %d, want 5000", got)
	}
	if res.TPS != 5.0/3 {
		t.Fatalf("tps %v, want 5/3", res.TPS)
	}
	want := [][2]float64{{1, 2}, {2, 1}, {3, 1}}
	if !reflect.DeepEqual(res.TPSSeries, want) {
		t.Fatalf("series %v, want %v", res.TPSSeries, want)
	}
}
