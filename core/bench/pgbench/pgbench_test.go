package pgbench

import (
	"context"
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
	// history table gained in all.
	h0, _ := strconv.ParseInt(before, 10, 64)
	h1, _ := strconv.ParseInt(after, 10, 64)
	if res.Transactions >= h1-h0 || res.Transactions < (h1-h0)/2 {
		t.Fatalf("window transactions %d vs total %d", res.Transactions, h1-h0)
	}
}
